// redis_store and redis_client against a real redis-server started on a free loopback port.
// A missing redis-server fails these tests (the fixture throws), it never skips them.
#include "onceproxy/store/redis_store.hpp"

#include "conformance/store_suite.hpp"
#include "onceproxy/redis/error.hpp"
#include "onceproxy/redis/redis_client.hpp"
#include "onceproxy/store/error.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/run_awaitable.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using onceproxy::redis::redis_client;
using onceproxy::store::claim_status;
using onceproxy::store::fence_status;
using onceproxy::store::redis_store;
using onceproxy::test::redis_server;
using onceproxy::test::redis_server_options;
namespace store = onceproxy::store;
namespace redis = onceproxy::redis;

using onceproxy::test::run;

onceproxy::config::redis_config make_config(const std::string& url) {
    onceproxy::config::redis_config cfg;
    cfg.url = url;
    cfg.key_prefix = "test:";
    // Generous under sanitizers on a shared 2-core machine; the timeout tests set their own.
    cfg.connect_timeout = 2'000ms;
    cfg.command_timeout = 2'000ms;
    cfg.health_check_interval = 60'000ms;
    return cfg;
}

std::string unique(const std::string& what) {
    static std::atomic<int> n{0};
    return what + "-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
}

/// A started redis_store on one io_context, its connection ready.
struct store_env {
    explicit store_env(onceproxy::config::redis_config c) : cfg(std::move(c)) {
        store = std::make_unique<redis_store>(
            cfg, std::vector<net::any_io_executor>{ioc.get_executor()});
        store->start();
        REQUIRE_MESSAGE(run(ioc, client().async_wait_ready(5s)),
                        "no connection: " << client().last_failure().message);
    }
    ~store_env() {
        store->stop();
        ioc.restart();
        ioc.run_for(100ms);
    }
    redis_client& client() { return *store->client_for(ioc.get_executor()); }
    template <class T>
    T go(net::awaitable<T> op, std::chrono::milliseconds limit = 15s) {
        return run(ioc, std::move(op), limit);
    }
    store::claim_result claim(const std::string& key, const std::string& owner,
                              const std::string& fp = "fp", store::duration lease = 30'000ms) {
        auto r = go(store->async_claim({key, fp, owner, lease}));
        REQUIRE_MESSAGE(r.has_value(), "claim failed: " << r.error().message());
        return *r;
    }

    onceproxy::config::redis_config cfg;
    net::io_context ioc;
    std::unique_ptr<redis_store> store;
};

redis_server& shared_server() {
    static redis_server server;
    return server;
}

/// Conformance fixture: the shared server, a fresh store (and connection) per test case, real
/// time (`advance` sleeps; Redis PX expiry does the rest).
class redis_fixture {
public:
    redis_fixture() : env_(make_config(shared_server().url())) {}
    store::store& store() { return *env_.store; }
    template <class T>
    T run(net::awaitable<T> op) {
        return env_.go(std::move(op), 10s);
    }
    void advance(std::chrono::milliseconds d) { onceproxy::conformance::let_real_time_pass(d); }
    std::string unique_key() { return unique("conformance"); }

private:
    store_env env_;
};

struct echo_state {
    echo_state(const net::any_io_executor& ex, int count)
        : n(count), done(ex, net::steady_timer::time_point::max()) {}
    int n;
    int answered = 0;
    int correct = 0;
    int in_flight = 0;
    int max_in_flight = 0;
    net::steady_timer done;
};

net::awaitable<void> echo_one(redis_client& c, echo_state& st, int i) {
    // Binary payload with the index, so a reply matched to the wrong request cannot pass.
    std::string payload = "v" + std::to_string(i) + std::string(1, '\0') + "x";
    st.max_in_flight = std::max(st.max_in_flight, ++st.in_flight);
    auto r = co_await c.async_exec(redis::command("ECHO", payload));
    --st.in_flight;
    if (!r.ec && r.reply.type == redis::redis_reply::kind::string && r.reply.str == payload) {
        ++st.correct;
    }
    if (++st.answered == st.n) {
        st.done.cancel();
    }
}

} // namespace

ONCEPROXY_STORE_SUITE(redis_fixture);

TEST_CASE("redis client: 1000 pipelined commands on one connection are each answered in order") {
    net::io_context ioc;
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url(shared_server().url());
    o.command_timeout = 10s;
    redis_client client(ioc.get_executor(), o);
    client.start();
    REQUIRE(run(ioc, client.async_wait_ready(5s)));

    constexpr int n = 1000;
    echo_state st(ioc.get_executor(), n);
    auto all = [](redis_client& c, echo_state& state) -> net::awaitable<int> {
        auto ex = co_await net::this_coro::executor;
        for (int i = 0; i < state.n; ++i) {
            net::co_spawn(ex, echo_one(c, state, i), net::detached);
        }
        co_await state.done.async_wait(net::as_tuple(net::use_awaitable));
        co_return state.correct;
    };
    const auto writes_before = client.write_count();
    CHECK(run(ioc, all(client, st)) == n);
    CHECK(st.max_in_flight == n);
    // Commands issued in one event-loop turn leave together: a handful of writes, not 1000.
    CHECK(client.write_count() - writes_before <= 10);
    CHECK(client.connect_count() == 1);
}

TEST_CASE("redis client: a command not answered in time fails with timeout, then it reconnects") {
    net::io_context ioc;
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url(shared_server().url());
    o.command_timeout = 200ms;
    o.reconnect_min = 10ms;
    redis_client client(ioc.get_executor(), o);
    client.start();
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    auto r = run(ioc, client.async_exec({"BLPOP", unique("never"), "0"}));
    CHECK(r.ec == redis::errc::timeout);
    CHECK(r.written);
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    CHECK(client.connect_count() == 2);
    auto pong = run(ioc, client.async_exec({"PING"}));
    CHECK(!pong.ec);
    CHECK(pong.reply.str == "PONG");
}

namespace {

/// An io_context whose shutdown can run before it is destroyed, as the runtime's event loops do.
struct stoppable_loop : net::io_context {
    using net::io_context::shutdown;
};

/// Sets its flag when destroyed: whether a coroutine's frame is gone.
struct frame_guard {
    explicit frame_guard(std::shared_ptr<bool> f) : flag(std::move(f)) {}
    frame_guard(frame_guard&&) = default;
    frame_guard(const frame_guard&) = delete;
    frame_guard& operator=(const frame_guard&) = delete;
    frame_guard& operator=(frame_guard&&) = delete;
    ~frame_guard() {
        if (flag) {
            *flag = true;
        }
    }
    std::shared_ptr<bool> flag;
};

/// Waits for a reply that never comes (BLPOP on an empty list, no timeout).
net::awaitable<void> wait_forever(redis_client& c, frame_guard guard, std::string list,
                                  std::shared_ptr<bool> sent) {
    (void)guard;
    std::array<std::string_view, 3> blpop;
    blpop[0] = "BLPOP";
    blpop[1] = list;
    blpop[2] = "0";
    auto reply = c.async_exec(blpop); // queued now
    *sent = true;
    co_await std::move(reply);
}

} // namespace

TEST_CASE("redis client: a loop shut down while a command waits for its reply ends the waiting "
          "coroutine, though the client lives on") {
    // As the runtime stops its worker loops before it lets the store go: the frame waiting for
    // the reply (which may hold the last reference to the store) must go with the loop.
    auto ended = std::make_shared<bool>(false);
    stoppable_loop ioc;
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url(shared_server().url());
    o.command_timeout = 60s;
    auto client = std::make_unique<redis_client>(ioc.get_executor(), o);
    client->start();
    REQUIRE(run(ioc, client->async_wait_ready(5s)));
    auto waiting = std::make_shared<bool>(false);
    net::co_spawn(ioc, wait_forever(*client, frame_guard(ended), unique("never"), waiting),
                  net::detached);
    ioc.restart(); // run() stopped it
    ioc.run_for(200ms);
    REQUIRE(*waiting); // sent, and waiting for the reply
    CHECK_FALSE(*ended);
    ioc.shutdown();
    CHECK(*ended);
    client.reset(); // its connection closes on a loop that is shut down but still there
}

TEST_CASE("redis client: a lost stable connection is re-opened at once, and a command issued "
          "meanwhile waits for it instead of failing") {
    net::io_context ioc;
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url(shared_server().url());
    o.command_timeout = 5s;
    o.reconnect_min = 10s; // a backoff would outlast the command: only an at-once attempt helps
    o.reconnect_max = 10s;
    o.stable_connection = 1ms;
    redis_client client(ioc.get_executor(), o);
    client.start();
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    REQUIRE_FALSE(run(ioc, client.async_exec({"PING"})).ec);
    // Real time is the subject: the connection is up longer than stable_connection.
    std::this_thread::sleep_for(20ms);
    // As a +switch-master or a server closing the connection does.
    client.drop_connection();
    CHECK_FALSE(client.ready());
    auto pong = run(ioc, client.async_exec({"PING"}));
    CHECK_MESSAGE(!pong.ec, "error: " << pong.ec.message());
    CHECK(pong.reply.str == "PONG");
    CHECK(client.connect_count() == 2);
}

TEST_CASE("redis client: a connection lost soon after it opened backs off; a command meanwhile "
          "fails unsent") {
    net::io_context ioc;
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url(shared_server().url());
    o.command_timeout = 5s;
    o.reconnect_min = 10s;
    o.reconnect_max = 10s;
    o.stable_connection = 1h; // every connection counts as short-lived
    redis_client client(ioc.get_executor(), o);
    client.start();
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    client.drop_connection();
    auto r = run(ioc, client.async_exec({"PING"}));
    CHECK(r.ec == redis::errc::unavailable);
    CHECK_FALSE(r.written);
    CHECK(client.connect_count() == 1); // still in its backoff
}

namespace {

/// Where a test's address source sends the client; changed by the test between attempts.
struct moving_address {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0;
};

net::awaitable<redis::redis_address> address_of(std::shared_ptr<moving_address> a) {
    redis::redis_address out;
    out.host = a->host;
    out.port = a->port;
    co_return out;
}

} // namespace

TEST_CASE("redis client: a new master's address cuts a reconnect backoff short") {
    net::io_context ioc;
    auto where = std::make_shared<moving_address>();
    where->port = onceproxy::test::free_port(); // nobody listens: a master that died
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url(shared_server().url());
    o.address_source = [where] { return address_of(where); };
    o.connect_timeout = 1s;
    o.reconnect_min = 20s; // the backoff after the failed attempt outlasts every wait below
    o.reconnect_max = 20s;
    redis_client client(ioc.get_executor(), o);
    client.start();
    CHECK_FALSE(run(ioc, client.async_wait_ready(500ms)));
    REQUIRE(client.attempt_count() == 1);
    // As a +switch-master announcement does.
    where->port = shared_server().port();
    client.drop_connection_unless_at(where->host, where->port);
    CHECK_MESSAGE(run(ioc, client.async_wait_ready(5s)),
                  "attempts: " << client.attempt_count()
                               << ", last failure: " << client.last_failure().message);
    CHECK(client.attempt_count() == 2);
    auto pong = run(ioc, client.async_exec({"PING"}));
    CHECK(pong.reply.str == "PONG");
}

TEST_CASE("redis store: INFO commandstats shows one command per operation: a native SET per "
          "claim, one EVALSHA per completion") {
    redis_server server;
    store_env env(make_config(server.url()));
    server.cli({"CONFIG", "RESETSTAT"});
    constexpr int n = 10;
    for (int i = 0; i < n; ++i) {
        const std::string key = unique("stats");
        CHECK(env.claim(key, "o1").status == claim_status::acquired);
        auto done = env.go(env.store->async_complete(key, "o1", "payload", 60'000ms,
                                                     onceproxy::store::record_kind::kept, {}));
        REQUIRE(done.has_value());
        CHECK(*done == fence_status::ok);
        auto replay = env.claim(key, "o2");
        CHECK(replay.status == claim_status::completed);
        CHECK(replay.record == "payload");
    }
    // First execution = claim (SET NX GET) + complete (EVALSHA, which runs GET and SET inside
    // the server) = 2 commands; replay = 1 SET.
    CHECK(server.command_calls("evalsha") == n);
    CHECK(server.command_calls("get") == n);
    CHECK(server.command_calls("set") == 3 * n);
    const std::string stats = server.cli({"INFO", "commandstats"});
    std::istringstream lines(stats);
    std::string line;
    while (std::getline(lines, line)) {
        if (line.rfind("cmdstat_", 0) != 0) {
            continue;
        }
        // Redis also counts the commands our scripts run inside the server (not round trips).
        const std::string name = line.substr(8, line.find(':') - 8);
        const bool expected = name == "evalsha" || name == "info" || name == "config|resetstat" ||
                              name == "set" || name == "get";
        CHECK_MESSAGE(expected, "unexpected command: " << line);
    }
}

TEST_CASE("redis store: survives a restart (appendonly): in-flight commands fail, it reconnects "
          "by itself, scripts come back (also after SCRIPT FLUSH)") {
    redis_server_options so;
    so.appendonly = true;
    redis_server server(so);
    auto cfg = make_config(server.url());
    cfg.command_timeout = 5'000ms; // the blocked command must fail by the restart, not by timeout
    store_env env(cfg);
    const std::string key = unique("restart");
    REQUIRE(env.claim(key, "owner-1").status == claim_status::acquired);

    struct outcome {
        bool done = false;
        redis::redis_exec_result r;
    };
    // A command in flight when Redis goes away: BLPOP waits for a list nobody fills.
    auto blocked = std::make_shared<outcome>();
    net::co_spawn(
        env.ioc,
        [](redis_client& c, std::shared_ptr<outcome> out) -> net::awaitable<void> {
            const std::string list = unique("nothing");
            out->r = co_await c.async_exec(redis::command("BLPOP", list, "0"));
            out->done = true;
        }(env.client(), blocked),
        net::detached);
    REQUIRE(onceproxy::test::run_until(
        env.ioc,
        [&] {
            return server.cli({"INFO", "clients"}).find("blocked_clients:1") != std::string::npos;
        },
        5s));
    server.stop();
    onceproxy::test::run_until(
        env.ioc, [&] { return blocked->done; }, 1s);
    // While Redis is down, operations fail fast and cleanly.
    auto down = env.go(env.store->async_claim({unique("down"), "fp", "owner", 30'000ms}));
    CHECK(!down.has_value());
    if (!down.has_value()) {
        CHECK(down.error() == store::errc::unavailable);
    }
    // Reconnection attempts back off (50 ms doubling, jittered): a few per second, not a busy
    // loop against a dead server. Real time is the subject: the attempts of one second count.
    const auto attempts_before = env.client().attempt_count();
    env.ioc.restart();
    env.ioc.run_for(1s);
    const auto attempts = env.client().attempt_count() - attempts_before;
    CHECK(attempts >= 2);
    CHECK(attempts <= 10);
    server.start();
    CHECK(env.go(env.client().async_wait_ready(10s), 30s));
    REQUIRE(blocked->done);
    CHECK(blocked->r.ec == redis::errc::unavailable);
    CHECK(blocked->r.written);
    CHECK(env.client().connect_count() >= 2);

    // The lease survived the restart (AOF), and the scripts were loaded again on reconnect.
    const auto evals_before = server.command_calls("eval");
    auto again = env.claim(key, "owner-2");
    CHECK(again.status == claim_status::in_flight);
    CHECK(again.remaining_lease > 0ms);
    const std::string fresh = unique("flushed");
    CHECK(env.claim(fresh, "owner-3").status == claim_status::acquired);
    auto extended = env.go(env.store->async_extend(fresh, "owner-3", 30'000ms));
    REQUIRE(extended.has_value());
    CHECK(*extended == fence_status::ok);
    CHECK(server.command_calls("eval") == evals_before);

    // SCRIPT FLUSH behind our back: NOSCRIPT is answered by EVAL, and the completion still works.
    server.cli({"SCRIPT", "FLUSH"});
    auto done = env.go(env.store->async_complete(fresh, "owner-3", "p", 60'000ms,
                                                 onceproxy::store::record_kind::kept, {}));
    REQUIRE(done.has_value());
    CHECK(*done == fence_status::ok);
    CHECK(server.command_calls("eval") == evals_before + 1);
}

TEST_CASE("redis store: AUTH with a password (percent-decoded) and with an ACL user") {
    redis_server_options so;
    so.requirepass = "s3cret p@ss:/";
    redis_server server(so);
    const std::string hostport = "127.0.0.1:" + std::to_string(server.port());

    SUBCASE("password only") {
        store_env env(make_config("redis://:s3cret%20p%40ss%3A%2F@" + hostport));
        auto report = env.go(env.store->async_check_startup());
        CHECK_MESSAGE(!report.ec, report.message);
        CHECK(env.claim(unique("auth"), "o").status == claim_status::acquired);
    }
    SUBCASE("ACL user") {
        server.cli({"ACL", "SETUSER", "app", "on", ">app-pass", "~*", "+@all"});
        store_env env(make_config("redis://app:app-pass@" + hostport));
        auto who = env.go(env.client().async_exec({"ACL", "WHOAMI"}));
        CHECK(who.reply.str == "app");
        CHECK(env.claim(unique("acl"), "o").status == claim_status::acquired);
    }
    SUBCASE("wrong password: a clear error, quickly") {
        net::io_context ioc;
        redis_store s(make_config("redis://:wrong@" + hostport), {ioc.get_executor()});
        const auto t0 = std::chrono::steady_clock::now();
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK(std::chrono::steady_clock::now() - t0 < 2s);
        CHECK(report.ec == store::errc::auth_failed);
        CHECK_MESSAGE(report.message.find("WRONGPASS") != std::string::npos, report.message);
        CHECK_MESSAGE(report.message.find(hostport) != std::string::npos, report.message);
    }
    SUBCASE("no password where one is required") {
        net::io_context ioc;
        redis_store s(make_config("redis://" + hostport), {ioc.get_executor()});
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK(report.ec == store::errc::auth_failed);
        CHECK_MESSAGE(report.message.find("NOAUTH") != std::string::npos, report.message);
    }
}

TEST_CASE("redis store: the database index of the URL is SELECTed") {
    store_env env(make_config(shared_server().url() + "/3"));
    const std::string key = unique("db");
    CHECK(env.claim(key, "o").status == claim_status::acquired);
    CHECK(shared_server().cli({"-n", "3", "EXISTS", env.store->redis_key(key)}) == "1\n");
    CHECK(shared_server().cli({"-n", "0", "EXISTS", env.store->redis_key(key)}) == "0\n");
}

TEST_CASE("redis store: an unreachable or silent Redis gives a clear error within "
          "connect_timeout") {
    SUBCASE("nothing listens") {
        net::io_context ioc;
        const auto port = onceproxy::test::free_port();
        redis_store s(make_config("redis://127.0.0.1:" + std::to_string(port)),
                      {ioc.get_executor()});
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK(report.ec == store::errc::unavailable);
        CHECK_MESSAGE(report.message.find(std::to_string(port)) != std::string::npos,
                      report.message);
    }
    SUBCASE("accepts but never answers") {
        net::io_context ioc;
        // A listening socket nobody reads: the TCP connect succeeds (backlog), AUTH hangs.
        net::ip::tcp::acceptor silent(ioc, {net::ip::make_address("127.0.0.1"), 0});
        auto cfg =
            make_config("redis://:pw@127.0.0.1:" + std::to_string(silent.local_endpoint().port()));
        cfg.connect_timeout = 300ms;
        redis_store s(cfg, {ioc.get_executor()});
        const auto t0 = std::chrono::steady_clock::now();
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
        CHECK(report.ec == store::errc::timeout);
        CHECK_MESSAGE(report.message.find("timed out") != std::string::npos, report.message);
    }
}

TEST_CASE("redis store: maxmemory-policy allkeys-* is refused (or warned) at start-up") {
    redis_server_options so;
    so.extra_args = {"--maxmemory-policy", "allkeys-lru"};
    redis_server server(so);
    auto cfg = make_config(server.url());
    net::io_context ioc;
    SUBCASE("refuse") {
        cfg.maxmemory_policy = onceproxy::config::maxmemory_check::refuse;
        redis_store s(cfg, {ioc.get_executor()});
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK(report.ec);
        CHECK_MESSAGE(report.message.find("allkeys-lru") != std::string::npos, report.message);
    }
    SUBCASE("warn") {
        cfg.maxmemory_policy = onceproxy::config::maxmemory_check::warn;
        redis_store s(cfg, {ioc.get_executor()});
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK_MESSAGE(!report.ec, report.message);
        REQUIRE(report.warnings.size() == 1);
        CHECK(report.warnings[0].find("allkeys-lru") != std::string::npos);
    }
    SUBCASE("CONFIG not allowed: warn") {
        server.cli({"ACL", "SETUSER", "managed", "on", ">pw", "~*", "+@all", "-config"});
        cfg.url = "redis://managed:pw@127.0.0.1:" + std::to_string(server.port());
        redis_store s(cfg, {ioc.get_executor()});
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK_MESSAGE(!report.ec, report.message);
        REQUIRE(report.warnings.size() == 1);
        CHECK(report.warnings[0].find("maxmemory-policy") != std::string::npos);
    }
}

TEST_CASE("redis store: a safe maxmemory-policy passes the start-up check without warning, and "
          "the check leaves no work behind") {
    net::io_context ioc;
    redis_store s(make_config(shared_server().url()), {ioc.get_executor()});
    store::redis_startup_report report;
    net::co_spawn(
        ioc,
        [](redis_store& st, store::redis_startup_report& out) -> net::awaitable<void> {
            out = co_await st.async_check_startup();
        }(s, report),
        net::detached);
    // The application runs the check with io_context::run(): it must return by itself.
    const auto t0 = std::chrono::steady_clock::now();
    ioc.run_for(10s);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    CHECK_MESSAGE(!report.ec, report.message);
    CHECK(report.warnings.empty());
}

namespace {

/// A CA and a server certificate for 127.0.0.1, made with the openssl CLI in a temp dir.
struct test_pki {
    onceproxy::test::temp_dir dir;
    std::string ca, other_ca, cert, key;

    static void sh(const std::string& cmd) {
        const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
        REQUIRE_MESSAGE(rc == 0, "failed: " << cmd);
    }

    test_pki() {
        const std::string d = dir.path();
        const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        sh("openssl req -x509 " + ec + " -keyout " + d + "/ca.key -out " + d +
           "/ca.crt -days 2 -subj /CN=onceproxy-test-ca");
        sh("openssl req -x509 " + ec + " -keyout " + d + "/other.key -out " + d +
           "/other.crt -days 2 -subj /CN=someone-else");
        sh("openssl req " + ec + " -keyout " + d + "/server.key -out " + d +
           "/server.csr -subj /CN=127.0.0.1");
        dir.write("ext.cnf", "subjectAltName=IP:127.0.0.1\n");
        sh("openssl x509 -req -in " + d + "/server.csr -CA " + d + "/ca.crt -CAkey " + d +
           "/ca.key -CAcreateserial -out " + d + "/server.crt -days 2 -extfile " + d + "/ext.cnf");
        ca = d + "/ca.crt";
        other_ca = d + "/other.crt";
        cert = d + "/server.crt";
        key = d + "/server.key";
    }
};

} // namespace

TEST_CASE("redis store: rediss:// over TLS, verified against the CA; a wrong CA is refused") {
    test_pki pki;
    redis_server_options so;
    so.tls = redis_server_options::tls_files{pki.cert, pki.key, pki.ca};
    redis_server server(so);
    auto cfg = make_config(server.url());
    REQUIRE(cfg.url.rfind("rediss://", 0) == 0);

    SUBCASE("the right CA") {
        cfg.tls_ca_file = pki.ca;
        store_env env(cfg);
        auto report = env.go(env.store->async_check_startup());
        CHECK_MESSAGE(!report.ec, report.message);
        const std::string key = unique("tls");
        CHECK(env.claim(key, "o").status == claim_status::acquired);
        auto done = env.go(env.store->async_complete(key, "o", std::string(100'000, 'z'), 60s,
                                                     onceproxy::store::record_kind::kept, {}));
        REQUIRE(done.has_value());
        auto replay = env.claim(key, "p");
        CHECK(replay.status == claim_status::completed);
        CHECK(replay.record == std::string(100'000, 'z'));
    }
    SUBCASE("a wrong CA") {
        cfg.tls_ca_file = pki.other_ca;
        net::io_context ioc;
        redis_store s(cfg, {ioc.get_executor()});
        auto report = run(ioc, s.async_check_startup(), 5s);
        CHECK(report.ec == store::errc::tls_failed);
        CHECK_MESSAGE(report.message.find("TLS handshake") != std::string::npos, report.message);
        CHECK_MESSAGE(report.message.find("certificate verify failed") != std::string::npos,
                      report.message);
    }
}

namespace {

/// A loopback TCP relay in front of Redis that can blackhole the connections it already has
/// (replies lost, or nothing forwarded at all), while new connections pass normally.
class tcp_gate {
public:
    enum class mode {
        pass,         ///< forward both ways
        drop_replies, ///< forward commands to Redis, discard its replies
        blackhole,    ///< forward nothing either way
    };

    tcp_gate(net::io_context& ioc, std::uint16_t target)
        : ioc_(ioc), acceptor_(ioc, {net::ip::make_address("127.0.0.1"), 0}), target_(target) {
        net::co_spawn(ioc_, accept_loop(), net::detached);
    }
    std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
    /// Where new connections go from now on (a name that now resolves elsewhere).
    void set_target(std::uint16_t target) { target_ = target; }
    /// Applies `m` to every connection accepted so far; later ones pass.
    void set_existing(mode m) {
        for (auto& c : conns_) {
            c->m = m;
        }
    }

private:
    struct conn {
        explicit conn(net::io_context& ioc) : client(ioc), server(ioc) {}
        net::ip::tcp::socket client;
        net::ip::tcp::socket server;
        mode m = mode::pass;
    };

    static net::awaitable<void> pump(std::shared_ptr<conn> c, bool to_server) {
        std::vector<char> buf(64 * 1024);
        auto& from = to_server ? c->client : c->server;
        auto& to = to_server ? c->server : c->client;
        for (;;) {
            auto [ec, n] =
                co_await from.async_read_some(net::buffer(buf), net::as_tuple(net::use_awaitable));
            if (ec) {
                break;
            }
            const bool forward = c->m == mode::pass || (c->m == mode::drop_replies && to_server);
            if (forward) {
                auto [wec, wn] = co_await net::async_write(to, net::buffer(buf.data(), n),
                                                           net::as_tuple(net::use_awaitable));
                if (wec) {
                    break;
                }
            }
        }
        boost::system::error_code ignored;
        c->client.close(ignored);
        c->server.close(ignored);
    }

    net::awaitable<void> accept_loop() {
        for (;;) {
            auto c = std::make_shared<conn>(ioc_);
            auto [ec] =
                co_await acceptor_.async_accept(c->client, net::as_tuple(net::use_awaitable));
            if (ec) {
                co_return;
            }
            net::ip::tcp::endpoint ep(net::ip::make_address("127.0.0.1"), target_);
            auto [cec] = co_await c->server.async_connect(ep, net::as_tuple(net::use_awaitable));
            if (cec) {
                continue;
            }
            conns_.push_back(c);
            net::co_spawn(ioc_, pump(c, true), net::detached);
            net::co_spawn(ioc_, pump(c, false), net::detached);
        }
    }

    net::io_context& ioc_;
    net::ip::tcp::acceptor acceptor_;
    std::uint16_t target_;
    std::vector<std::shared_ptr<conn>> conns_;
};

} // namespace

TEST_CASE("redis store: a claim whose reply was lost is resolved by reading the owner") {
    net::io_context ioc;
    tcp_gate gate(ioc, shared_server().port());
    auto cfg = make_config("redis://127.0.0.1:" + std::to_string(gate.port()));
    cfg.command_timeout = 300ms;
    redis_store s(cfg, {ioc.get_executor()});
    s.start();
    redis_client& client = *s.client_for(ioc.get_executor());
    REQUIRE(run(ioc, client.async_wait_ready(5s)));

    SUBCASE("the claim took effect: acquired, without a second claim") {
        const std::string key = unique("lost-reply");
        gate.set_existing(tcp_gate::mode::drop_replies);
        const auto set_before = shared_server().command_calls("set");
        auto r = run(ioc, s.async_claim({key, "fp", "me", 30'000ms}));
        REQUIRE_MESSAGE(r.has_value(), r.error().message());
        CHECK(r->status == claim_status::acquired);
        CHECK(client.connect_count() == 2);
        CHECK(shared_server().command_calls("set") == set_before + 1);
        // The lease is really ours: the owner can complete it.
        auto done = run(ioc, s.async_complete(key, "me", "p", 60'000ms,
                                              onceproxy::store::record_kind::kept, {}));
        REQUIRE(done.has_value());
        CHECK(*done == fence_status::ok);
    }
    SUBCASE("the claim never arrived: the error comes back, the key stays free") {
        const std::string key = unique("never-arrived");
        gate.set_existing(tcp_gate::mode::blackhole);
        auto r = run(ioc, s.async_claim({key, "fp", "me", 30'000ms}));
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::timeout);
        auto again = run(ioc, s.async_claim({key, "fp", "other", 30'000ms}));
        REQUIRE(again.has_value());
        CHECK(again->status == claim_status::acquired);
    }
    s.stop();
}

namespace {

redis_server_options replica_of(const redis_server& master) {
    redis_server_options o;
    o.extra_args = {"--replicaof", "127.0.0.1", std::to_string(master.port())};
    return o;
}

/// A master and one replica of it, each its own redis-server; ready once the master counts
/// the replica online (past its first sync: a WAIT counts it from then on). A test may pause
/// the replica; it is resumed before both stop.
struct master_and_replica {
    ~master_and_replica() { replica.resume(); }
    master_and_replica(const master_and_replica&) = delete;
    master_and_replica& operator=(const master_and_replica&) = delete;
    master_and_replica() : replica(replica_of(master)) {
        REQUIRE(onceproxy::test::eventually(
            [&] {
                // Online, and acknowledged within the last second: a replica still
                // loading the first sync would make the first WAITs time out.
                const auto info = master.cli({"INFO", "replication"});
                return info.find("state=online") != std::string::npos &&
                       info.find("lag=0") != std::string::npos;
            },
            10s));
    }
    redis_server master;
    redis_server replica;
};

} // namespace

TEST_CASE("redis store, durability replicated: a write whose reply was lost counts only once a "
          "replica holds it") {
    // A master and one replica; the store reaches the master through the gate. With the
    // replica paused (connected, not acknowledging), a claim or a completion lands on the
    // master alone and its reply is dropped. Reading the key back on a new connection shows
    // it as ours, but a WAIT there counts nothing that connection wrote: it would report the
    // replica at once. The store must report not_replicated instead.
    master_and_replica pair;
    auto& master = pair.master;
    auto& replica = pair.replica;

    net::io_context ioc;
    tcp_gate gate(ioc, master.port());
    auto cfg = make_config("redis://127.0.0.1:" + std::to_string(gate.port()));
    // WAIT has 1 s (150 ms timed out on a loaded machine once the replica was back);
    // command_timeout, which ends the commands whose replies the gate drops, stays above it.
    cfg.command_timeout = 2'000ms;
    cfg.durability = onceproxy::config::redis_durability::replicated;
    cfg.replicas = 1;
    cfg.wait_timeout = 1'000ms;
    redis_store s(cfg, {ioc.get_executor()});
    s.start();
    redis_client& client = *s.client_for(ioc.get_executor());
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    REQUIRE_FALSE(run(ioc, client.async_exec({"PING"})).ec); // the gate has this connection
    auto on_master = [&](const std::string& key) {
        return master.cli({"EXISTS", s.redis_key(key)}) == "1\n";
    };

    SUBCASE("a claim") {
        const std::string key = unique("replicated-claim");
        replica.pause();
        gate.set_existing(tcp_gate::mode::drop_replies);
        auto r = run(ioc, s.async_claim({key, "fp", "me", 30'000ms}));
        CHECK(client.connect_count() == 2); // the recovery read the key on a new connection
        CHECK(on_master(key));              // the claim took effect on the master
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::not_replicated);

        // Once the replica acknowledges again, the same recovery finds the claim replicated.
        replica.resume();
        const std::string key2 = unique("replicated-claim");
        gate.set_existing(tcp_gate::mode::drop_replies);
        auto r2 = run(ioc, s.async_claim({key2, "fp", "me", 30'000ms}));
        REQUIRE_MESSAGE(r2.has_value(), r2.error().message());
        CHECK(r2->status == claim_status::acquired);
    }
    SUBCASE("a completion retried after its reply was lost") {
        const std::string key = unique("replicated-complete");
        auto claimed = run(ioc, s.async_claim({key, "fp", "me", 30'000ms}));
        REQUIRE_MESSAGE(claimed.has_value(), claimed.error().message());
        REQUIRE(claimed->status == claim_status::acquired);
        replica.pause();
        gate.set_existing(tcp_gate::mode::drop_replies);
        auto first = run(ioc, s.async_complete(key, "me", "p", 60'000ms,
                                               onceproxy::store::record_kind::kept, {}));
        REQUIRE_FALSE(first.has_value());
        // The record is on the master; the retry (on a new connection) finds it completed by
        // its own owner, which is not proof that a replica has it.
        REQUIRE(run(ioc, client.async_wait_ready(5s)));
        auto again = run(ioc, s.async_complete(key, "me", "p", 60'000ms,
                                               onceproxy::store::record_kind::kept, {}));
        REQUIRE_FALSE(again.has_value());
        CHECK(again.error() == store::errc::not_replicated);
        replica.resume();
        REQUIRE(run(ioc, client.async_wait_ready(5s)));
        auto settled = run(ioc, s.async_complete(key, "me", "p", 60'000ms,
                                                 onceproxy::store::record_kind::kept, {}));
        REQUIRE_MESSAGE(settled.has_value(), settled.error().message());
        CHECK(*settled == fence_status::ok);
    }
    s.stop();
}

TEST_CASE("redis store, durability replicated: the claims of one connection share their WAITs; "
          "with the replica paused they all fail as not_replicated, none times out") {
    // Redis serves a connection's commands only after its WAIT returns. With one WAIT per
    // claim and the replica not acknowledging, 40 claims on one connection would take 40
    // wait_timeouts one after another (4 s), well past command_timeout: most would time out,
    // and the timeout would close the connection under the others.
    master_and_replica pair;
    auto& master = pair.master;
    auto& replica = pair.replica;

    auto cfg = make_config(master.url());
    // The 40 claims share one WAIT: one acknowledgement later than wait_timeout fails them
    // all, so wait_timeout leaves room for a loaded machine (100 ms did not under ctest -j 2,
    // nor did 300 ms once in CI); with the replica paused, at most 3 WAITs one after another
    // stay within command_timeout.
    cfg.command_timeout = 5'000ms;
    cfg.durability = onceproxy::config::redis_durability::replicated;
    cfg.replicas = 1;
    cfg.wait_timeout = 1'000ms;
    store_env env(cfg);
    constexpr int n = 40;
    struct tally {
        int acquired = 0, not_replicated = 0, other = 0;
    };
    // n claims of distinct keys issued in the same event-loop turn, on the one connection.
    auto claim_all = [&] {
        tally t;
        int left = n;
        for (int i = 0; i < n; ++i) {
            net::co_spawn(
                env.ioc,
                [&, key = unique("shared-wait")]() -> net::awaitable<void> {
                    const store::claim_request req{key, "fp", "me", 30'000ms};
                    auto r = co_await env.store->async_claim(req);
                    if (r.has_value() && r->status == claim_status::acquired) {
                        ++t.acquired;
                    } else if (!r.has_value() && r.error() == store::errc::not_replicated) {
                        ++t.not_replicated;
                    } else {
                        ++t.other;
                    }
                    --left;
                },
                net::detached);
        }
        env.ioc.restart();
        for (int i = 0; i < 200 && left > 0; ++i) {
            env.ioc.run_for(50ms);
        }
        CHECK(left == 0);
        return t;
    };
    const auto connections = env.client().connect_count();

    SUBCASE("replica acknowledging: every claim acquired, a few WAITs for all of them") {
        master.cli({"CONFIG", "RESETSTAT"});
        const auto t = claim_all();
        CHECK(t.acquired == n);
        CHECK(t.not_replicated == 0);
        CHECK(t.other == 0);
        CHECK(master.command_calls("wait") >= 1);
        CHECK(master.command_calls("wait") <= 3);
    }
    SUBCASE("replica paused: every claim a store error within a couple of wait_timeouts") {
        replica.pause();
        master.cli({"CONFIG", "RESETSTAT"});
        const auto t = claim_all();
        CHECK(t.acquired == 0);
        CHECK(t.not_replicated == n);
        CHECK(t.other == 0);
        CHECK(master.command_calls("wait") <= 3);
        replica.resume();
    }
    CHECK(env.client().connect_count() == connections); // no timeout closed the connection
}

TEST_CASE("redis store: a node that answers -READONLY is left; the reconnect finds the master "
          "its address points at now") {
    // A plain URL whose name moved to a new master after a failover (a managed primary
    // endpoint, a Service): the gate stands for the name, first in front of a replica.
    master_and_replica pair;
    auto& master = pair.master;
    auto& replica = pair.replica;
    net::io_context ioc;
    tcp_gate gate(ioc, replica.port());
    auto cfg = make_config("redis://127.0.0.1:" + std::to_string(gate.port()));
    redis_store s(cfg, {ioc.get_executor()});
    s.start();
    redis_client& client = *s.client_for(ioc.get_executor());
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    const std::string key = unique("readonly");
    auto refused = run(ioc, s.async_claim({key, "fp", "me", 30'000ms}));
    CHECK_FALSE(refused.has_value()); // the replica refused the write
    gate.set_target(master.port());
    // The connection on the replica was closed: the next one reaches the master.
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    auto r = run(ioc, s.async_claim({key, "fp", "me", 30'000ms}));
    REQUIRE_MESSAGE(r.has_value(), r.error().message());
    CHECK(r->status == claim_status::acquired);
    CHECK(client.connect_count() == 2);
    s.stop();
}

TEST_CASE("redis client: the health check replaces a connection that stopped answering") {
    net::io_context ioc;
    tcp_gate gate(ioc, shared_server().port());
    redis::redis_client_options o;
    o.url = *redis::parse_redis_url("redis://127.0.0.1:" + std::to_string(gate.port()));
    o.command_timeout = 200ms;
    o.health_check_interval = 100ms;
    o.reconnect_min = 10ms;
    redis_client client(ioc.get_executor(), o);
    client.start();
    REQUIRE(run(ioc, client.async_wait_ready(5s)));
    // A round trip, so the gate has relayed this connection (without a handshake command the
    // client is ready as soon as TCP connects, before the gate's accept ran).
    REQUIRE_FALSE(run(ioc, client.async_exec({"PING"})).ec);
    gate.set_existing(tcp_gate::mode::blackhole);
    // No command of ours: only the periodic PING can notice.
    CHECK_MESSAGE(onceproxy::test::run_until(
                      ioc, [&] { return client.connect_count() >= 2 && client.ready(); }, 3s),
                  "connects: " << client.connect_count() << ", ready: " << client.ready()
                               << ", last failure: " << client.last_failure().message);
    auto pong = run(ioc, client.async_exec({"PING"}));
    CHECK(!pong.ec);
}

TEST_CASE("redis store: one connection per worker executor, used from worker threads at once") {
    constexpr int workers = 2;
    std::vector<std::unique_ptr<net::io_context>> contexts;
    std::vector<net::any_io_executor> executors;
    for (int i = 0; i < workers; ++i) {
        contexts.push_back(std::make_unique<net::io_context>(1));
        executors.push_back(contexts.back()->get_executor());
    }
    auto cfg = make_config(shared_server().url());
    cfg.connections_per_worker = 2;
    redis_store s(cfg, executors);
    // Each worker's connections belong to that worker; round robin within the worker.
    redis_client* a0 = s.client_for(executors[0]);
    redis_client* a1 = s.client_for(executors[0]);
    redis_client* b0 = s.client_for(executors[1]);
    CHECK(a0 != a1);
    CHECK(a0 != b0);
    CHECK(s.client_for(executors[0]) == a0);
    net::io_context stranger;
    CHECK(s.client_for(stranger.get_executor()) == nullptr);

    s.start();
    // 50 claims of one key per worker, from both worker threads at the same time.
    const std::string key = unique("workers");
    std::atomic<int> acquired{0}, in_flight{0}, failed{0};
    auto claims = [&](store::store& st, int w) -> net::awaitable<void> {
        // This worker's connections are up.
        const auto ex = co_await net::this_coro::executor;
        for (std::size_t i = 0; i < cfg.connections_per_worker; ++i) {
            co_await s.client_for(ex)->async_wait_ready(2s);
        }
        for (int i = 0; i < 50; ++i) {
            const std::string owner = "w" + std::to_string(w) + "-" + std::to_string(i);
            const store::claim_request req{key, "fp", owner, 30'000ms};
            auto r = co_await st.async_claim(req);
            if (!r.has_value()) {
                ++failed;
            } else if (r->status == claim_status::acquired) {
                ++acquired;
            } else if (r->status == claim_status::in_flight) {
                ++in_flight;
            }
        }
    };
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
        net::co_spawn(*contexts[w], claims(s, w),
                      [&ctx = *contexts[w]](std::exception_ptr) { ctx.stop(); });
        threads.emplace_back([&ctx = *contexts[w]] { ctx.run_for(20s); });
    }
    for (auto& t : threads) {
        t.join();
    }
    CHECK(failed == 0);
    CHECK(acquired == 1);
    CHECK(in_flight == 2 * 50 - 1);
    s.stop();
    for (auto& c : contexts) {
        c->restart();
        c->run_for(100ms);
    }
}

TEST_CASE("redis store: complete writes the same record whether or not the claim's fields are "
          "given") {
    // Given the claim's fields, complete sends the lease they make and the script compares it
    // whole; unknown, it sends the owner's prefix. Either way the record is `2c`, the fields of
    // the lease found, the payload, and a lease of another owner is left as it is.
    store_env env(make_config(shared_server().url()));
    auto claim = [&env](const std::string& key, const std::string& owner, std::int64_t created_ms,
                        store::duration lease = 30'000ms) {
        auto r = env.go(env.store->async_claim({key, "fp", owner, lease, {}, created_ms}));
        REQUIRE_MESSAGE(r.has_value(), r.error().message());
        return r->status;
    };
    auto complete = [&env](const std::string& key, const std::string& owner, std::string payload,
                           store::claimed_lease claimed) {
        auto r = env.go(env.store->async_complete(key, owner, std::move(payload), 60'000ms,
                                                  onceproxy::store::record_kind::kept,
                                                  std::move(claimed)));
        REQUIRE_MESSAGE(r.has_value(), r.error().message());
        return *r;
    };
    auto value = [&env](const std::string& key) {
        return shared_server().cli({"GET", env.store->redis_key(key)});
    };
    const store::claimed_lease unknown{};
    const std::string key = unique("complete");
    SUBCASE("the claim's fields given: the lease compared whole") {
        REQUIRE(claim(key, "owner-1", 111) == claim_status::acquired);
        CHECK(complete(key, "owner-1", "p1", {"fp", 111}) == fence_status::ok);
        CHECK(value(key) == "2c7:owner-12:fp111;p1\n");
        // A retry whose first reply was lost.
        CHECK(complete(key, "owner-1", "p2", {"fp", 111}) == fence_status::ok);
        CHECK(value(key) == "2c7:owner-12:fp111;p1\n");
    }
    SUBCASE("the claim's fields unknown: the owner's prefix") {
        REQUIRE(claim(key, "owner-1", 111) == claim_status::acquired);
        CHECK(complete(key, "owner-1", "p1", unknown) == fence_status::ok);
        CHECK(value(key) == "2c7:owner-12:fp111;p1\n");
        CHECK(complete(key, "owner-1", "p2", unknown) == fence_status::ok);
        CHECK(value(key) == "2c7:owner-12:fp111;p1\n");
    }
    SUBCASE("the same owner's lease lapsed and was claimed again: the lease found counts") {
        REQUIRE(claim(key, "owner-1", 111, 100ms) == claim_status::acquired);
        std::this_thread::sleep_for(300ms);
        REQUIRE(claim(key, "owner-1", 222) == claim_status::acquired);
        // The fields of the first claim: the whole lease differs, its owner's prefix matches.
        CHECK(complete(key, "owner-1", "p", {"fp", 111}) == fence_status::ok);
        CHECK(value(key) == "2c7:owner-12:fp222;p\n");
    }
    SUBCASE("taken over: the stale owner changes nothing, its claim's fields known or not") {
        REQUIRE(claim(key, "owner-1", 111, 100ms) == claim_status::acquired);
        std::this_thread::sleep_for(300ms);
        REQUIRE(claim(key, "owner-2", 222) == claim_status::acquired);
        CHECK(complete(key, "owner-1", "stale", {"fp", 111}) == fence_status::not_owner);
        CHECK(complete(key, "owner-1", "stale", unknown) == fence_status::not_owner);
        CHECK(value(key) == "2f7:owner-22:fp222;\n");
        CHECK(complete(key, "owner-2", "fresh", {"fp", 222}) == fence_status::ok);
        CHECK(complete(key, "owner-1", "stale", {"fp", 111}) == fence_status::not_owner);
        CHECK(complete(key, "owner-1", "stale", unknown) == fence_status::not_owner);
        CHECK(value(key) == "2c7:owner-22:fp222;fresh\n");
    }
}

TEST_CASE("redis store: record format: binary-safe fields, versioned, foreign keys are errors") {
    store_env env(make_config(shared_server().url()));
    SUBCASE("fingerprints and owners are compared as bytes, NULs included") {
        const std::string key = unique("binary");
        const std::string fp_a("\0\x01\xff"
                               "a",
                               4);
        const std::string fp_b("\0\x01\xff"
                               "b",
                               4);
        const std::string owner("own\0er", 6);
        CHECK(env.claim(key, owner, fp_a).status == claim_status::acquired);
        CHECK(env.claim(key, "x", fp_b).status == claim_status::mismatch);
        CHECK(env.claim(key, "x", fp_a).status == claim_status::in_flight);
        auto wrong = env.go(env.store->async_extend(key, std::string("own", 3), 30'000ms));
        REQUIRE(wrong.has_value());
        CHECK(*wrong == fence_status::not_owner);
        auto ok = env.go(env.store->async_extend(key, owner, 30'000ms));
        REQUIRE(ok.has_value());
        CHECK(*ok == fence_status::ok);
        // The record is one string, version and state first (what an operator sees in
        // redis-cli; README "Keys in Redis").
        CHECK(shared_server().cli({"TYPE", env.store->redis_key(key)}) == "string\n");
        const auto value = shared_server().cli({"GET", env.store->redis_key(key)});
        CHECK(value.starts_with(std::string("2f6:own\0er", 10)));
    }
    SUBCASE("a record of an unknown version is a protocol error, not a free key") {
        const std::string key = unique("future");
        shared_server().cli({"SET", env.store->redis_key(key), "3c1:o2:fp1;payload"});
        auto r = env.go(env.store->async_claim({key, "fp", "o", 30'000ms}));
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::protocol);
        // An error reply leaves the connection usable.
        auto ping = env.go(env.store->async_ping());
        CHECK(ping.has_value());
        CHECK(env.client().connect_count() == 1);
    }
    SUBCASE("a key of another type is a protocol error") {
        const std::string key = unique("string");
        shared_server().cli({"SET", env.store->redis_key(key), "not a record"});
        auto r = env.go(env.store->async_claim({key, "fp", "o", 30'000ms}));
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::protocol);
        const std::string list = unique("list");
        shared_server().cli({"RPUSH", env.store->redis_key(list), "x"});
        auto l = env.go(env.store->async_claim({list, "fp", "o", 30'000ms}));
        REQUIRE_FALSE(l.has_value());
        CHECK(l.error() == store::errc::protocol);
    }
    SUBCASE("records of the earlier layout (version 1, a hash) are still read, never rewritten") {
        // As an earlier version left them in Redis: a completed record, a held lease.
        const std::string done = unique("v1done");
        shared_server().cli({"HSET", env.store->redis_key(done), "v", "1", "st", "c", "ow", "old",
                             "fp", "fp", "ct", "1700000000000", "pl", "the answer"});
        shared_server().cli({"PEXPIRE", env.store->redis_key(done), "60000"});
        const std::string held = unique("v1held");
        shared_server().cli({"HSET", env.store->redis_key(held), "v", "1", "st", "f", "ow", "old",
                             "fp", "fp", "ct", "1700000000000"});
        shared_server().cli({"PEXPIRE", env.store->redis_key(held), "20000"});

        auto replay = env.claim(done, "new", "fp");
        CHECK(replay.status == claim_status::completed);
        CHECK(replay.record == "the answer");
        CHECK(replay.round_trips == 2);
        CHECK(env.claim(done, "new", "other").status == claim_status::mismatch);
        auto waiting = env.claim(held, "new", "fp");
        CHECK(waiting.status == claim_status::in_flight);
        CHECK(waiting.remaining_lease > 0ms);
        CHECK(waiting.remaining_lease <= 20'000ms);
        // Read only: both are still the hashes the earlier version wrote.
        CHECK(shared_server().cli({"TYPE", env.store->redis_key(done)}) == "hash\n");
        CHECK(shared_server().cli({"HGET", env.store->redis_key(held), "ow"}) == "old\n");
        // Key administration reads and purges them too.
        auto info = env.go(env.store->async_inspect(done));
        REQUIRE(info.has_value());
        CHECK(info->state == store::key_state::completed);
        CHECK(info->record == "the answer");
        auto purged = env.go(env.store->async_purge(held, false));
        REQUIRE(purged.has_value());
        CHECK(*purged == store::purge_status::in_flight);
        purged = env.go(env.store->async_purge(done, false));
        REQUIRE(purged.has_value());
        CHECK(*purged == store::purge_status::purged_record);
    }
    SUBCASE("leases and records expire through Redis's own expiry") {
        const std::string key = unique("ttl");
        CHECK(env.claim(key, "o", "fp", 5'000ms).status == claim_status::acquired);
        const auto pttl = std::stoll(shared_server().cli({"PTTL", env.store->redis_key(key)}));
        CHECK(pttl > 0);
        CHECK(pttl <= 5'000);
        auto in_flight = env.claim(key, "p", "fp");
        CHECK(in_flight.status == claim_status::in_flight);
        CHECK(in_flight.remaining_lease > 0ms);
        CHECK(in_flight.remaining_lease <= 5'000ms);
        auto done = env.go(env.store->async_complete(key, "o", "r", 3'600'000ms,
                                                     onceproxy::store::record_kind::kept, {}));
        REQUIRE(done.has_value());
        const auto record_ttl =
            std::stoll(shared_server().cli({"PTTL", env.store->redis_key(key)}));
        CHECK(record_ttl > 3'500'000);
    }
}
