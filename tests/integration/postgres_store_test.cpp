// postgres_store against a real PostgreSQL 15 server started by the fixture on a free loopback
// port: the store contract suite, then the schema check and migration, the degraded start, lost
// connections, the expiry sweep and the statement timeout. A missing server fails these tests,
// it never skips them.
#include "onceproxy/store/postgres_store.hpp"

#include "conformance/store_suite.hpp"
#include "onceproxy/store/error.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/run_awaitable.hpp"
#include "support/test_pki.hpp"
#include "support/wait.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;
namespace store = onceproxy::store;
using namespace std::chrono_literals;
using onceproxy::store::postgres_store;
using onceproxy::test::postgres_server;
using onceproxy::test::postgres_server_options;
using onceproxy::test::run;
using onceproxy::test::wait_until;

postgres_server& shared_server() {
    static postgres_server server;
    return server;
}

onceproxy::config::postgres_config make_config(const postgres_server& server,
                                               std::string table = "onceproxy_records") {
    onceproxy::config::postgres_config cfg;
    cfg.url = server.url();
    cfg.table = std::move(table);
    cfg.key_prefix = "test:";
    cfg.pool = 2;
    // Generous under sanitizers on a shared 2-core machine; the timeout cases set their own.
    cfg.connect_timeout = 5'000ms;
    cfg.statement_timeout = 5'000ms;
    return cfg;
}

std::string unique(const std::string& what) {
    static std::atomic<int> n{0};
    return what + "-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
}

/// A store on one io_context; open() opens it and, unless degraded, waits for its pool.
struct store_env {
    explicit store_env(onceproxy::config::postgres_config c) : cfg(std::move(c)) {
        store = std::make_unique<postgres_store>(
            cfg, std::vector<net::any_io_executor>{ioc.get_executor()});
    }
    ~store_env() {
        store->close();
        ioc.restart();
        ioc.run_for(200ms);
    }
    store::open_report open() { return go(store->async_open()); }
    void open_ready() {
        const auto r = open();
        REQUIRE_MESSAGE(!r.ec, r.message);
        REQUIRE_MESSAGE(!r.degraded, r.message);
        REQUIRE(wait_ready(10s));
    }
    /// Pings until the store answers, at most `limit` (running the keepers meanwhile).
    bool wait_ready(std::chrono::milliseconds limit) {
        return go(
            [](postgres_store& s, std::chrono::milliseconds bound) -> net::awaitable<bool> {
                net::steady_timer pause(co_await net::this_coro::executor);
                const auto until = std::chrono::steady_clock::now() + bound;
                while (std::chrono::steady_clock::now() < until) {
                    auto r = co_await s.async_ping();
                    if (r) {
                        co_return true;
                    }
                    pause.expires_after(50ms);
                    co_await pause.async_wait(net::use_awaitable);
                }
                co_return false;
            }(*store, limit),
            limit + 5s);
    }
    template <class T>
    T go(net::awaitable<T> op, std::chrono::milliseconds limit = 20s) {
        return run(ioc, std::move(op), limit);
    }
    store::claim_result claim(const std::string& key, const std::string& owner,
                              const std::string& fp = "fp", store::duration lease = 30'000ms) {
        auto r = go(store->async_claim({key, fp, owner, lease}));
        REQUIRE_MESSAGE(r.has_value(), "claim failed: " << r.error().message());
        return *r;
    }

    onceproxy::config::postgres_config cfg;
    net::io_context ioc;
    std::unique_ptr<postgres_store> store;
};

/// Conformance fixture: the shared server and table, a fresh store (and pool) per test case,
/// real time (`advance` sleeps; the server's clock decides expiry).
class postgres_fixture {
public:
    postgres_fixture() : env_(make_config(shared_server())) { env_.open_ready(); }
    store::store& store() { return *env_.store; }
    template <class T>
    T run(net::awaitable<T> op) {
        return env_.go(std::move(op), 15s);
    }
    void advance(std::chrono::milliseconds d) { onceproxy::conformance::let_real_time_pass(d); }
    std::string unique_key() { return unique("conformance"); }

private:
    store_env env_;
};

} // namespace

ONCEPROXY_STORE_SUITE(postgres_fixture);

TEST_SUITE("postgres_store") {
    TEST_CASE("migrate auto creates the table and records version 1; keys carry the prefix") {
        auto& server = shared_server();
        const auto table = "auto_" + std::to_string(::getpid());
        store_env env(make_config(server, table));
        env.open_ready();
        CHECK(server.psql("SELECT version FROM onceproxy_schema WHERE table_name = '" + table +
                          "'") == "1\n");
        CHECK(env.claim("k1", "owner-1").status == store::claim_status::acquired);
        CHECK(server.psql("SELECT key, completed FROM " + table) == "test:k1|f\n");
        // A second proxy starting on the migrated table changes nothing.
        store_env again(make_config(server, table));
        again.open_ready();
        CHECK(again.claim("k1", "owner-2").status == store::claim_status::in_flight);
    }

    TEST_CASE("migrate check refuses a missing schema, naming the table and the version") {
        auto& server = shared_server();
        const auto table = "checked_" + std::to_string(::getpid());
        auto cfg = make_config(server, table);
        cfg.migrate = onceproxy::config::postgres_migrate::check;
        {
            store_env env(cfg);
            const auto r = env.open();
            CHECK(r.ec);
            CHECK_FALSE(r.degraded);
            CHECK_MESSAGE(r.message.find("schema version 1 of " + table +
                                         " is missing (found 0)") != std::string::npos,
                          r.message);
        }
        {
            store_env migrator(make_config(server, table)); // migrate: auto, once
            migrator.open_ready();
        }
        store_env env(cfg);
        env.open_ready();
        CHECK(env.claim("k", "o").status == store::claim_status::acquired);
    }

    TEST_CASE("a schema-qualified table with odd characters is quoted safely") {
        auto& server = shared_server();
        server.psql("CREATE SCHEMA IF NOT EXISTS \"Billing\" AUTHORIZATION onceproxy");
        store_env env(make_config(server, "Billing.Idem\"Keys; DROP TABLE x"));
        env.open_ready();
        CHECK(env.claim("k", "o").status == store::claim_status::acquired);
        CHECK(server.psql("SELECT count(*) FROM \"Billing\".\"Idem\"\"Keys; DROP TABLE x\"") ==
              "1\n");
    }

    TEST_CASE("a wrong password refuses the start with the server's reason") {
        auto cfg = make_config(shared_server());
        cfg.password = "not-the-password";
        store_env env(cfg);
        const auto r = env.open();
        CHECK(r.ec);
        CHECK_FALSE(r.degraded);
        CHECK_MESSAGE(r.message.find("password authentication failed") != std::string::npos,
                      r.message);
    }

    TEST_CASE("the password field wins over the URL's; a rotated password is used on reconnect") {
        auto& server = shared_server();
        auto cfg = make_config(server);
        cfg.url = "postgresql://" + postgres_server::user() +
                  "@127.0.0.1:" + std::to_string(server.port()) + "/" + postgres_server::database();
        cfg.password = postgres_server::password();
        store_env env(cfg);
        env.open_ready();
        CHECK(env.claim(unique("pw"), "o").status == store::claim_status::acquired);
    }

    TEST_CASE("an unreachable server starts degraded, and the store serves once it answers") {
        postgres_server_options o;
        postgres_server server(o);
        server.stop();
        store_env env(make_config(server));
        env.cfg.connect_timeout = 1'000ms;
        const auto r = env.open();
        CHECK_FALSE(r.ec);
        CHECK(r.degraded);
        CHECK_MESSAGE(r.message.find("127.0.0.1") != std::string::npos, r.message);
        auto down = env.go(env.store->async_claim({"k", "fp", "o", 30'000ms}));
        REQUIRE_FALSE(down.has_value());
        CHECK(down.error() == store::errc::unavailable);
        server.start();
        REQUIRE(env.wait_ready(20s));
        CHECK(env.claim("k", "o").status == store::claim_status::acquired);
        CHECK(server.psql("SELECT count(*) FROM onceproxy_records") == "1\n");
    }

    TEST_CASE("a restarted server: operations fail as unavailable, then the pool reconnects") {
        postgres_server_options durable;
        durable.durable = true; // the row claimed before the crash survives it
        postgres_server server(durable);
        store_env env(make_config(server));
        env.open_ready();
        CHECK(env.claim("before", "o").status == store::claim_status::acquired);
        const auto connects = env.store->connects(env.ioc.get_executor());
        server.kill();
        auto r = env.go(env.store->async_claim({"during", "fp", "o", 30'000ms}));
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::unavailable);
        server.start();
        REQUIRE(env.wait_ready(20s));
        CHECK(env.store->connects(env.ioc.get_executor()) > connects);
        CHECK(env.claim("before", "o2").status == store::claim_status::in_flight);
        CHECK(env.claim("after", "o").status == store::claim_status::acquired);
    }

    TEST_CASE("the sweep deletes expired rows and leaves live ones") {
        postgres_server server;
        store_env env(make_config(server));
        env.open_ready();
        for (int i = 0; i < 30; ++i) {
            env.claim("short-" + std::to_string(i), "o", "fp", 50ms);
        }
        env.claim("live", "o");
        onceproxy::conformance::let_real_time_pass(300ms);
        auto swept = env.go(env.store->async_sweep());
        REQUIRE(swept.has_value());
        CHECK(*swept == 30);
        CHECK(server.psql("SELECT key FROM onceproxy_records") == "test:live\n");
    }

    TEST_CASE("a statement held longer than statement_timeout fails as timeout, not a hang") {
        auto& server = shared_server();
        auto cfg = make_config(server, "timeouts_" + std::to_string(::getpid()));
        cfg.statement_timeout = 300ms;
        store_env env(cfg);
        env.open_ready();
        env.claim("locked", "o", "fp", 50ms); // expires: the next claim takes it over (a write)
        // A session that holds the row's lock for 3 s.
        const std::string sql =
            "BEGIN; SELECT 1 FROM " + cfg.table +
            " WHERE key = 'test:locked' FOR UPDATE; SELECT pg_sleep(3); COMMIT;";
        onceproxy::test::process locker({"/bin/sh", "-c",
                                         "/usr/lib/postgresql/15/bin/psql -X -q -h '" +
                                             server.data_dir() + "' -p " +
                                             std::to_string(server.port()) + " -U postgres -d " +
                                             postgres_server::database() + " -c \"" + sql + "\""},
                                        server.dir() + "/locker.log");
        // The locker holds the row once its session sleeps inside the transaction.
        wait_until(
            [&] {
                return server.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                                   "'%pg_sleep(3)%' AND wait_event = 'PgSleep'") == "1\n";
            },
            10s, "the locking session sleeps with the row locked");
        const auto t0 = std::chrono::steady_clock::now();
        auto r = env.go(env.store->async_claim({"locked", "fp", "o2", 30'000ms}));
        const auto took = std::chrono::steady_clock::now() - t0;
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::timeout);
        CHECK(took < 2'500ms);
    }
}

TEST_SUITE("postgres_store retries") {
    TEST_CASE("a serialization failure is sent again; after four the error reaches the caller") {
        auto& server = shared_server();
        const auto table = "serial_" + std::to_string(::getpid());
        store_env env(make_config(server, table));
        env.open_ready();
        // A trigger that fails the claims of 'test:serial-*' keys with SQLSTATE 40001 while the
        // sequence (not rolled back with the statement) stays under its bound.
        server.psql("SET ROLE onceproxy; CREATE SEQUENCE " + table + "_fails; CREATE FUNCTION " +
                    table +
                    "_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.key LIKE "
                    "'test:serial-%' AND nextval('" +
                    table +
                    "_fails') <= 2 THEN RAISE EXCEPTION 'forced' USING ERRCODE = '40001'; "
                    "END IF; RETURN NEW; END $$; CREATE TRIGGER fail BEFORE INSERT ON " +
                    table + " FOR EACH ROW EXECUTE FUNCTION " + table + "_fail()");
        CHECK(env.claim("serial-1", "o").status == store::claim_status::acquired);
        CHECK(server.psql("SELECT last_value FROM " + table + "_fails") == "3\n");
        server.psql("SET ROLE onceproxy; ALTER SEQUENCE " + table +
                    "_fails RESTART WITH 1 MAXVALUE 1000000; " + "CREATE OR REPLACE FUNCTION " +
                    table +
                    "_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.key LIKE "
                    "'test:serial-%' THEN PERFORM nextval('" +
                    table +
                    "_fails'); RAISE EXCEPTION 'forced' USING ERRCODE = '40001'; "
                    "END IF; RETURN NEW; END $$");
        auto r = env.go(env.store->async_claim({"serial-2", "fp", "o", 30'000ms}));
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::protocol);
        CHECK(server.psql("SELECT last_value FROM " + table + "_fails") == "4\n");
    }
}

TEST_SUITE("postgres_store tls") {
    TEST_CASE("sslmode verify-full with the server's CA connects over TLS; another CA is refused") {
        onceproxy::test::temp_dir pki_dir;
        ::chmod(pki_dir.path().c_str(), 0711); // the server's user reads its files in here
        const onceproxy::test::test_pki pki(pki_dir.path());
        const auto leaf = pki.issue("server");
        // PostgreSQL takes a key owned by root only with mode 0640 at most, readable by its group.
        const passwd* pw = ::getpwnam("postgres");
        REQUIRE(pw != nullptr);
        REQUIRE(::chown(leaf.key_file.c_str(), 0, pw->pw_gid) == 0);
        REQUIRE(::chmod(leaf.key_file.c_str(), 0640) == 0);
        REQUIRE(::chmod(leaf.cert_file.c_str(), 0644) == 0);
        postgres_server_options o;
        o.settings = {"ssl=on", "ssl_cert_file=" + leaf.cert_file, "ssl_key_file=" + leaf.key_file};
        postgres_server server(o);

        auto cfg = make_config(server);
        cfg.sslmode = "verify-full";
        cfg.ssl_root_cert = pki.ca_file();
        {
            store_env env(cfg);
            env.open_ready();
            CHECK(env.claim("tls", "o").status == store::claim_status::acquired);
            // Every connection of the proxy's role is encrypted.
            CHECK(server.psql("SELECT count(*) > 0, bool_and(s.ssl) FROM pg_stat_ssl s JOIN "
                              "pg_stat_activity a USING (pid) WHERE a.usename = 'onceproxy'") ==
                  "t|t\n");
        }
        onceproxy::test::temp_dir other_dir;
        const onceproxy::test::test_pki other(other_dir.path(), "another-ca");
        cfg.ssl_root_cert = other.ca_file();
        store_env env(cfg);
        const auto r = env.open();
        CHECK(r.ec);
        CHECK_FALSE(r.degraded);
        CHECK_MESSAGE(r.message.find("certificate") != std::string::npos, r.message);
    }
}
