// The Redis store behind Sentinel (SPEC §5): a real master, two replicas and three sentinels on
// loopback ports (tests/support/redis_sentinel_set). The store contract suite runs against it;
// failovers (SIGKILL of the master) are followed by the store and by a running onceproxy
// without a restart; an announced failover (SENTINEL FAILOVER, the old master still up) is
// followed through the +switch-master subscription before any request; durability: replicated
// waits for replicas.

#include "onceproxy/store/redis_store.hpp"

#include "conformance/store_suite.hpp"
#include "onceproxy/redis/redis_client.hpp"
#include "onceproxy/store/error.hpp"
#include "support/http_client.hpp"
#include "support/log_lines.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_sentinel_set.hpp"
#include "support/run_awaitable.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using onceproxy::store::claim_status;
using onceproxy::store::redis_store;
using onceproxy::test::redis_sentinel_set;
namespace store = onceproxy::store;
namespace redis = onceproxy::redis;
namespace test = onceproxy::test;
using clock_type = std::chrono::steady_clock;

redis_sentinel_set& shared_set() {
    static redis_sentinel_set set;
    return set;
}

onceproxy::config::redis_config sentinel_config(const redis_sentinel_set& set) {
    onceproxy::config::redis_config cfg;
    onceproxy::config::redis_sentinel_config s;
    s.master = set.master_name();
    for (const auto& n : set.sentinel_nodes()) {
        s.nodes.push_back({"127.0.0.1", static_cast<std::uint16_t>(std::stoi(n.substr(10)))});
    }
    cfg.sentinel = s;
    cfg.key_prefix = "sentinel-test:";
    cfg.connect_timeout = 2'000ms;
    cfg.command_timeout = 2'000ms;
    cfg.health_check_interval = 60'000ms;
    return cfg;
}

using onceproxy::test::run;

/// A started redis_store on one io_context, found through the sentinels.
struct store_env {
    explicit store_env(onceproxy::config::redis_config c) : cfg(std::move(c)) {
        store = std::make_unique<redis_store>(
            cfg, std::vector<net::any_io_executor>{ioc.get_executor()});
        store->start();
        auto& client = *store->client_for(ioc.get_executor());
        REQUIRE_MESSAGE(run(ioc, client.async_wait_ready(10s)),
                        "no connection: " << client.last_failure().message);
    }
    ~store_env() {
        store->stop();
        ioc.restart();
        ioc.run_for(100ms);
    }
    store::result<store::claim_result> claim(const std::string& key, const std::string& owner) {
        return run(ioc, store->async_claim({key, "fp", owner, 30'000ms}));
    }

    onceproxy::config::redis_config cfg;
    net::io_context ioc;
    std::unique_ptr<redis_store> store;
};

class sentinel_fixture {
public:
    sentinel_fixture() : env_(sentinel_config(shared_set())) {}
    store::store& store() { return *env_.store; }
    template <class T>
    T run(net::awaitable<T> op) {
        return ::run(env_.ioc, std::move(op), 10s);
    }
    void advance(std::chrono::milliseconds d) { onceproxy::conformance::let_real_time_pass(d); }
    std::string unique_key() { return test::unique_key("sentinel", "conformance"); }

private:
    store_env env_;
};

/// A proxy config with the store behind `set`'s sentinels and a guarded route /pay that fails
/// closed when the store fails.
test::proxy_config sentinel_proxy_config(const redis_sentinel_set& set, unsigned short upstream) {
    test::proxy_config c;
    c.upstream_port = upstream;
    c.store = {"type: redis",
               "redis:",
               "  connect_timeout: 500ms",
               "  command_timeout: 250ms",
               "  sentinel:",
               "    master: " + set.master_name(),
               "    nodes:"};
    for (const auto& n : set.sentinel_nodes()) {
        c.store.push_back("      - \"" + n + "\"");
    }
    c.routes = "  - name: pay\n    match: { prefix: /pay }\n    upstream: app\n"
               "    idempotency: { mode: required, on_store_error: fail_closed }\n";
    return c;
}

test::http_response post_pay(const test::proxy_process& proxy, const std::string& key) {
    return test::fetch(proxy.port, "POST", "/pay",
                       {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                       R"({"amount":1})");
}

/// The sentinels the proxy subscribed to +switch-master on, in order, from its log.
std::vector<std::string> subscriptions(const test::proxy_process& proxy) {
    std::vector<std::string> out;
    for (const auto& line : test::process_log_lines(proxy.log())) {
        if (line.at("msg").as_string() == "following failovers through a sentinel") {
            out.emplace_back(line.at("sentinel").as_string());
        }
    }
    return out;
}

/// A stale sentinel: answers every command it is sent with the address `port` on loopback
/// (as a sentinel cut off from the others keeps naming a master that was demoted).
class stale_sentinel {
public:
    stale_sentinel(net::io_context& ioc, std::uint16_t port)
        : acceptor_(ioc, {net::ip::make_address("127.0.0.1"), 0}), port_(port) {
        net::co_spawn(ioc, accept_loop(), net::detached);
    }
    std::string node() const {
        return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
    }
    int questions() const { return questions_; }

private:
    net::awaitable<void> serve(net::ip::tcp::socket s) {
        const std::string p = std::to_string(port_);
        const std::string answer =
            "*2\r\n$9\r\n127.0.0.1\r\n$" + std::to_string(p.size()) + "\r\n" + p + "\r\n";
        std::array<char, 4096> buf{};
        for (;;) {
            auto [ec, n] =
                co_await s.async_read_some(net::buffer(buf), net::as_tuple(net::use_awaitable));
            if (ec) {
                co_return;
            }
            ++questions_;
            auto [wec, wn] = co_await net::async_write(s, net::buffer(answer),
                                                       net::as_tuple(net::use_awaitable));
            if (wec) {
                co_return;
            }
        }
    }
    net::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, s] = co_await acceptor_.async_accept(net::as_tuple(net::use_awaitable));
            if (ec) {
                co_return;
            }
            net::co_spawn(acceptor_.get_executor(), serve(std::move(s)), net::detached);
        }
    }

    net::ip::tcp::acceptor acceptor_;
    std::uint16_t port_;
    int questions_ = 0;
};

const std::string switch_master_series =
    "onceproxy_store_master_switches_total{cause=\"switch_master\"}";
const std::string readonly_series = "onceproxy_store_master_switches_total{cause=\"readonly\"}";

} // namespace

ONCEPROXY_STORE_SUITE(sentinel_fixture);

TEST_SUITE("redis sentinel") {
    TEST_CASE("the record lands on the master the sentinels name, and reaches the replicas") {
        auto& set = shared_set();
        store_env env(sentinel_config(set));
        const auto key = test::unique_key("sentinel", "where");
        const auto r = env.claim(key, "owner-1");
        REQUIRE(r.has_value());
        CHECK(r->status == claim_status::acquired);
        CHECK(set.master().cli({"GET", "sentinel-test:" + key}).starts_with("2f7:owner-1"));
    }

    TEST_CASE("a failover is followed: errors (never a hang) while it happens, then the new "
              "master") {
        auto& set = shared_set();
        store_env env(sentinel_config(set));
        const auto before = test::unique_key("sentinel", "before");
        REQUIRE(env.claim(before, "o").has_value());
        const auto old_port = set.master_port();

        const auto killed = clock_type::now();
        const auto now_port = set.fail_over();
        CHECK(now_port != old_port);

        // Operations during and after: each answers (bounded by run's limit), some fail with a
        // store error until the client has found the new master.
        std::size_t failed = 0;
        std::string key;
        const bool back = test::eventually(
            [&] {
                key = test::unique_key("sentinel", "after");
                const auto r = env.claim(key, "o");
                if (r.has_value() && r->status == claim_status::acquired) {
                    return true;
                }
                ++failed;
                return false;
            },
            std::chrono::duration_cast<std::chrono::milliseconds>(killed + 30s - clock_type::now()),
            50ms);
        CAPTURE(failed);
        REQUIRE(back);
        // On the master the sentinels name now: on a loaded machine they may have failed over
        // once more since fail_over() returned (a second election), and the client follows.
        CHECK(
            set.node(set.master_port()).cli({"GET", "sentinel-test:" + key}).starts_with("2f1:o"));
    }

    TEST_CASE("the sentinels' own password; a wrong one is a clear start-up error") {
        test::redis_sentinel_set_options o;
        o.sentinel_password = "watch-secret";
        redis_sentinel_set set(o);
        auto cfg = sentinel_config(set);
        cfg.sentinel->password = "watch-secret";
        {
            store_env env(cfg);
            const auto r = env.claim(test::unique_key("sentinel", "auth"), "o");
            REQUIRE(r.has_value());
            CHECK(r->status == claim_status::acquired);
        }
        cfg.sentinel->password = "wrong";
        net::io_context ioc;
        redis_store s(cfg, {ioc.get_executor()});
        const auto report = run(ioc, s.async_check_startup());
        CHECK(report.ec == store::errc::auth_failed);
        CHECK(report.message.find("no sentinel gave the address of master 'onceproxy-test'") !=
              std::string::npos);
        CHECK(report.message.find("127.0.0.1:") != std::string::npos);
    }

    TEST_CASE("a sentinel that keeps naming a replica is not asked first again: the store "
              "reaches the master through the others") {
        auto& set = shared_set();
        const auto master = set.master_port();
        std::uint16_t replica = 0;
        for (const auto p : set.node_ports()) {
            if (p != master) {
                replica = p;
            }
        }
        REQUIRE(replica != 0);
        auto cfg = sentinel_config(set);
        cfg.connect_timeout = 500ms;
        net::io_context ioc;
        stale_sentinel stale(ioc, replica);
        // The stale one first: it answers, the ROLE check on its answer fails.
        cfg.sentinel->nodes.insert(
            cfg.sentinel->nodes.begin(),
            {"127.0.0.1", static_cast<std::uint16_t>(std::stoi(stale.node().substr(10)))});
        redis_store s(cfg, {ioc.get_executor()});
        s.start();
        auto& client = *s.client_for(ioc.get_executor());
        CHECK_MESSAGE(run(ioc, client.async_wait_ready(10s)),
                      "no connection: " << client.last_failure().message);
        CHECK(stale.questions() >= 1);
        const auto r =
            run(ioc, s.async_claim({test::unique_key("sentinel", "stale"), "fp", "o", 30'000ms}));
        REQUIRE_MESSAGE(r.has_value(), r.error().message());
        CHECK(r->status == claim_status::acquired);
        s.stop();
        ioc.restart();
        ioc.run_for(100ms);
    }

    TEST_CASE("a data-node user refused ROLE: a start-up error that says so") {
        auto& set = shared_set();
        auto& master = set.master();
        const std::string user = "norole-" + std::to_string(::getpid());
        master.cli({"ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-role"});
        auto cfg = sentinel_config(set);
        cfg.username = user;
        cfg.password = "pw";
        net::io_context ioc;
        redis_store s(cfg, {ioc.get_executor()});
        const auto report = run(ioc, s.async_check_startup());
        master.cli({"ACL", "DELUSER", user});
        CHECK(report.ec == store::errc::auth_failed);
        CHECK_MESSAGE(report.message.find("refused ROLE") != std::string::npos, report.message);
        CHECK_MESSAGE(report.message.find("NOPERM") != std::string::npos, report.message);
    }

    TEST_CASE("durability replicated: WAIT behind each claim and completion; too few replicas is "
              "a store error") {
        auto& set = shared_set();
        auto cfg = sentinel_config(set);
        cfg.durability = onceproxy::config::redis_durability::replicated;
        cfg.replicas = 2;
        cfg.wait_timeout = 500ms;
        const auto waits_before = set.master().command_calls("wait");
        {
            store_env env(cfg);
            const auto key = test::unique_key("sentinel", "durable");
            const auto r = env.claim(key, "o");
            REQUIRE_MESSAGE(r.has_value(), r.error().message());
            CHECK(r->status == claim_status::acquired);
            const auto done =
                run(env.ioc, env.store->async_complete(key, "o", "payload", 60s,
                                                       onceproxy::store::record_kind::kept, {}));
            REQUIRE(done.has_value());
            CHECK(*done == store::fence_status::ok);
            // Every node, replicas included, has the completed record at once (WAIT 2).
            for (const std::uint16_t p : set.node_ports()) {
                CAPTURE(p);
                CHECK(set.node(p).cli({"GET", "sentinel-test:" + key}).starts_with("2c1:o"));
            }
        }
        CHECK(set.master().command_calls("wait") == waits_before + 2);

        cfg.replicas = 3; // only two exist
        cfg.wait_timeout = 100ms;
        store_env env(cfg);
        const auto started = clock_type::now();
        const auto r = env.claim(test::unique_key("sentinel", "short"), "o");
        const auto took = clock_type::now() - started;
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == store::errc::not_replicated);
        CHECK(took >= 100ms);
        CHECK(took < 2s);
    }

    TEST_CASE("onceproxy follows a failover without a restart") {
        auto& set = shared_set();
        test::upstream_process up(2);
        test::proxy_process proxy(sentinel_proxy_config(set, up.port).yaml());
        const auto post = [&](const std::string& key) {
            return test::fetch(proxy.port, "POST", "/pay",
                               {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                               R"({"amount":1})");
        };
        REQUIRE(test::eventually(
            [&] { return post(test::unique_key("sentinel", "warm")).status == 200; }, 10s, 50ms));
        const auto stored = test::unique_key("sentinel", "stored");
        REQUIRE(post(stored).status == 200);

        const auto killed = clock_type::now();
        set.fail_over();
        // Refused (503, never executed) until the proxy has found the new master, then served:
        // a run of 10 stored answers within the bound.
        std::size_t run_of = 0;
        std::size_t refused = 0;
        test::eventually(
            [&] {
                while (run_of < 10) {
                    const auto k = test::unique_key("sentinel", "back");
                    const auto r = post(k);
                    if (r.status == 200 && r.header("Idempotency-Status") == "stored") {
                        ++run_of;
                        CHECK(up.count(k) == 1);
                        continue;
                    }
                    run_of = 0;
                    ++refused;
                    onceproxy::test::check_problem(r, 503, "idempotency.store_unavailable");
                    CHECK(up.count(k) == 0);
                    return false;
                }
                return true;
            },
            std::chrono::duration_cast<std::chrono::milliseconds>(killed + 30s - clock_type::now()),
            50ms);
        CAPTURE(refused);
        CAPTURE(proxy.log());
        REQUIRE(run_of == 10);
        CHECK(proxy.proc.running());
        // The record made before the failover was replicated (idle master): still replayed.
        const auto again = post(stored);
        CHECK(again.status == 200);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(up.count(stored) == 1);
    }

    TEST_CASE("an announced failover (+switch-master) moves the proxy before any request: "
              "counted, no -READONLY, the next execution stored on the new master") {
        auto& set = shared_set();
        test::upstream_process up(2);
        test::proxy_process proxy(sentinel_proxy_config(set, up.port).yaml());
        REQUIRE(test::eventually(
            [&] { return post_pay(proxy, test::unique_key("sentinel", "warm")).status == 200; },
            10s, 50ms));
        REQUIRE(test::eventually([&] { return !subscriptions(proxy).empty(); }, 10s, 50ms));
        const auto announced_before = proxy.metric(switch_master_series);
        REQUIRE(announced_before >= 0); // the family is there with Sentinel
        CHECK(proxy.metric(readonly_series) == 0);
        const auto old_port = set.master_port();

        // The old master stays up and reachable: without the subscription the proxy would
        // only notice at its next write (-READONLY) or when Sentinel turns it into a replica.
        // Nothing is sent to the proxy until the switch has been counted.
        set.switch_over(0);
        CHECK(test::eventually(
            [&] { return proxy.metric(switch_master_series) > announced_before; }, 10s, 50ms));
        CHECK(proxy.metric(readonly_series) == 0);
        const auto line = test::find_log_line(proxy.log(), "redis master switched");
        REQUIRE(line.has_value());
        CHECK(std::string(line->at("cause").as_string()) == "switch_master");
        CHECK(std::string(line->at("from").as_string()) == "127.0.0.1:" + std::to_string(old_port));

        std::map<std::uint16_t, long long> evalsha_before;
        for (const auto p : set.node_ports()) {
            evalsha_before[p] = set.node(p).command_calls("evalsha");
        }
        const auto key = test::unique_key("sentinel", "announced");
        const auto r = post_pay(proxy, key);
        CAPTURE(proxy.log());
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Status") == "stored");
        CHECK(up.count(key) == 1);
        // Completed (the EVALSHA; replicas see only its effects) on the master the sentinels
        // name now (found afterwards: a second election under load may have moved it again),
        // not on the old one; a claim sent to the old one would have met -READONLY (counted).
        const auto now_port = set.master_port();
        CHECK(set.node(now_port).command_calls("evalsha") >= evalsha_before[now_port] + 1);
        if (now_port != old_port) {
            CHECK(set.node(old_port).command_calls("evalsha") == evalsha_before[old_port]);
        }
        CHECK(proxy.metric(readonly_series) == 0);
        CHECK(post_pay(proxy, key).header("Idempotency-Status") == "replayed");
        CHECK(up.count(key) == 1);
    }

    TEST_CASE("the +switch-master subscription survives the loss of its sentinel") {
        redis_sentinel_set set; // its own: one of its sentinels dies
        test::upstream_process up(2);
        test::proxy_process proxy(sentinel_proxy_config(set, up.port).yaml());
        REQUIRE(test::eventually([&] { return !subscriptions(proxy).empty(); }, 10s, 50ms));
        const auto first = subscriptions(proxy).front();
        const auto dead = set.sentinel_index(first);
        set.kill_sentinel(dead);

        // Subscribed again, through another sentinel.
        REQUIRE(test::eventually(
            [&] {
                const auto s = subscriptions(proxy);
                return s.size() >= 2 && s.back() != first;
            },
            20s, 50ms));
        CHECK(test::find_log_line(proxy.log(), "lost the subscription to a sentinel").has_value());

        const auto announced_before = proxy.metric(switch_master_series);
        REQUIRE(announced_before >= 0);
        set.switch_over((dead + 1) % set.sentinel_nodes().size());
        CHECK(test::eventually(
            [&] { return proxy.metric(switch_master_series) > announced_before; }, 10s, 50ms));
        CHECK(proxy.metric(readonly_series) == 0);
        const auto key = test::unique_key("sentinel", "after-loss");
        const auto r = post_pay(proxy, key);
        CAPTURE(proxy.log());
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Status") == "stored");
        CHECK(up.count(key) == 1);
    }

    TEST_CASE("SIGTERM with the +switch-master subscription up: the proxy exits at once, status "
              "0") {
        auto& set = shared_set();
        test::upstream_process up(1);
        test::proxy_process proxy(sentinel_proxy_config(set, up.port).yaml());
        REQUIRE(test::eventually([&] { return !subscriptions(proxy).empty(); }, 10s, 50ms));
        // The fixture writes shutdown_delay: 0; drain_timeout is 30 s, so a subscriber that
        // kept its event loop busy would hold the exit until the shutdown watchdog fires.
        CHECK(proxy.terminate(5s) == 0);
        CAPTURE(proxy.log());
        CHECK_FALSE(test::find_log_line(proxy.log(), "shutdown overran").has_value());
        CHECK(test::find_log_line(proxy.log(), "drained, exiting").has_value());
    }
}
