// redis_store in Cluster mode (store.redis.cluster) against a real Redis Cluster: three
// masters with one replica each, started on free loopback ports by the fixture. A missing
// redis-server fails these tests, it never skips them.
#include "onceproxy/redis/redis_cluster.hpp"

#include "conformance/store_suite.hpp"
#include "onceproxy/store/error.hpp"
#include "onceproxy/store/redis_store.hpp"
#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_cluster.hpp"
#include "support/run_awaitable.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using onceproxy::redis::redis_key_slot;
using onceproxy::store::claim_status;
using onceproxy::store::redis_store;
using test_cluster = onceproxy::test::redis_cluster;
namespace store = onceproxy::store;
namespace redis = onceproxy::redis;
namespace test = onceproxy::test;

using onceproxy::test::run;

test_cluster& shared_cluster() {
    static test_cluster cluster;
    return cluster;
}

onceproxy::config::redis_config cluster_config(const std::vector<std::string>& nodes) {
    onceproxy::config::redis_config cfg;
    cfg.cluster.nodes = nodes;
    cfg.key_prefix = "test:";
    // Generous under sanitizers on a shared 2-core machine.
    cfg.connect_timeout = 2'000ms;
    cfg.command_timeout = 2'000ms;
    cfg.health_check_interval = 60'000ms;
    return cfg;
}

/// A started Cluster-mode redis_store on one io_context, its slot map loaded.
struct cluster_env {
    explicit cluster_env(const std::vector<std::string>& nodes) : cfg(cluster_config(nodes)) {
        store = std::make_unique<redis_store>(
            cfg, std::vector<net::any_io_executor>{ioc.get_executor()});
        store->start();
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        bool answered = false;
        while (!answered && std::chrono::steady_clock::now() < deadline) {
            answered = go(store->async_ping()).has_value();
        }
        REQUIRE_MESSAGE(answered, "the cluster store did not answer a PING within 10 s");
    }
    ~cluster_env() {
        store->stop();
        ioc.restart();
        ioc.run_for(100ms);
    }
    template <class T>
    T go(net::awaitable<T> op, std::chrono::milliseconds limit = 15s) {
        return run(ioc, std::move(op), limit);
    }
    store::claim_result claim(const std::string& key, const std::string& owner,
                              const std::string& fp = "fp") {
        auto r = go(store->async_claim({key, fp, owner, store::duration{30'000}}));
        REQUIRE_MESSAGE(r.has_value(), "claim failed: " << r.error().message());
        return *r;
    }

    onceproxy::config::redis_config cfg;
    net::io_context ioc;
    std::unique_ptr<redis_store> store;
};

/// Conformance fixture: the shared cluster, a fresh store per test case, real time.
class cluster_fixture {
public:
    cluster_fixture() : env_(shared_cluster().addresses()) {}
    store::store& store() { return *env_.store; }
    template <class T>
    T run(net::awaitable<T> op) {
        return env_.go(std::move(op), 10s);
    }
    void advance(std::chrono::milliseconds d) { onceproxy::conformance::let_real_time_pass(d); }
    std::string unique_key() { return test::unique_key("cluster", "conformance"); }

private:
    cluster_env env_;
};

/// The node at `port` holds `key` (CLUSTER GETKEYSINSLOT: no redirect, whatever the state of
/// the slot on that node, importing or migrating).
bool exists_on(test_cluster& c, std::uint16_t port, const std::string& key) {
    const auto out =
        c.cli(port, {"CLUSTER", "GETKEYSINSLOT", std::to_string(redis_key_slot(key)), "100000"});
    return ("\n" + out).find("\n" + key + "\n") != std::string::npos;
}

/// A master of `c` other than the one on `port`.
std::uint16_t another_master(test_cluster& c, std::uint16_t port) {
    for (const auto p : c.master_ports()) {
        if (p != port) {
            return p;
        }
    }
    FAIL("the cluster has no other master than " << port);
    return 0;
}

} // namespace

ONCEPROXY_STORE_SUITE(cluster_fixture);

TEST_CASE("redis cluster store: records spread over the masters, each on its slot's master") {
    auto& cluster = shared_cluster();
    cluster_env env(cluster.addresses());
    std::set<std::uint16_t> masters_used;
    // Until every master holds one (3 of 24 random keys would do with even slots; other cases
    // of this shared Cluster move slots around, so allow more), each key on its slot's master.
    for (int i = 0; i < 200 && masters_used.size() < 3; ++i) {
        const auto key = test::unique_key("cluster", "spread");
        REQUIRE(env.claim(key, "o1").status == claim_status::acquired);
        const std::string rkey = env.store->redis_key(key);
        const auto port = cluster.master_of_slot(redis_key_slot(rkey));
        CAPTURE(rkey);
        CHECK(exists_on(cluster, port, rkey));
        masters_used.insert(port);
        CHECK(env.claim(key, "o2").status == claim_status::in_flight);
    }
    CHECK(masters_used.size() == 3);
}

TEST_CASE("redis cluster store: -MOVED after a slot changed master is followed, -ASK during a "
          "migration too") {
    auto& cluster = shared_cluster();
    cluster_env env(cluster.addresses());
    // Two keys of one slot (a hash tag in the store key), both claimed before the move.
    const std::string tag = "{" + test::unique_key("cluster", "tag") + "}";
    const std::string moved = tag + "moved";
    const std::string before = tag + "before";
    const std::string later = tag + "later";
    const std::string rmoved = env.store->redis_key(moved);
    const auto slot = redis_key_slot(rmoved);
    REQUIRE(redis_key_slot(env.store->redis_key(later)) == slot);
    REQUIRE(env.claim(moved, "o1").status == claim_status::acquired);
    REQUIRE(env.claim(before, "o1").status == claim_status::acquired);
    const auto from = cluster.master_of_slot(slot);
    const auto to = another_master(cluster, from);

    SUBCASE("ASK, then MOVED") {
        cluster.begin_migration(slot, from, to);
        cluster.migrate_keys(slot, from, to, {rmoved});
        REQUIRE(exists_on(cluster, to, rmoved));
        // The source no longer has it and answers -ASK: the claim must find the record on the
        // target (in flight for o1), not create a second one on the source.
        CHECK(env.claim(moved, "o2").status == claim_status::in_flight);
        // A key still on the source is served there.
        CHECK(env.claim(before, "o2").status == claim_status::in_flight);
        // A new key of the migrating slot goes to the target (ASK), where it stays.
        CHECK(env.claim(later, "o1").status == claim_status::acquired);
        CHECK(exists_on(cluster, to, env.store->redis_key(later)));
        CHECK_FALSE(exists_on(cluster, from, env.store->redis_key(later)));
        cluster.migrate_keys(slot, from, to);
        cluster.finish_migration(slot, to);
        // From here the source answers -MOVED: every record is found on its new master.
        CHECK(env.claim(moved, "o3").status == claim_status::in_flight);
        CHECK(env.claim(before, "o3").status == claim_status::in_flight);
        CHECK(env.claim(later, "o3").status == claim_status::in_flight);
        auto done = env.go(env.store->async_complete(later, "o1", "payload", 60'000ms,
                                                     onceproxy::store::record_kind::kept, {}));
        REQUIRE(done.has_value());
        CHECK(*done == store::fence_status::ok);
        const auto replay = env.claim(later, "o4");
        CHECK(replay.status == claim_status::completed);
        CHECK(replay.record == "payload");
    }
    SUBCASE("MOVED at once (the map is stale after a whole-slot move)") {
        cluster.begin_migration(slot, from, to);
        cluster.migrate_keys(slot, from, to);
        cluster.finish_migration(slot, to);
        CHECK(env.claim(moved, "o2").status == claim_status::in_flight);
        CHECK(env.claim(before, "o2").status == claim_status::in_flight);
        CHECK(exists_on(cluster, to, rmoved));
        CHECK(env.claim(later, "o1").status == claim_status::acquired);
        CHECK(exists_on(cluster, to, env.store->redis_key(later)));
    }
    // Put the slot back for the other tests (they do not depend on where it is).
    cluster.begin_migration(slot, to, from);
    cluster.migrate_keys(slot, to, from);
    cluster.finish_migration(slot, from);
}

TEST_CASE("redis cluster store, durability replicated: the WAIT of a claim sent on by -ASK goes "
          "to the master that ran it") {
    auto& cluster = shared_cluster();
    auto cfg = cluster_config(cluster.addresses());
    cfg.durability = onceproxy::config::redis_durability::replicated;
    cfg.replicas = 1;
    cfg.wait_timeout = 1'000ms; // below command_timeout; 200 ms timed out on a loaded machine
    net::io_context ioc;
    redis_store st(cfg, {ioc.get_executor()});
    st.start();
    const auto up = std::chrono::steady_clock::now() + 10s;
    bool answered = false;
    while (!answered && std::chrono::steady_clock::now() < up) {
        answered = run(ioc, st.async_ping()).has_value();
    }
    REQUIRE(answered);

    const std::string key = test::unique_key("cluster", "ask-wait");
    const auto slot = redis_key_slot(st.redis_key(key));
    const auto from = cluster.master_of_slot(slot);
    const auto to = another_master(cluster, from);
    // The replica of the target: paused, it acknowledges nothing written on the target.
    test::redis_server* to_replica = nullptr;
    for (auto* n : cluster.nodes()) {
        const auto info = n->cli({"INFO", "replication"});
        const std::string field = "master_port:" + std::to_string(to);
        const auto at = info.find(field);
        const auto after = at + field.size();
        if (info.find("role:slave") != std::string::npos && at != std::string::npos &&
            (after == info.size() || info[after] < '0' || info[after] > '9')) {
            to_replica = n;
        }
    }
    REQUIRE(to_replica != nullptr);
    // Both masters' replicas past their first sync (a WAIT counts only replicas online).
    for (const auto port : {from, to}) {
        REQUIRE(test::eventually(
            [&] {
                return cluster.cli(port, {"INFO", "replication"}).find("state=online") !=
                       std::string::npos;
            },
            30s, 100ms));
    }
    cluster.begin_migration(slot, from, to);
    to_replica->pause();
    // The source does not hold the key and answers -ASK: the claim lands on the target, whose
    // replica cannot acknowledge it. A WAIT sent to the slot's owner by the map (the source,
    // whose replica is up) would report it replicated.
    auto r = run(ioc, st.async_claim({key, "fp", "me", 30'000ms}));
    to_replica->resume();
    CHECK(exists_on(cluster, to, st.redis_key(key)));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == store::errc::not_replicated);
    // With the replica running again, another new key of the slot (-ASK again) is claimed:
    // the target's replica acknowledges it.
    const std::string again = test::unique_key("cluster", "ask-wait");
    std::string again_key;
    // One name in 16384 lands in a given slot: 100,000 tries missed about once in 450 runs
    // (e^-6.1); a million miss once in e^61, and the loop ends at the first hit (about 16k).
    for (int i = 0; i < 1000000 && again_key.empty(); ++i) {
        const std::string k = again + "-" + std::to_string(i);
        if (redis_key_slot(st.redis_key(k)) == slot) {
            again_key = k;
        }
    }
    REQUIRE_FALSE(again_key.empty());
    auto r2 = run(ioc, st.async_claim({again_key, "fp", "me", 30'000ms}));
    REQUIRE_MESSAGE(r2.has_value(), r2.error().message());
    CHECK(r2->status == claim_status::acquired);
    CHECK(exists_on(cluster, to, st.redis_key(again_key)));
    st.stop();
    ioc.restart();
    ioc.run_for(100ms);
    // Put the slot back for the other tests.
    cluster.migrate_keys(slot, from, to);
    cluster.finish_migration(slot, to);
    cluster.begin_migration(slot, to, from);
    cluster.migrate_keys(slot, to, from);
    cluster.finish_migration(slot, from);
}

TEST_CASE("redis cluster store: the router alone: slot map from CLUSTER SHARDS, clients per "
          "master") {
    auto& cluster = shared_cluster();
    net::io_context ioc;
    redis::redis_cluster_options o;
    o.node.command_timeout = 2'000ms;
    o.node.connect_timeout = 2'000ms;
    o.node.health_check_interval = 60'000ms;
    // One seed is enough: the map names every master.
    const auto seed = cluster.nodes().back()->port();
    o.seeds.push_back({"127.0.0.1", seed});
    redis::redis_cluster router(ioc.get_executor(), o);
    router.start();
    const auto key = test::unique_key("cluster", "router");
    CHECK(run(ioc, router.async_wait_ready(key, 10s)));
    CHECK(router.ready());
    CHECK(router.refresh_count() >= 1);
    auto set = run(ioc, router.async_exec(key, {"SET", key, "v", "PX", "60000"}));
    REQUIRE_FALSE(set.ec);
    CHECK(set.reply.str == "OK");
    const auto port = cluster.master_of_slot(redis_key_slot(key));
    CHECK(cluster.cli(port, {"GET", key}).find('v') != std::string::npos);
    router.stop();
    ioc.restart();
    ioc.run_for(100ms);
}

namespace {

test::proxy_config cluster_proxy_config(unsigned short upstream_port,
                                        const std::vector<std::string>& nodes) {
    test::proxy_config c;
    c.upstream_port = upstream_port;
    std::string list;
    for (const auto& n : nodes) {
        list += (list.empty() ? "\"" : ", \"") + n + "\"";
    }
    c.store = {"type: redis",
               "redis:",
               "  cluster:",
               "    nodes: [" + list + "]",
               "  command_timeout: 1s",
               "  connect_timeout: 1s"};
    c.routes = "  - name: pay\n    match: { prefix: /v1/pay }\n    upstream: app\n"
               "    idempotency: { mode: required, on_store_error: fail_closed }\n";
    return c;
}

constexpr const char* payment_body = R"({"amount":100,"currency":"EUR"})";

test::http_response post(unsigned short port, const std::string& key) {
    return test::fetch(port, "POST", "/v1/pay",
                       {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                       payment_body);
}

} // namespace

TEST_CASE("redis cluster proxy: resharding under load loses and doubles nothing") {
    // A cluster of its own: this test moves a third of the slots around.
    test_cluster cluster;
    test::upstream_process up(2);
    test::proxy_process proxy(cluster_proxy_config(up.port, cluster.addresses()).yaml());
    test::wait_store_answering(proxy);

    struct sample {
        std::string key;
        test::http_response first;
        std::optional<test::http_response> again; // the same request sent once more
    };
    std::mutex mu;
    std::vector<sample> samples;
    std::atomic<bool> stop_load{false};
    std::atomic<int> transport_failures{0};
    auto load = [&](int id) {
        for (int i = 0; !stop_load.load() && i < 5'000; ++i) {
            sample s;
            s.key = test::unique_key("cluster-load", std::to_string(id));
            try {
                s.first = post(proxy.port, s.key);
                if (i % 2 == 0) {
                    s.again = post(proxy.port, s.key);
                }
            } catch (const std::exception&) {
                ++transport_failures;
                continue;
            }
            const std::lock_guard lock(mu);
            samples.push_back(std::move(s));
        }
    };
    std::vector<std::thread> clients;
    for (int id = 0; id < 3; ++id) {
        clients.emplace_back(load, id);
    }
    struct joiner {
        std::vector<std::thread>& ts;
        std::atomic<bool>& stop;
        ~joiner() {
            stop = true;
            for (auto& t : ts) {
                if (t.joinable()) {
                    t.join();
                }
            }
        }
    } join_load{clients, stop_load};

    // Two reshards of 1000 slots each (keys and all), while the clients keep going.
    test::wait_until(
        [&] {
            const std::lock_guard lock(mu);
            return samples.size() >= 10;
        },
        10s, "load before the reshards");
    const auto masters = cluster.master_ports();
    REQUIRE(masters.size() == 3);
    const auto reshard = [&](std::uint16_t from, std::uint16_t to) {
        // redis-cli refuses to reshard until every node agrees on the slot map, which the
        // previous reshard's last SETSLOT leaves to gossip (CI saw "Nodes don't agree about
        // configuration!" once).
        cluster.wait_until_stable();
        cluster.cli(from,
                    {"--cluster", "reshard", "127.0.0.1:" + std::to_string(from), "--cluster-from",
                     cluster.node_id(from), "--cluster-to", cluster.node_id(to), "--cluster-slots",
                     "1000", "--cluster-yes", "--cluster-pipeline", "10"});
    };
    reshard(masters[0], masters[1]);
    reshard(masters[1], masters[2]);
    std::size_t resharded_at = 0;
    {
        const std::lock_guard lock(mu);
        resharded_at = samples.size();
    }
    test::wait_until(
        [&] {
            const std::lock_guard lock(mu);
            return samples.size() >= resharded_at + 10;
        },
        10s, "load after the reshards");
    stop_load = true;
    for (auto& t : clients) {
        t.join();
    }
    cluster.wait_until_stable();

    const std::lock_guard lock(mu);
    CAPTURE(samples.size());
    REQUIRE(samples.size() > 50);
    CHECK(transport_failures.load() == 0);
    std::size_t stored = 0;
    std::size_t refused = 0;
    for (const auto& s : samples) {
        CAPTURE(s.key);
        CAPTURE(s.first.status);
        CAPTURE(s.first.body);
        const auto executed = up.count(s.key);
        // At most once, whatever happened.
        CHECK(executed <= 1);
        if (s.first.status == 200) {
            CHECK(s.first.header("Idempotency-Status") == "stored");
            CHECK(executed == 1);
            ++stored;
        } else {
            // fail_closed: a store error answers 503 and runs nothing.
            CHECK(s.first.status == 503);
            CHECK(test::json_member(s.first.body, "code") == "idempotency.store_unavailable");
            ++refused;
        }
        if (s.again && s.first.status == 200) {
            CHECK(s.again->status == 200);
            CHECK(s.again->header("Idempotency-Status") == "replayed");
            CHECK(s.again->body == s.first.body);
        }
    }
    MESSAGE("requests: " << samples.size() << ", stored: " << stored
                         << ", refused (store error): " << refused);
    // MOVED and ASK are followed, so a reshard alone costs no request.
    CHECK(refused == 0);

    // After the reshard every record is where the new map says, and replays.
    std::size_t checked = 0;
    for (const auto& s : samples) {
        if (s.first.status != 200 || ++checked > 60) {
            continue;
        }
        const auto r = post(proxy.port, s.key);
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Status") == "replayed");
        CHECK(r.body == s.first.body);
        CHECK(up.count(s.key) == 1);
    }
    CHECK(proxy.proc.running());
}
