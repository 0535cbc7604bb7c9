#include <onceproxy/store/memory_store.hpp>

#include <onceproxy/store/error.hpp>

#include "conformance/store_suite.hpp"
#include "support/fake_clock.hpp"

#include <boost/asio/io_context.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using onceproxy::store::claim_status;
using onceproxy::store::errc;
using onceproxy::store::fence_status;
using onceproxy::store::memory_store;

/// Conformance fixture: a fresh memory store on a fake clock per test case.
class memory_fixture {
public:
    memory_fixture() : store_(64 * 1024 * 1024, 4 * 1024 * 1024, clock_.as_function()) {}

    onceproxy::store::store& store() { return store_; }

    template <class T>
    T run(boost::asio::awaitable<T> op) {
        return onceproxy::conformance::run_for(ioc_, std::move(op), 5s);
    }

    void advance(std::chrono::milliseconds d) { clock_.advance(d); }

    std::string unique_key() { return "key-" + std::to_string(++next_key_); }

private:
    onceproxy::test::fake_clock clock_;
    memory_store store_;
    boost::asio::io_context ioc_;
    int next_key_ = 0;
};

/// A claim's strings, owned: a claim_request only views them, for as long as this lives.
struct owned_request {
    std::string key;
    std::string owner;
    onceproxy::store::duration lease;
    std::string holder;
    operator onceproxy::store::claim_request() const { return {key, "fp", owner, lease, holder}; }
};

owned_request request(std::string key, std::string owner, onceproxy::store::duration lease = 1000ms,
                      std::string holder = {}) {
    return {std::move(key), std::move(owner), lease, std::move(holder)};
}

using onceproxy::store::key_state;
using onceproxy::store::record_kind;

/// Claims `key` for `holder` and completes it with an empty payload of `kind`.
void record(memory_store& s, const std::string& key, const std::string& holder, record_kind kind) {
    REQUIRE(s.claim(request(key, "owner-1", 1000ms, holder)).value().status ==
            claim_status::acquired);
    REQUIRE(s.complete(key, "owner-1", "", 10s, kind).value() == fence_status::ok);
}

} // namespace

ONCEPROXY_STORE_SUITE(memory_fixture);

TEST_CASE("memory_store: error codes name their failure") {
    boost::system::error_code ec = errc::store_full;
    CHECK(ec.category().name() == std::string("onceproxy.store"));
    CHECK(ec.message() == "store memory budget exhausted");
    CHECK(ec == errc::store_full);
    CHECK(ec != errc::timeout);
    CHECK(boost::system::error_code(errc::script_missing).message() == "store script missing");
}

TEST_CASE("memory_store: a full budget refuses new claims and never evicts live entries") {
    onceproxy::test::fake_clock clock;
    // Each lease costs key(5) + fp(2) + owner(7) + overhead; room for exactly three.
    const std::size_t lease_bytes = 5 + 2 + 7 + memory_store::entry_overhead;
    const std::size_t budget = 3 * lease_bytes + lease_bytes / 2;
    memory_store s(budget, budget, clock.as_function());

    REQUIRE(s.claim(request("key-1", "owner-1")).value().status == claim_status::acquired);
    REQUIRE(s.claim(request("key-2", "owner-2")).value().status == claim_status::acquired);
    REQUIRE(s.claim(request("key-3", "owner-3")).value().status == claim_status::acquired);
    CHECK(s.bytes_used() == 3 * lease_bytes);

    auto refused = s.claim(request("key-4", "owner-4"));
    REQUIRE(refused.has_error());
    CHECK(refused.error() == errc::store_full);
    CHECK(s.entry_count() == 3);

    // Existing keys still answer (no new bytes needed): the live leases are all there.
    CHECK(s.claim(request("key-1", "owner-9")).value().status == claim_status::in_flight);
    CHECK(s.claim(request("key-2", "owner-9")).value().status == claim_status::in_flight);
    CHECK(s.claim(request("key-3", "owner-9")).value().status == claim_status::in_flight);

    SUBCASE("released leases give their bytes back") {
        REQUIRE(s.release("key-2", "owner-2").value() == fence_status::ok);
        CHECK(s.bytes_used() == 2 * lease_bytes);
        CHECK(s.claim(request("key-4", "owner-4")).value().status == claim_status::acquired);
    }
    SUBCASE("expired leases are reclaimed when the budget is hit") {
        clock.advance(1001ms);
        // No operation touched the expired entries yet: they are still charged.
        CHECK(s.bytes_used() == 3 * lease_bytes);
        CHECK(s.claim(request("key-4", "owner-4")).value().status == claim_status::acquired);
        CHECK(s.claim(request("key-5", "owner-5")).value().status == claim_status::acquired);
        CHECK(s.claim(request("key-6", "owner-6")).value().status == claim_status::acquired);
        CHECK(s.entry_count() == 3);
        CHECK(s.bytes_used() == 3 * lease_bytes);
        CHECK(s.claim(request("key-7", "owner-7")).error() == errc::store_full);
    }
}

TEST_CASE("memory_store: a completion that does not fit is refused and keeps the lease") {
    onceproxy::test::fake_clock clock;
    const std::size_t lease_bytes = 5 + 2 + 7 + memory_store::entry_overhead;
    memory_store s(2 * lease_bytes + 100, 2 * lease_bytes + 100, clock.as_function());
    REQUIRE(s.claim(request("key-1", "owner-1")).value().status == claim_status::acquired);
    REQUIRE(s.claim(request("key-2", "owner-2")).value().status == claim_status::acquired);

    // 100 bytes of headroom: a 101-byte payload does not fit, a 100-byte one does.
    auto refused = s.complete("key-1", "owner-1", std::string(101, 'x'), 10s);
    REQUIRE(refused.has_error());
    CHECK(refused.error() == errc::store_full);
    auto still = s.claim(request("key-1", "owner-9")).value();
    CHECK(still.status == claim_status::in_flight);

    REQUIRE(s.complete("key-1", "owner-1", std::string(100, 'y'), 10s).value() == fence_status::ok);
    CHECK(s.bytes_used() == 2 * lease_bytes + 100);
    auto replay = s.claim(request("key-1", "owner-9")).value();
    CHECK(replay.status == claim_status::completed);
    CHECK(replay.record == std::string(100, 'y'));

    // The record outlives the other key's lease; the lease's expiry frees room again.
    clock.advance(1001ms);
    CHECK(s.complete("key-2", "owner-2", "late", 10s).value() == fence_status::not_owner);
    CHECK(s.bytes_used() == lease_bytes + 100);
    CHECK(s.claim(request("key-1", "owner-9")).value().status == claim_status::completed);
}

TEST_CASE("memory_store: expired entries are reaped incrementally by later operations") {
    onceproxy::test::fake_clock clock;
    memory_store s(64 * 1024 * 1024, 64 * 1024 * 1024, clock.as_function());
    constexpr int n = 200;
    for (int i = 0; i < n; ++i) {
        REQUIRE(s.claim(request("key-" + std::to_string(i), "o")).value().status ==
                claim_status::acquired);
    }
    REQUIRE(s.entry_count() == n);
    clock.advance(2s);
    // A handful of operations on unrelated keys: each reaps a bounded number per shard.
    const std::size_t before = s.entry_count();
    for (int i = 0; i < 20; ++i) {
        (void)s.release("other-" + std::to_string(i), "o");
    }
    const std::size_t after = s.entry_count();
    CHECK(after < before);
    CHECK(after >= before - 20 * memory_store::reap_per_operation);
    // An extended lease is not reaped by its stale heap item.
    REQUIRE(s.claim(request("kept", "o", 100ms)).value().status == claim_status::acquired);
    clock.advance(50ms);
    REQUIRE(s.extend("kept", "o", 10s).value() == fence_status::ok);
    clock.advance(100ms);
    s.sweep_expired();
    CHECK(s.entry_count() == 1);
    CHECK(s.claim(request("kept", "p")).value().status == claim_status::in_flight);
}

TEST_CASE("memory_store: concurrent claims from several threads, exactly one acquires") {
    onceproxy::test::fake_clock clock;
    memory_store s(64 * 1024 * 1024, 64 * 1024 * 1024, clock.as_function());
    constexpr int threads = 8;
    constexpr int keys = 200;
    std::vector<std::atomic<int>> acquired(keys);
    std::vector<std::atomic<int>> other(keys);
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            while (!go.load()) {
                std::this_thread::yield();
            }
            // Each thread runs coroutines on its own io_context, as a worker does.
            boost::asio::io_context ioc;
            for (int k = 0; k < keys; ++k) {
                auto r = onceproxy::conformance::run_for(
                    ioc,
                    s.async_claim(
                        request("key-" + std::to_string(k), "owner-" + std::to_string(t))),
                    5s);
                if (r && r->status == claim_status::acquired) {
                    ++acquired[static_cast<std::size_t>(k)];
                } else if (r && r->status == claim_status::in_flight) {
                    ++other[static_cast<std::size_t>(k)];
                }
            }
        });
    }
    go = true;
    for (auto& th : pool) {
        th.join();
    }
    for (std::size_t k = 0; k < keys; ++k) {
        CHECK(acquired[k].load() == 1);
        CHECK(other[k].load() == threads - 1);
    }
}

TEST_CASE("memory_store: a holder over its bound loses its oldest non-2xx records, then is "
          "refused alone") {
    onceproxy::test::fake_clock clock;
    // Every entry here costs key(5) + fp(2) + owner(7) + holder(2) + overhead.
    const std::size_t entry_bytes = 5 + 2 + 7 + 2 + memory_store::entry_overhead;
    memory_store s(100 * entry_bytes, 3 * entry_bytes, clock.as_function());

    SUBCASE("non-2xx records make room for the same holder, oldest first") {
        record(s, "akey1", "aa", record_kind::evictable);
        record(s, "akey2", "aa", record_kind::evictable);
        record(s, "akey3", "aa", record_kind::evictable);
        CHECK(s.holder_bytes("aa") == 3 * entry_bytes);
        REQUIRE(s.claim(request("akey4", "owner-1", 1000ms, "aa")).value().status ==
                claim_status::acquired);
        CHECK(s.evictions() == 1);
        CHECK(s.inspect("akey1").value().state == key_state::absent);
        CHECK(s.inspect("akey2").value().state == key_state::completed);
        CHECK(s.holder_bytes("aa") == 3 * entry_bytes);
        // Released, expired and evicted entries give the holder's bytes back.
        REQUIRE(s.release("akey4", "owner-1").value() == fence_status::ok);
        clock.advance(11s);
        s.sweep_expired();
        CHECK(s.holder_bytes("aa") == 0);
        CHECK(s.bytes_used() == 0);
    }
    SUBCASE("leases and 2xx records are never evicted: the holder is refused, others are not") {
        record(s, "akey1", "aa", record_kind::kept);
        record(s, "akey2", "aa", record_kind::kept);
        REQUIRE(s.claim(request("akey3", "owner-1", 1000ms, "aa")).value().status ==
                claim_status::acquired);
        auto refused = s.claim(request("akey4", "owner-1", 1000ms, "aa"));
        REQUIRE(refused.has_error());
        CHECK(refused.error() == errc::holder_full);
        CHECK(s.evictions() == 0);
        CHECK(s.claim(request("bkey1", "owner-1", 1000ms, "bb")).value().status ==
              claim_status::acquired);
        // A completion is charged to the holder without checking its bound (its lease did).
        CHECK(s.complete("akey3", "owner-1", "xyz", 10s, record_kind::kept).value() ==
              fence_status::ok);
        CHECK(s.holder_bytes("aa") == 3 * entry_bytes + 3);
    }
}

TEST_CASE("memory_store: a full store sweeps expired entries, then evicts the heaviest "
          "holder's oldest non-2xx records, never leases or 2xx records") {
    onceproxy::test::fake_clock clock;
    const std::size_t entry_bytes = 5 + 2 + 7 + 2 + memory_store::entry_overhead;
    memory_store s(6 * entry_bytes, 6 * entry_bytes, clock.as_function());
    record(s, "hkey1", "hh", record_kind::evictable);
    record(s, "hkey2", "hh", record_kind::evictable);
    record(s, "hkey3", "hh", record_kind::evictable);
    record(s, "lkey1", "ll", record_kind::evictable);
    record(s, "kkey1", "kk", record_kind::kept);
    REQUIRE(s.claim(request("kkey2", "owner-1", 1000ms, "kk")).value().status ==
            claim_status::acquired);
    REQUIRE(s.bytes_used() == 6 * entry_bytes);

    SUBCASE("expired entries go first") {
        clock.advance(1001ms); // the lease kkey2 has expired; the records have not
        CHECK(s.claim(request("nkey1", "owner-1", 1000ms, "nn")).value().status ==
              claim_status::acquired);
        CHECK(s.evictions() == 0);
        CHECK(s.inspect("hkey1").value().state == key_state::completed);
    }
    SUBCASE("then the heaviest holder's oldest non-2xx records, until only kept ones remain") {
        CHECK(s.claim(request("nkey1", "owner-1", 1000ms, "nn")).value().status ==
              claim_status::acquired);
        CHECK(s.inspect("hkey1").value().state == key_state::absent);
        CHECK(s.inspect("hkey2").value().state == key_state::completed);
        CHECK(s.inspect("lkey1").value().state == key_state::completed);
        CHECK(s.claim(request("nkey2", "owner-1", 1000ms, "nn")).value().status ==
              claim_status::acquired);
        CHECK(s.inspect("hkey2").value().state == key_state::absent);
        CHECK(s.claim(request("nkey3", "owner-1", 1000ms, "nn")).value().status ==
              claim_status::acquired);
        CHECK(s.claim(request("nkey4", "owner-1", 1000ms, "nn")).value().status ==
              claim_status::acquired);
        CHECK(s.evictions() == 4);
        CHECK(s.inspect("hkey3").value().state == key_state::absent);
        CHECK(s.inspect("lkey1").value().state == key_state::absent);
        // Only a 2xx record and leases are left: refused, and they all stay.
        auto refused = s.claim(request("nkey5", "owner-1", 1000ms, "nn"));
        REQUIRE(refused.has_error());
        CHECK(refused.error() == errc::store_full);
        CHECK(s.inspect("kkey1").value().state == key_state::completed);
        CHECK(s.inspect("kkey2").value().state == key_state::in_flight);
        CHECK(s.entry_count() == 6);
    }
    SUBCASE("a completion that does not fit evicts too") {
        REQUIRE(s.claim(request("kkey2", "owner-1", 1000ms, "kk")).value().status ==
                claim_status::in_flight);
        CHECK(s.complete("kkey2", "owner-1", std::string(10, 'x'), 10s).value() ==
              fence_status::ok);
        CHECK(s.evictions() == 1);
        CHECK(s.inspect("hkey1").value().state == key_state::absent);
    }
}

TEST_CASE("memory_store: one holder answering 400 to itself cannot shut others out") {
    onceproxy::test::fake_clock clock;
    memory_store s(64 * 1024, 4 * 1024, clock.as_function());
    for (int i = 0; i < 2000; ++i) {
        const std::string key = "spam-" + std::to_string(i);
        REQUIRE(s.claim(request(key, "owner-1", 1000ms, "a127.0.0.1")).value().status ==
                claim_status::acquired);
        REQUIRE(s.complete(key, "owner-1", std::string(100, 'e'), 24h, record_kind::evictable)
                    .value() == fence_status::ok);
    }
    CHECK(s.holder_bytes("a127.0.0.1") <= 4 * 1024);
    CHECK(s.claim(request("mine", "owner-1", 1000ms, "pother")).value().status ==
          claim_status::acquired);
    CHECK(s.complete("mine", "owner-1", "ok", 24h).value() == fence_status::ok);
    CHECK(s.claim(request("mine", "owner-2", 1000ms, "pother")).value().record == "ok");
}
