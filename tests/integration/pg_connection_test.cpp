// pg_connection (the PostgreSQL driver) against a real PostgreSQL 15 server started by the
// fixture on a free loopback port. A missing server fails these tests, it never skips them.
#include "onceproxy/pg/pg_connection.hpp"

#include "onceproxy/pg/error.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/run_awaitable.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace net = boost::asio;
namespace pg = onceproxy::pg;
using namespace std::chrono_literals;
using onceproxy::test::postgres_server;
using onceproxy::test::run;
using onceproxy::test::run_until;

/// One server for the cases that do not stop it (initdb takes a while).
postgres_server& shared_server() {
    static postgres_server server;
    return server;
}

pg::pg_connection_options options_for(const postgres_server& server) {
    pg::pg_connection_options o;
    o.conninfo = server.url();
    // Generous under sanitizers on a shared 2-core machine; the timeout cases set their own.
    o.connect_timeout = 5'000ms;
    o.command_timeout = 5'000ms;
    o.statements = {
        {"add", "SELECT $1::int + $2::int AS sum, $3::text IS NULL AS third_is_null"},
        {"echo", "SELECT $1::text"},
        {"echo_bytes", "SELECT $1::bytea"},
    };
    return o;
}

void connect(net::io_context& ioc, pg::pg_connection& conn) {
    const auto report = run(ioc, conn.async_connect());
    REQUIRE_MESSAGE(!report.ec, report.message);
    REQUIRE(conn.ready());
}

pg::pg_result exec(net::io_context& ioc, pg::pg_connection& conn, std::string statement,
                   std::vector<pg::pg_param> params = {}) {
    return run(ioc, conn.async_exec(std::move(statement), std::move(params)));
}

pg::pg_result query(net::io_context& ioc, pg::pg_connection& conn, std::string sql) {
    return run(ioc, conn.async_query(std::move(sql)));
}

/// Collects the results of statements spawned side by side, in the order they complete.
struct collected {
    std::vector<std::optional<pg::pg_result>> results;
    std::vector<std::size_t> order;
};

net::awaitable<void> exec_into(pg::pg_connection& conn, std::string statement,
                               std::vector<pg::pg_param> params, collected& out, std::size_t i) {
    out.results[i] = co_await conn.async_exec(std::move(statement), std::move(params));
    out.order.push_back(i);
}

net::awaitable<void> query_into(pg::pg_connection& conn, std::string sql, collected& out,
                                std::size_t i) {
    out.results[i] = co_await conn.async_query(std::move(sql));
    out.order.push_back(i);
}

/// An advisory lock of this test process, "(pid, k)", for pg_advisory_lock and its kin.
std::string lock_key(int k) {
    return "(" + std::to_string(::getpid()) + ", " + std::to_string(k) + ")";
}

/// How many backends wait for the advisory lock lock_key(k), as psql prints it ("2\n").
std::string waiting_for_lock(const postgres_server& server, int k) {
    return server.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                       "AND classid = " +
                       std::to_string(::getpid()) + " AND objid = " + std::to_string(k) +
                       " AND objsubid = 2");
}

} // namespace

TEST_SUITE("integration.pg_connection") {

    TEST_CASE("connects and runs a prepared statement with parameters, text and binary") {
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
        connect(ioc, conn);
        CHECK(conn.connect_count() == 1);
        CHECK(conn.sync_count() == 1); // the three statements prepared in one batch

        const auto sum =
            exec(ioc, conn, "add",
                 {pg::pg_param::text("2"), pg::pg_param::text("40"), pg::pg_param::null()});
        REQUIRE_MESSAGE(!sum.ec, sum.message);
        REQUIRE(sum.rows.size() == 1);
        CHECK(sum.columns == std::vector<std::string>{"sum", "third_is_null"});
        CHECK(sum.rows[0][0] == std::optional<std::string>("42"));
        CHECK(sum.rows[0][1] == std::optional<std::string>("t"));
        CHECK(sum.affected == 1);

        const std::string bytes("\x00\x01\xff"
                                "ab",
                                5);
        const auto echoed = run(ioc, conn.async_exec("echo_bytes", {pg::pg_param::binary(bytes)},
                                                     pg::pg_format::binary));
        REQUIRE_MESSAGE(!echoed.ec, echoed.message);
        CHECK(echoed.rows.at(0).at(0) == std::optional<std::string>(bytes));

        const auto null = exec(ioc, conn, "echo", {pg::pg_param::null()});
        REQUIRE(!null.ec);
        CHECK(!null.rows.at(0).at(0).has_value());
    }

    TEST_CASE("not connected, unreachable server, unknown statement") {
        net::io_context ioc;
        pg::pg_connection idle(ioc.get_executor(), options_for(shared_server()));
        const auto early = exec(ioc, idle, "echo", {pg::pg_param::text("x")});
        CHECK(early.ec == pg::errc::not_connected);
        CHECK(!early.sent);

        auto options = options_for(shared_server());
        options.conninfo =
            "postgresql://onceproxy@127.0.0.1:" + std::to_string(onceproxy::test::free_port()) +
            "/onceproxy";
        pg::pg_connection nowhere(ioc.get_executor(), options);
        const auto report = run(ioc, nowhere.async_connect());
        CHECK(report.ec == pg::errc::connect_failed);
        CHECK(!report.message.empty());
        CHECK(!nowhere.ready());

        options = options_for(shared_server());
        options.conninfo =
            "postgresql://onceproxy:wrong@127.0.0.1:" + std::to_string(shared_server().port()) +
            "/onceproxy";
        pg::pg_connection intruder(ioc.get_executor(), options);
        const auto denied = run(ioc, intruder.async_connect());
        CHECK(denied.ec == pg::errc::connect_failed);
        CHECK(denied.message.find("password authentication failed") != std::string::npos);

        options = options_for(shared_server());
        options.statements.push_back({"broken", "SELECT FROM nowhere_at_all"});
        pg::pg_connection broken(ioc.get_executor(), options);
        const auto refused = run(ioc, broken.async_connect());
        CHECK(refused.ec == pg::errc::connect_failed);
        CHECK(refused.message.find("broken") != std::string::npos);

        pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
        connect(ioc, conn);
        const auto unknown = exec(ioc, conn, "no_such_statement");
        CHECK(unknown.ec == pg::errc::server_error);
        CHECK(unknown.sqlstate == "26000"); // invalid_sql_statement_name
        CHECK(!exec(ioc, conn, "echo", {pg::pg_param::text("still fine")}).ec);
    }

    TEST_CASE("200 statements issued in one turn go out as one batch, answered in order") {
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
        connect(ioc, conn);
        const auto syncs_before = conn.sync_count();

        constexpr std::size_t n = 200;
        collected out;
        out.results.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            net::co_spawn(ioc,
                          exec_into(conn, "echo", {pg::pg_param::text(std::to_string(i))}, out, i),
                          net::detached);
        }
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == n; }, 15s));
        CHECK(conn.sync_count() == syncs_before + 1);
        for (std::size_t i = 0; i < n; ++i) {
            CHECK(out.order[i] == i);
            const auto& r = *out.results[i];
            REQUIRE_MESSAGE(!r.ec, r.message);
            CHECK(r.rows.at(0).at(0) == std::optional<std::string>(std::to_string(i)));
        }
    }

    TEST_CASE("statements issued while a batch is in flight wait for it and go out as one "
              "batch, in order") {
        auto& server = shared_server();
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(server));
        pg::pg_connection holder(ioc.get_executor(), options_for(server));
        connect(ioc, conn);
        connect(ioc, holder);
        // The first batch waits in the server for a lock `holder` holds, so it stays in flight
        // until the test lets it go, however slow the machine: 50 statements are issued
        // meanwhile, each in an event-loop turn of its own.
        REQUIRE(!query(ioc, holder, "SELECT pg_advisory_lock" + lock_key(3)).ec);
        const auto syncs_before = conn.sync_count();
        constexpr std::size_t n = 50;
        collected out;
        out.results.resize(n + 1);
        net::co_spawn(
            ioc, query_into(conn, "SELECT pg_advisory_xact_lock" + lock_key(3) + "::text", out, 0),
            net::detached);
        ioc.restart();
        ioc.poll(); // the first batch is sent
        CHECK(conn.sync_count() == syncs_before + 1);
        for (std::size_t i = 1; i <= n; ++i) {
            net::co_spawn(ioc,
                          exec_into(conn, "echo", {pg::pg_param::text(std::to_string(i))}, out, i),
                          net::detached);
            ioc.restart();
            ioc.poll();
        }
        CHECK(out.order.empty());
        CHECK(conn.sync_count() == syncs_before + 1); // all 50 wait for the first batch
        REQUIRE(!query(ioc, holder, "SELECT pg_advisory_unlock" + lock_key(3)).ec);
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == n + 1; }, 15s));
        // The first batch, then the 50 as one more.
        CHECK(conn.sync_count() == syncs_before + 2);
        for (std::size_t i = 0; i <= n; ++i) {
            CHECK(out.order[i] == i);
            const auto& r = *out.results[i];
            REQUIRE_MESSAGE(!r.ec, r.message);
            if (i > 0) {
                CHECK(r.rows.at(0).at(0) == std::optional<std::string>(std::to_string(i)));
            }
        }
    }

    TEST_CASE("a batch larger than the socket buffers: partial writes, every result in order") {
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
        connect(ioc, conn);
        const auto syncs_before = conn.sync_count();
        constexpr std::size_t n = 300;
        collected out;
        out.results.resize(n);
        auto value = [](std::size_t i) {
            return std::string(32 * 1024, static_cast<char>('a' + i % 26));
        };
        // The server sleeps first and reads nothing meanwhile: the socket's buffers fill, and
        // the rest of the batch waits for the socket to be writable.
        net::co_spawn(ioc, query_into(conn, "SELECT pg_sleep(0.3)::text", out, 0), net::detached);
        for (std::size_t i = 1; i < n; ++i) {
            net::co_spawn(ioc, exec_into(conn, "echo", {pg::pg_param::text(value(i))}, out, i),
                          net::detached);
        }
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == n; }, 30s));
        CHECK(conn.sync_count() == syncs_before + 1);
        for (std::size_t i = 0; i < n; ++i) {
            CHECK(out.order[i] == i);
            const auto& r = *out.results[i];
            REQUIRE_MESSAGE(!r.ec, r.message);
            if (i > 0) {
                CHECK(r.rows.at(0).at(0) == std::optional<std::string>(value(i)));
            }
        }
    }

    TEST_CASE("a server error keeps its SQLSTATE; the batch's other statements still commit") {
        auto& server = shared_server();
        server.psql("CREATE TABLE IF NOT EXISTS uniq (k text PRIMARY KEY)");
        server.psql("GRANT ALL ON uniq TO onceproxy");
        auto options = options_for(server);
        options.statements.push_back({"put", "INSERT INTO uniq (k) VALUES ($1)"});
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options);
        connect(ioc, conn);

        const std::string key = onceproxy::test::unique_key("pg", "uniq");
        const auto first = exec(ioc, conn, "put", {pg::pg_param::text(key)});
        REQUIRE_MESSAGE(!first.ec, first.message);
        CHECK(first.affected == 1);
        const auto again = exec(ioc, conn, "put", {pg::pg_param::text(key)});
        CHECK(again.ec == pg::errc::unique_violation);
        CHECK(again.sqlstate == "23505");
        CHECK(again.sent);
        CHECK(!again.message.empty());
        const auto next = exec(ioc, conn, "echo", {pg::pg_param::text("next")});
        REQUIRE_MESSAGE(!next.ec, next.message);
        CHECK(next.rows.at(0).at(0) == std::optional<std::string>("next"));

        // In one batch (one implicit transaction on the server): the duplicate in the middle
        // fails alone; the statement before it (rolled back) and after it (skipped) are sent
        // again and commit.
        const std::string before = key + "-before";
        const std::string after = key + "-after";
        const auto syncs_before = conn.sync_count();
        collected out;
        out.results.resize(3);
        net::co_spawn(ioc, exec_into(conn, "put", {pg::pg_param::text(before)}, out, 0),
                      net::detached);
        net::co_spawn(ioc, exec_into(conn, "put", {pg::pg_param::text(key)}, out, 1),
                      net::detached);
        net::co_spawn(ioc, exec_into(conn, "put", {pg::pg_param::text(after)}, out, 2),
                      net::detached);
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == 3; }, 15s));
        CHECK(!out.results[0]->ec);
        CHECK(out.results[1]->ec == pg::errc::unique_violation);
        CHECK(!out.results[2]->ec);
        CHECK(conn.sync_count() == syncs_before + 2); // the batch, then the two sent again
        CHECK(server.psql("SELECT count(*) FROM uniq WHERE k IN ('" + before + "', '" + after +
                          "')") == "2\n");
    }

    TEST_CASE("a deadlock (40P01) and a serialization failure (40001) are told apart") {
        auto& server = shared_server();
        net::io_context ioc;
        pg::pg_connection a(ioc.get_executor(), options_for(server));
        pg::pg_connection b(ioc.get_executor(), options_for(server));
        pg::pg_connection gate(ioc.get_executor(), options_for(server));
        connect(ioc, a);
        connect(ioc, b);
        connect(ioc, gate);

        // Each takes one advisory lock, passes the gate (a lock `gate` holds until both wait for
        // it, so both hold their first lock however slow the machine), then wants the other's:
        // one is the victim (after deadlock_timeout, 1 s), the other then goes on.
        REQUIRE(!query(ioc, gate, "SELECT pg_advisory_lock" + lock_key(4)).ec);
        collected deadlock;
        deadlock.results.resize(2);
        net::co_spawn(ioc,
                      query_into(a,
                                 "SELECT pg_advisory_xact_lock" + lock_key(1) +
                                     ", pg_advisory_xact_lock_shared" + lock_key(4) +
                                     ", pg_advisory_xact_lock" + lock_key(2),
                                 deadlock, 0),
                      net::detached);
        net::co_spawn(ioc,
                      query_into(b,
                                 "SELECT pg_advisory_xact_lock" + lock_key(2) +
                                     ", pg_advisory_xact_lock_shared" + lock_key(4) +
                                     ", pg_advisory_xact_lock" + lock_key(1),
                                 deadlock, 1),
                      net::detached);
        REQUIRE(run_until(
            ioc, [&] { return waiting_for_lock(server, 4) == "2\n"; }, 10s));
        REQUIRE(!query(ioc, gate, "SELECT pg_advisory_unlock" + lock_key(4)).ec);
        REQUIRE(run_until(
            ioc, [&] { return deadlock.order.size() == 2; }, 10s));
        const auto& victim = deadlock.results[0]->ec ? *deadlock.results[0] : *deadlock.results[1];
        const auto& survivor =
            deadlock.results[0]->ec ? *deadlock.results[1] : *deadlock.results[0];
        CHECK(victim.ec == pg::errc::deadlock_detected);
        CHECK(victim.sqlstate == "40P01");
        CHECK_MESSAGE(!survivor.ec, survivor.message);

        // b, in repeatable read, updates a row a holds locked and then commits changed: a
        // updates the row, then waits at the gate until b waits for a's transaction.
        server.psql("CREATE TABLE IF NOT EXISTS counters (k text PRIMARY KEY, v int NOT NULL)");
        server.psql("GRANT ALL ON counters TO onceproxy");
        const std::string key = onceproxy::test::unique_key("pg", "counter");
        server.psql("INSERT INTO counters VALUES ('" + key + "', 0)");
        REQUIRE(!query(ioc, b, "SET default_transaction_isolation = 'repeatable read'").ec);
        REQUIRE(!query(ioc, gate, "SELECT pg_advisory_lock" + lock_key(4)).ec);
        collected conflict;
        conflict.results.resize(2);
        net::co_spawn(ioc,
                      query_into(a,
                                 "WITH x AS (UPDATE counters SET v = v + 1 WHERE k = '" + key +
                                     "' RETURNING 1) SELECT pg_advisory_xact_lock_shared" +
                                     lock_key(4) + " FROM x",
                                 conflict, 0),
                      net::detached);
        REQUIRE(run_until(
            ioc, [&] { return waiting_for_lock(server, 4) == "1\n"; }, 10s));
        net::co_spawn(
            ioc,
            query_into(b, "UPDATE counters SET v = v + 1 WHERE k = '" + key + "'", conflict, 1),
            net::detached);
        REQUIRE(run_until(
            ioc,
            [&] {
                return server.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                   "'Lock' AND query LIKE 'UPDATE counters%" +
                                   key + "%'") == "1\n";
            },
            10s));
        REQUIRE(!query(ioc, gate, "SELECT pg_advisory_unlock" + lock_key(4)).ec);
        REQUIRE(run_until(
            ioc, [&] { return conflict.order.size() == 2; }, 10s));
        CHECK_MESSAGE(!conflict.results[0]->ec, conflict.results[0]->message);
        CHECK(conflict.results[1]->ec == pg::errc::serialization_failure);
        CHECK(conflict.results[1]->sqlstate == "40001");
        CHECK(server.psql("SELECT v FROM counters WHERE k = '" + key + "'") == "1\n");
    }

    TEST_CASE("statement_timeout cancels a statement with 57014; the connection stays usable") {
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
        connect(ioc, conn);
        REQUIRE(!query(ioc, conn, "SET statement_timeout = 50").ec);
        const auto slow = query(ioc, conn, "SELECT pg_sleep(5)");
        CHECK(slow.ec == pg::errc::query_canceled);
        CHECK(slow.sqlstate == "57014");
        CHECK(conn.ready());
        CHECK(!query(ioc, conn, "SELECT 1").ec);
    }

    TEST_CASE("a command timeout fails the statement and closes the connection") {
        auto options = options_for(shared_server());
        // It also bounds preparing the statements on a new backend and the echo below: short,
        // but not so short that a loaded machine misses it; far below the statement's 30 s.
        options.command_timeout = 1'000ms;
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options);
        connect(ioc, conn);
        collected out;
        out.results.resize(2);
        const auto start = std::chrono::steady_clock::now();
        net::co_spawn(ioc, query_into(conn, "SELECT pg_sleep(30)", out, 0), net::detached);
        net::co_spawn(ioc, query_into(conn, "SELECT 1", out, 1), net::detached);
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == 2; }, 20s));
        const auto elapsed = std::chrono::steady_clock::now() - start;
        CHECK(elapsed >= options.command_timeout); // ended by the timeout, not by the statement
        CHECK(elapsed < 15s);
        CHECK(out.results[0]->ec == pg::errc::timeout);
        // The second one's own deadline fires in the same instant, or the close fails it first.
        CHECK((out.results[1]->ec == pg::errc::connection_lost ||
               out.results[1]->ec == pg::errc::timeout));
        CHECK(!conn.ready());
        CHECK(exec(ioc, conn, "echo", {pg::pg_param::text("x")}).ec == pg::errc::not_connected);
        connect(ioc, conn);
        CHECK(!exec(ioc, conn, "echo", {pg::pg_param::text("x")}).ec);
        CHECK(conn.connect_count() == 2);
    }

    TEST_CASE("the server killed mid-flight fails every pending statement with connection_lost") {
        postgres_server server;
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(server));
        connect(ioc, conn);

        constexpr std::size_t n = 20;
        collected out;
        out.results.resize(n);
        net::co_spawn(ioc, query_into(conn, "SELECT pg_sleep(30)", out, 0), net::detached);
        for (std::size_t i = 1; i < n; ++i) {
            net::co_spawn(ioc,
                          exec_into(conn, "echo", {pg::pg_param::text(std::to_string(i))}, out, i),
                          net::detached);
        }
        REQUIRE(run_until(
            ioc,
            [&] {
                return server.psql("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                   "AND query LIKE 'SELECT pg_sleep%'") == "1\n";
            },
            10s));
        CHECK(out.order.empty());

        const auto killed = std::chrono::steady_clock::now();
        server.kill();
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == n; }, 3s));
        CHECK(std::chrono::steady_clock::now() - killed < 2s);
        for (const auto& r : out.results) {
            CHECK(r->ec == pg::errc::connection_lost);
            CHECK(r->sent);
        }
        CHECK(!conn.ready());
        CHECK(exec(ioc, conn, "echo", {pg::pg_param::text("x")}).ec == pg::errc::not_connected);

        // The same connection object connects again once the server is back.
        server.start();
        connect(ioc, conn);
        const auto back = exec(ioc, conn, "echo", {pg::pg_param::text("back")});
        REQUIRE_MESSAGE(!back.ec, back.message);
        CHECK(back.rows.at(0).at(0) == std::optional<std::string>("back"));
    }

    TEST_CASE("close() fails pending statements with connection_lost") {
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
        connect(ioc, conn);
        collected out;
        out.results.resize(1);
        net::co_spawn(ioc, query_into(conn, "SELECT pg_sleep(30)", out, 0), net::detached);
        ioc.restart();
        ioc.poll(); // the statement is sent
        conn.close();
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == 1; }, 3s));
        CHECK(out.results[0]->ec == pg::errc::connection_lost);
    }

    TEST_CASE("several hosts with target_session_attrs=read-write: the read-write one is chosen") {
        auto& primary = shared_server();
        onceproxy::test::postgres_server_options read_only;
        read_only.settings = {"default_transaction_read_only=on"};
        postgres_server standby(read_only);
        const std::string dead = std::to_string(onceproxy::test::free_port());
        auto options = options_for(primary);
        options.conninfo = "postgresql://onceproxy:onceproxy@127.0.0.1:" + dead +
                           ",127.0.0.1:" + std::to_string(standby.port()) +
                           ",127.0.0.1:" + std::to_string(primary.port()) +
                           "/onceproxy?target_session_attrs=read-write";
        net::io_context ioc;
        pg::pg_connection conn(ioc.get_executor(), options);
        connect(ioc, conn);
        const auto port = query(ioc, conn, "SELECT current_setting('port')");
        REQUIRE_MESSAGE(!port.ec, port.message);
        CHECK(port.rows.at(0).at(0) == std::optional<std::string>(std::to_string(primary.port())));

        options.conninfo =
            "postgresql://onceproxy:onceproxy@127.0.0.1:" + std::to_string(standby.port()) +
            "/onceproxy?target_session_attrs=read-write";
        pg::pg_connection refused(ioc.get_executor(), options);
        const auto report = run(ioc, refused.async_connect());
        CHECK(report.ec == pg::errc::connect_failed);
        CHECK(report.message.find("read-only") != std::string::npos);
    }

    TEST_CASE("a server that never answers: the attempt ends with timeout at connect_timeout") {
        net::io_context ioc;
        // Accepts TCP connections (the kernel's backlog) but never reads the startup packet.
        net::ip::tcp::acceptor mute(ioc, {net::ip::make_address("127.0.0.1"), 0});
        auto options = options_for(shared_server());
        options.conninfo =
            "postgresql://onceproxy@127.0.0.1:" + std::to_string(mute.local_endpoint().port()) +
            "/onceproxy";
        options.connect_timeout = 300ms;
        pg::pg_connection conn(ioc.get_executor(), options);
        const auto start = std::chrono::steady_clock::now();
        const auto report = run(ioc, conn.async_connect());
        CHECK(report.ec == pg::errc::timeout);
        CHECK(std::chrono::steady_clock::now() - start < 3s);
        CHECK(!conn.ready());
    }

    TEST_CASE("destroying the connection fails its pending statements with connection_lost") {
        net::io_context ioc;
        collected out;
        out.results.resize(1);
        {
            pg::pg_connection conn(ioc.get_executor(), options_for(shared_server()));
            connect(ioc, conn);
            net::co_spawn(ioc, query_into(conn, "SELECT pg_sleep(30)", out, 0), net::detached);
            ioc.restart();
            ioc.poll();
        }
        REQUIRE(run_until(
            ioc, [&] { return out.order.size() == 1; }, 3s));
        CHECK(out.results[0]->ec == pg::errc::connection_lost);
    }
}
