#pragma once
// A real redis-server for integration tests, on a free loopback port, in its own temporary
// directory. Starts in the constructor (waits until it accepts connections, at most 10 s) and is
// killed in the destructor. A missing or failing redis-server throws: a test FAILS, never skips.

#include "support/process.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace onceproxy::test {

struct redis_server_options {
    bool appendonly = false;             ///< --appendonly yes (data survives restart())
    std::string requirepass;             ///< --requirepass
    std::vector<std::string> extra_args; ///< appended to the command line (e.g. maxmemory-policy)
    /// TLS only (--port 0 --tls-port P): PEM files of the server and of the CA.
    struct tls_files {
        std::string cert_file;
        std::string key_file;
        std::string ca_file;
    };
    std::optional<tls_files> tls;
};

class redis_server {
public:
    explicit redis_server(redis_server_options options = {});
    ~redis_server();
    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;

    std::uint16_t port() const noexcept { return port_; }
    /// redis://127.0.0.1:P (rediss:// for TLS), without credentials.
    std::string url() const;

    /// SIGTERM (a clean shutdown, the AOF is written), wait; SIGKILL after 5 s.
    void stop();
    /// Starts again on the same port and directory; waits until it accepts connections.
    void start();
    /// SIGKILL (no shutdown, nothing written), wait.
    void kill();
    /// SIGSTOP: the server stays connected but does nothing (a replica stops acknowledging).
    void pause();
    /// SIGCONT after pause().
    void resume();
    void restart() {
        stop();
        start();
    }

    /// Runs redis-cli against the server with `args` (password and TLS flags added) and returns
    /// its stdout. Throws when redis-cli cannot run.
    std::string cli(const std::vector<std::string>& args) const;

    /// The `calls=` figure of `cmdstat_<command>` in INFO commandstats (0 if absent).
    long long command_calls(const std::string& command) const;

    const std::string& dir() const noexcept { return dir_.path(); }

private:
    redis_server_options options_;
    temp_dir dir_;
    std::uint16_t port_ = 0;
    process proc_;
};

} // namespace onceproxy::test
