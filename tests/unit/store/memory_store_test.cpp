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
    memory_fixture() : store_(64 * 1024 * 1024, clock_.as_function()) {}

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

onceproxy::store::claim_request request(std::string key, std::string owner,
                                        onceproxy::store::duration lease = 1000ms) {
    return {std::move(key), "fp", std::move(owner), lease};
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
    memory_store s(3 * lease_bytes + lease_bytes / 2, clock.as_function());

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
    memory_store s(2 * lease_bytes + 100, clock.as_function());
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
    memory_store s(64 * 1024 * 1024, clock.as_function());
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
    memory_store s(64 * 1024 * 1024, clock.as_function());
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
