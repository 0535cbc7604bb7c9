#pragma once
// A real PostgreSQL server for integration tests: `initdb` into a fresh temporary directory and
// `postgres` started on a free loopback port, run as the `postgres` user when the tests run as
// root (PostgreSQL refuses to run as root). The constructor waits until it accepts connections
// (at most 30 s) and creates a login role and a database owned by it for the tests; the
// destructor kills the server and removes the directory. A missing or failing server throws: a
// test FAILS, never skips.

#include "support/process.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace onceproxy::test {

struct postgres_server_options {
    /// false (tests): fsync, synchronous_commit and full_page_writes off, fast and not crash
    /// safe. true: the server's defaults (durable), for tests that kill a server and count what
    /// survived.
    bool durable = false;
    std::vector<std::string> settings; ///< more "name=value" settings, each passed as -c
};

class postgres_server {
public:
    explicit postgres_server(postgres_server_options options = {});
    ~postgres_server();
    postgres_server(const postgres_server&) = delete;
    postgres_server& operator=(const postgres_server&) = delete;

    std::uint16_t port() const noexcept { return port_; }
    static std::string user() { return "onceproxy"; }     ///< the tests' login role
    static std::string password() { return "onceproxy"; } ///< its password (scram-sha-256)
    static std::string database() { return "onceproxy"; } ///< owned by user()
    /// postgresql://onceproxy:onceproxy@127.0.0.1:P/onceproxy (TCP, password authentication).
    std::string url() const;

    /// Fast shutdown (SIGINT: sessions are ended, a checkpoint written), wait; SIGKILL after 10 s.
    void stop();
    /// Starts again on the same port and data directory; waits until it accepts connections.
    void start();
    /// SIGKILL to the server and to its backends (a crash: nothing more is written), wait.
    void kill();
    void restart() {
        stop();
        start();
    }

    /// Runs `sql` with psql as the superuser (Unix socket, database `database()` unless
    /// `db` is given; writable even where default_transaction_read_only is on) and returns its
    /// unaligned output (-At). Throws when psql fails.
    std::string psql(const std::string& sql, const std::string& db = database()) const;

    const std::string& dir() const noexcept { return dir_.path(); }
    std::string data_dir() const { return dir_.file("data"); }

private:
    /// Starts the server and waits until it accepts connections; false when its port is taken.
    bool launch();

    postgres_server_options options_;
    temp_dir dir_;
    std::uint16_t port_ = 0;
    process proc_;
};

} // namespace onceproxy::test
