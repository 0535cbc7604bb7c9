#pragma once
// The store contract suite (SPEC §5): one set of doctest test cases that every store backend must
// pass. It runs on memory_store in tests/unit/store (fake clock) and on redis_store in
// tests/integration (real redis-server, real time).
//
// How to run it against a backend:
//   1. Write a fixture type, default-constructible, one instance per test case:
//
//        struct my_fixture {
//            my_fixture();                                   // a ready store (fresh or shared)
//            onceproxy::store::store& store();               // the store under test
//            template <class T>
//            T run(boost::asio::awaitable<T> op);            // runs `op` to completion on an
//                                                            // io_context, bounded in time
//                                                            // (io_context::run_for); use
//                                                            // onceproxy::conformance::run_for
//            void advance(std::chrono::milliseconds d);      // lets `d` of store time pass:
//                                                            // fake clock, or a real sleep
//            std::string unique_key();                       // a key no other test case uses
//        };
//
//   2. In exactly one test translation unit:
//
//        #include "conformance/store_suite.hpp"
//        ONCEPROXY_STORE_SUITE(my_fixture);
//
// Leases and TTLs in the suite are a few hundred milliseconds with 100 ms margins, so a backend
// with real time (Redis PX expiry) can pass with `advance` = conformance::let_real_time_pass.
// A whole suite run lets about 3 s of store time pass in total.
//
// The contract checked here, beyond store.hpp:
//   - An expired lease or record is absent: a claim acquires it, with any fingerprint.
//   - complete/release/extend act only on a live in-flight lease held by `owner`; otherwise they
//     return fence_status::not_owner and change nothing. One exception: complete() by the owner of
//     a record that this owner already completed returns ok and keeps the stored payload (a
//     retried completion whose first reply was lost must not be reported as a lost lease).
//   - release/extend on a completed record return not_owner and leave the record as it is.
//   - Payloads are opaque bytes (NULs included) up to at least 1 MiB + a little.
//   - Concurrent claims on one free key: exactly one acquires, the others see in_flight.

#include <onceproxy/store/store.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace onceproxy::conformance {

using namespace std::chrono_literals;

/// `advance` for a backend on real time (Redis PX expiry): real time is the subject, the leases
/// and TTLs of the suite run out while the test waits.
inline void let_real_time_pass(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
}

/// Runs `op` on `ioc` until it finishes or `limit` passes; a timeout fails the test (REQUIRE).
/// Exceptions from `op` are rethrown. The io_context is restarted first, so it can be reused.
template <class T>
T run_for(boost::asio::io_context& ioc, boost::asio::awaitable<T> op,
          std::chrono::steady_clock::duration limit = 10s) {
    struct state {
        bool done = false;
        std::exception_ptr error;
        std::optional<T> value;
    };
    // Shared: if the limit passes first, a later run of the context may still finish `op`.
    auto st = std::make_shared<state>();
    boost::asio::co_spawn(ioc, std::move(op), [st](std::exception_ptr e, T v) {
        st->done = true;
        st->error = e;
        if (!e) {
            st->value.emplace(std::move(v));
        }
    });
    ioc.restart();
    ioc.run_for(limit);
    REQUIRE_MESSAGE(st->done, "store operation did not finish within the time limit");
    if (st->error) {
        std::rethrow_exception(st->error);
    }
    return std::move(*st->value);
}

inline void run_for(boost::asio::io_context& ioc, boost::asio::awaitable<void> op,
                    std::chrono::steady_clock::duration limit = 10s) {
    auto wrapped = [](boost::asio::awaitable<void> inner) -> boost::asio::awaitable<int> {
        co_await std::move(inner);
        co_return 0;
    };
    (void)run_for(ioc, wrapped(std::move(op)), limit);
}

/// Suite timings: short enough for real time, margins wide enough for a loaded machine.
inline constexpr store::duration suite_lease{300};
inline constexpr store::duration suite_ttl{600};
inline constexpr store::duration suite_margin{100};

/// A claim's strings, owned: a store::claim_request only views them, for as long as this lives.
struct owned_claim {
    std::string key;
    std::string fingerprint;
    std::string owner;
    store::duration lease = suite_lease;
    std::string holder{};
    operator store::claim_request() const { return {key, fingerprint, owner, lease, holder}; }
};

inline owned_claim make_claim(std::string key, std::string fingerprint, std::string owner,
                              store::duration lease = suite_lease) {
    return {std::move(key), std::move(fingerprint), std::move(owner), lease};
}

template <class Fixture>
store::claim_result claim(Fixture& f, const owned_claim& req) {
    auto r = f.run(f.store().async_claim(req));
    REQUIRE_MESSAGE(r.has_value(), "claim failed: " << r.error().message());
    return std::move(*r);
}

template <class Fixture>
store::fence_status complete(Fixture& f, const std::string& key, const std::string& owner,
                             std::string payload, store::duration ttl = suite_ttl,
                             store::record_kind kind = store::record_kind::kept) {
    auto r = f.run(f.store().async_complete(key, owner, std::move(payload), ttl, kind, {}));
    REQUIRE_MESSAGE(r.has_value(), "complete failed: " << r.error().message());
    return *r;
}

template <class Fixture>
store::fence_status release(Fixture& f, const std::string& key, const std::string& owner) {
    auto r = f.run(f.store().async_release(key, owner));
    REQUIRE_MESSAGE(r.has_value(), "release failed: " << r.error().message());
    return *r;
}

template <class Fixture>
store::fence_status extend(Fixture& f, const std::string& key, const std::string& owner,
                           store::duration lease = suite_lease) {
    auto r = f.run(f.store().async_extend(key, owner, lease));
    REQUIRE_MESSAGE(r.has_value(), "extend failed: " << r.error().message());
    return *r;
}

template <class Fixture>
store::key_info inspect(Fixture& f, const std::string& key) {
    auto r = f.run(f.store().async_inspect(key));
    REQUIRE_MESSAGE(r.has_value(), "inspect failed: " << r.error().message());
    return std::move(*r);
}

template <class Fixture>
store::purge_status purge(Fixture& f, const std::string& key, bool force) {
    auto r = f.run(f.store().async_purge(key, force));
    REQUIRE_MESSAGE(r.has_value(), "purge failed: " << r.error().message());
    return *r;
}

/// Claims `key` from `n` coroutines in flight at the same time, distinct owners, one fingerprint.
inline boost::asio::awaitable<std::vector<store::claim_status>>
claim_concurrently(store::store& s, std::string key, std::size_t n) {
    auto ex = co_await boost::asio::this_coro::executor;
    struct shared {
        explicit shared(boost::asio::any_io_executor e) : all_done(e) {}
        std::vector<store::claim_status> statuses;
        std::size_t finished = 0;
        std::size_t failed = 0;
        boost::asio::steady_timer all_done;
    };
    auto sh = std::make_shared<shared>(ex);
    sh->statuses.reserve(n);
    sh->all_done.expires_at(boost::asio::steady_timer::time_point::max());
    for (std::size_t i = 0; i < n; ++i) {
        auto one = [](store::store& st, std::shared_ptr<shared> state, std::string k,
                      std::size_t index, std::size_t total) -> boost::asio::awaitable<void> {
            const auto req =
                make_claim(std::move(k), "fp-concurrent", "owner-" + std::to_string(index));
            auto r = co_await st.async_claim(req);
            if (r) {
                state->statuses.push_back(r->status);
            } else {
                ++state->failed;
            }
            if (++state->finished == total) {
                state->all_done.cancel();
            }
        };
        boost::asio::co_spawn(ex, one(s, sh, key, i, n), boost::asio::detached);
    }
    // Children may finish inline (a synchronous store) or later (a networked one).
    while (sh->finished < n) {
        boost::system::error_code ec;
        co_await sh->all_done.async_wait(
            boost::asio::redirect_error(boost::asio::use_awaitable, ec));
    }
    REQUIRE(sh->failed == 0);
    co_return sh->statuses;
}

} // namespace onceproxy::conformance

// clang-format off
TEST_CASE_TEMPLATE_DEFINE("store: claim on a free key acquires it; a duplicate sees the lease",
                          Fixture, onceproxy_store_claim) {
    using namespace onceproxy;
    using conformance::suite_lease;
    Fixture f;
    const std::string key = f.unique_key();

    auto first = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a"));
    CHECK(first.status == store::claim_status::acquired);

    auto second = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-b"));
    CHECK(second.status == store::claim_status::in_flight);
    CHECK(second.remaining_lease > store::duration{0});
    CHECK(second.remaining_lease <= suite_lease);
    CHECK(second.record.empty());

    // Half the lease later the remaining lease has shrunk accordingly.
    f.advance(suite_lease / 2);
    auto third = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-c"));
    CHECK(third.status == store::claim_status::in_flight);
    CHECK(third.remaining_lease > store::duration{0});
    CHECK(third.remaining_lease <= suite_lease / 2);
}

TEST_CASE_TEMPLATE_DEFINE("store: a different fingerprint is a mismatch, in flight and completed",
                          Fixture, onceproxy_store_mismatch) {
    using namespace onceproxy;
    Fixture f;
    const std::string key = f.unique_key();

    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);
    auto in_flight = conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-b"));
    CHECK(in_flight.status == store::claim_status::mismatch);
    CHECK(in_flight.record.empty());

    REQUIRE(conformance::complete(f, key, "owner-a", "recorded") == store::fence_status::ok);
    auto done = conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-c"));
    CHECK(done.status == store::claim_status::mismatch);
    CHECK(done.record.empty());

    // The mismatching claims changed nothing: the owner's record is still replayed.
    auto same = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-d"));
    CHECK(same.status == store::claim_status::completed);
    CHECK(same.record == "recorded");
}

TEST_CASE_TEMPLATE_DEFINE("store: a completed record is returned byte for byte",
                          Fixture, onceproxy_store_payload) {
    using namespace onceproxy;
    Fixture f;

    SUBCASE("binary payload with NUL bytes") {
        const std::string key = f.unique_key();
        std::string payload("a\0b\0\0c\xff\x01\r\n", 10);
        REQUIRE(payload.size() == 10);
        REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp", "owner-a")).status ==
                store::claim_status::acquired);
        REQUIRE(conformance::complete(f, key, "owner-a", payload) == store::fence_status::ok);
        auto replay = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
        CHECK(replay.status == store::claim_status::completed);
        CHECK(replay.record == payload);
    }
    SUBCASE("1 MiB payload") {
        const std::string key = f.unique_key();
        std::string payload(std::size_t{1024 * 1024}, '\0');
        for (std::size_t i = 0; i < payload.size(); ++i) {
            payload[i] = static_cast<char>((i * 131U + 7U) & 0xffU);
        }
        REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp", "owner-a")).status ==
                store::claim_status::acquired);
        REQUIRE(conformance::complete(f, key, "owner-a", payload) == store::fence_status::ok);
        auto replay = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
        CHECK(replay.status == store::claim_status::completed);
        CHECK(replay.record.size() == payload.size());
        CHECK(replay.record == payload);
    }
    SUBCASE("empty payload") {
        const std::string key = f.unique_key();
        REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp", "owner-a")).status ==
                store::claim_status::acquired);
        REQUIRE(conformance::complete(f, key, "owner-a", "") == store::fence_status::ok);
        auto replay = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
        CHECK(replay.status == store::claim_status::completed);
        CHECK(replay.record.empty());
    }
}

TEST_CASE_TEMPLATE_DEFINE("store: a wrong owner can neither complete, release nor extend",
                          Fixture, onceproxy_store_wrong_owner) {
    using namespace onceproxy;
    using conformance::suite_lease;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp", "owner-a")).status ==
            store::claim_status::acquired);

    CHECK(conformance::complete(f, key, "owner-x", "intruder") == store::fence_status::not_owner);
    CHECK(conformance::release(f, key, "owner-x") == store::fence_status::not_owner);
    CHECK(conformance::extend(f, key, "owner-x", std::chrono::minutes(10)) ==
          store::fence_status::not_owner);

    // Still the same lease: in flight, not completed, not free, and not extended.
    auto seen = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
    CHECK(seen.status == store::claim_status::in_flight);
    CHECK(seen.remaining_lease <= suite_lease);

    // The real owner is unaffected.
    REQUIRE(conformance::complete(f, key, "owner-a", "mine") == store::fence_status::ok);
    auto replay = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == "mine");

    // A completed record is out of reach of fenced operations, the owner's included.
    CHECK(conformance::complete(f, key, "owner-x", "intruder") == store::fence_status::not_owner);
    CHECK(conformance::release(f, key, "owner-x") == store::fence_status::not_owner);
    CHECK(conformance::release(f, key, "owner-a") == store::fence_status::not_owner);
    CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::not_owner);
    // ... except a retried completion by its own owner, which is acknowledged and keeps the data.
    CHECK(conformance::complete(f, key, "owner-a", "second try") == store::fence_status::ok);
    auto after = conformance::claim(f, conformance::make_claim(key, "fp", "owner-c"));
    CHECK(after.status == store::claim_status::completed);
    CHECK(after.record == "mine");

    // Fenced operations on a key that was never claimed change nothing either.
    const std::string unknown = f.unique_key();
    CHECK(conformance::complete(f, unknown, "owner-a", "x") == store::fence_status::not_owner);
    CHECK(conformance::release(f, unknown, "owner-a") == store::fence_status::not_owner);
    CHECK(conformance::extend(f, unknown, "owner-a") == store::fence_status::not_owner);
    CHECK(conformance::claim(f, conformance::make_claim(unknown, "fp", "owner-b")).status ==
          store::claim_status::acquired);
}

TEST_CASE_TEMPLATE_DEFINE("store: release frees the key for the next claim",
                          Fixture, onceproxy_store_release) {
    using namespace onceproxy;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);
    CHECK(conformance::release(f, key, "owner-a") == store::fence_status::ok);
    // Released twice: the lease is gone.
    CHECK(conformance::release(f, key, "owner-a") == store::fence_status::not_owner);
    // Free: a new attempt acquires it, whatever its fingerprint.
    CHECK(conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-b")).status ==
          store::claim_status::acquired);
    CHECK(conformance::complete(f, key, "owner-a", "late") == store::fence_status::not_owner);
    CHECK(conformance::complete(f, key, "owner-b", "new") == store::fence_status::ok);
    auto replay = conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-c"));
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == "new");
}

TEST_CASE_TEMPLATE_DEFINE("store: an expired lease frees the key; the old owner is fenced off",
                          Fixture, onceproxy_store_lease_expiry) {
    using namespace onceproxy;
    using conformance::suite_lease;
    using conformance::suite_margin;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);
    f.advance(suite_lease + suite_margin);

    SUBCASE("the old owner's late operations on an expired, untaken lease") {
        CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::not_owner);
        CHECK(conformance::complete(f, key, "owner-a", "late") == store::fence_status::not_owner);
        CHECK(conformance::release(f, key, "owner-a") == store::fence_status::not_owner);
        // Nothing was resurrected: the key is free.
        CHECK(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-b")).status ==
              store::claim_status::acquired);
    }
    SUBCASE("a new owner takes over; the old owner cannot overwrite it") {
        // Free even for another fingerprint: the old lease no longer exists.
        REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-b")).status ==
                store::claim_status::acquired);
        CHECK(conformance::complete(f, key, "owner-a", "stale") == store::fence_status::not_owner);
        CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::not_owner);
        CHECK(conformance::release(f, key, "owner-a") == store::fence_status::not_owner);

        // The new lease is intact.
        auto seen = conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-c"));
        CHECK(seen.status == store::claim_status::in_flight);

        REQUIRE(conformance::complete(f, key, "owner-b", "fresh") == store::fence_status::ok);
        CHECK(conformance::complete(f, key, "owner-a", "stale") == store::fence_status::not_owner);
        auto replay = conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-c"));
        CHECK(replay.status == store::claim_status::completed);
        CHECK(replay.record == "fresh");
    }
}

TEST_CASE_TEMPLATE_DEFINE("store: extend pushes the lease expiry", Fixture,
                          onceproxy_store_extend) {
    using namespace onceproxy;
    using conformance::suite_lease;
    using conformance::suite_margin;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp", "owner-a")).status ==
            store::claim_status::acquired);

    // Two thirds into the lease, extend by a full lease: expiry moves to 2/3 + 1 lease.
    f.advance(suite_lease * 2 / 3);
    REQUIRE(conformance::extend(f, key, "owner-a") == store::fence_status::ok);
    // Past the original expiry, the lease still holds.
    f.advance(suite_lease / 3 + suite_margin);
    auto seen = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
    CHECK(seen.status == store::claim_status::in_flight);
    CHECK(seen.remaining_lease > store::duration{0});
    CHECK(seen.remaining_lease <= suite_lease - suite_margin);

    // The owner still holds it: a further extension and a completion work.
    CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::ok);
    CHECK(conformance::complete(f, key, "owner-a", "done") == store::fence_status::ok);
    auto replay = conformance::claim(f, conformance::make_claim(key, "fp", "owner-b"));
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == "done");
}

TEST_CASE_TEMPLATE_DEFINE("store: an extended lease still expires", Fixture,
                          onceproxy_store_extend_expiry) {
    using namespace onceproxy;
    using conformance::suite_lease;
    using conformance::suite_margin;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp", "owner-a")).status ==
            store::claim_status::acquired);
    f.advance(suite_lease / 3);
    REQUIRE(conformance::extend(f, key, "owner-a") == store::fence_status::ok);
    f.advance(suite_lease + suite_margin);
    CHECK(conformance::claim(f, conformance::make_claim(key, "fp", "owner-b")).status ==
          store::claim_status::acquired);
    CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::not_owner);
}

TEST_CASE_TEMPLATE_DEFINE("store: a record lives for its TTL, then the key is free", Fixture,
                          onceproxy_store_ttl) {
    using namespace onceproxy;
    using conformance::suite_margin;
    using conformance::suite_ttl;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);
    // The TTL counts from completion, not from the claim: complete late in the lease.
    f.advance(conformance::suite_lease - suite_margin);
    REQUIRE(conformance::complete(f, key, "owner-a", "rec") == store::fence_status::ok);

    f.advance(suite_ttl - suite_margin);
    auto replay = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-b"));
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == "rec");

    f.advance(suite_margin * 2);
    // Expired: free for any fingerprint, and the old owner's retried completion is refused.
    CHECK(conformance::complete(f, key, "owner-a", "rec") == store::fence_status::not_owner);
    CHECK(conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-c")).status ==
          store::claim_status::acquired);
}

TEST_CASE_TEMPLATE_DEFINE("store: concurrent claims on one key, exactly one acquires", Fixture,
                          onceproxy_store_concurrent) {
    using namespace onceproxy;
    Fixture f;
    const std::string key = f.unique_key();
    constexpr std::size_t n = 64;
    auto statuses = f.run(conformance::claim_concurrently(f.store(), key, n));
    REQUIRE(statuses.size() == n);
    std::size_t acquired = 0;
    std::size_t in_flight = 0;
    for (auto s : statuses) {
        acquired += s == store::claim_status::acquired ? 1U : 0U;
        in_flight += s == store::claim_status::in_flight ? 1U : 0U;
    }
    CHECK(acquired == 1);
    CHECK(in_flight == n - 1);
}

TEST_CASE_TEMPLATE_DEFINE("store: inspect reports absent, in flight and completed, changing nothing",
                          Fixture, onceproxy_store_inspect) {
    using namespace onceproxy;
    using conformance::suite_lease;
    using conformance::suite_ttl;
    Fixture f;
    const std::string key = f.unique_key();

    auto absent = conformance::inspect(f, key);
    CHECK(absent.state == store::key_state::absent);
    CHECK(absent.record.empty());
    // Looking did not create anything: the key is free.
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);

    f.advance(suite_lease / 2);
    auto leased = conformance::inspect(f, key);
    CHECK(leased.state == store::key_state::in_flight);
    CHECK(leased.remaining > store::duration{0});
    CHECK(leased.remaining <= suite_lease / 2);
    CHECK(leased.owner_age >= suite_lease / 2);
    CHECK(leased.owner_age < suite_lease + suite_lease);
    CHECK(leased.record.empty());
    // The lease is untouched: the owner still holds it.
    CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::ok);

    const std::string payload("rec\0orded", 10);
    REQUIRE(conformance::complete(f, key, "owner-a", payload) == store::fence_status::ok);
    auto done = conformance::inspect(f, key);
    CHECK(done.state == store::key_state::completed);
    CHECK(done.record == payload);
    CHECK(done.remaining > store::duration{0});
    CHECK(done.remaining <= suite_ttl);
    auto replay = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-b"));
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == payload);
}

TEST_CASE_TEMPLATE_DEFINE("store: purge deletes a record; the next claim executes again",
                          Fixture, onceproxy_store_purge) {
    using namespace onceproxy;
    Fixture f;
    const std::string key = f.unique_key();

    CHECK(conformance::purge(f, key, false) == store::purge_status::absent);
    CHECK(conformance::purge(f, key, true) == store::purge_status::absent);

    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);
    REQUIRE(conformance::complete(f, key, "owner-a", "first") == store::fence_status::ok);
    CHECK(conformance::purge(f, key, false) == store::purge_status::purged_record);
    CHECK(conformance::inspect(f, key).state == store::key_state::absent);
    CHECK(conformance::purge(f, key, false) == store::purge_status::absent);
    // A repeated completion by the old owner does not bring the record back.
    CHECK(conformance::complete(f, key, "owner-a", "first") == store::fence_status::not_owner);
    CHECK(conformance::inspect(f, key).state == store::key_state::absent);
    // Free for any fingerprint.
    CHECK(conformance::claim(f, conformance::make_claim(key, "fp-2", "owner-b")).status ==
          store::claim_status::acquired);
}

TEST_CASE_TEMPLATE_DEFINE("store: purge refuses a held lease unless forced; a forced purge fences "
                          "the owner", Fixture, onceproxy_store_purge_in_flight) {
    using namespace onceproxy;
    Fixture f;
    const std::string key = f.unique_key();
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-a")).status ==
            store::claim_status::acquired);

    CHECK(conformance::purge(f, key, false) == store::purge_status::in_flight);
    CHECK(conformance::inspect(f, key).state == store::key_state::in_flight);
    CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::ok);

    CHECK(conformance::purge(f, key, true) == store::purge_status::purged_lease);
    CHECK(conformance::inspect(f, key).state == store::key_state::absent);
    // The fenced owner's late operations fail and re-create nothing.
    CHECK(conformance::extend(f, key, "owner-a") == store::fence_status::not_owner);
    CHECK(conformance::complete(f, key, "owner-a", "late") == store::fence_status::not_owner);
    CHECK(conformance::release(f, key, "owner-a") == store::fence_status::not_owner);
    CHECK(conformance::inspect(f, key).state == store::key_state::absent);

    // A retry executes again; the fenced owner cannot overwrite its record either.
    REQUIRE(conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-b")).status ==
            store::claim_status::acquired);
    CHECK(conformance::complete(f, key, "owner-a", "late") == store::fence_status::not_owner);
    REQUIRE(conformance::complete(f, key, "owner-b", "second") == store::fence_status::ok);
    auto replay = conformance::claim(f, conformance::make_claim(key, "fp-1", "owner-c"));
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == "second");
}

TEST_CASE_TEMPLATE_DEFINE("store: a record of either kind, of any holder, replays alike", Fixture,
                          onceproxy_store_record_kind) {
    using namespace onceproxy;
    Fixture f;
    const std::string kept = f.unique_key();
    const std::string evictable = f.unique_key();
    auto c1 = conformance::make_claim(kept, "fp-1", "owner-a");
    c1.holder = "holder-1";
    auto c2 = conformance::make_claim(evictable, "fp-2", "owner-b");
    c2.holder = "holder-2";
    REQUIRE(conformance::claim(f, c1).status == store::claim_status::acquired);
    REQUIRE(conformance::claim(f, c2).status == store::claim_status::acquired);
    REQUIRE(conformance::complete(f, kept, "owner-a", "two hundred") == store::fence_status::ok);
    REQUIRE(conformance::complete(f, evictable, "owner-b", "four hundred",
                                  conformance::suite_ttl, store::record_kind::evictable) ==
            store::fence_status::ok);
    // Another holder's claim of the same key sees the same record: the holder is no scope.
    auto again = conformance::make_claim(evictable, "fp-2", "owner-c");
    again.holder = "holder-3";
    auto replay = conformance::claim(f, again);
    CHECK(replay.status == store::claim_status::completed);
    CHECK(replay.record == "four hundred");
    CHECK(conformance::claim(f, conformance::make_claim(kept, "fp-1", "owner-d")).record ==
          "two hundred");
    CHECK(conformance::inspect(f, evictable).state == store::key_state::completed);
}

TEST_CASE_TEMPLATE_DEFINE("store: ping answers", Fixture, onceproxy_store_ping) {
    Fixture f;
    auto r = f.run(f.store().async_ping());
    CHECK(r.has_value());
}
// clang-format on

/// Registers every store contract test case for `Fixture` (see the top of this file).
#define ONCEPROXY_STORE_SUITE(Fixture)                                                             \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_claim, Fixture);                                     \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_mismatch, Fixture);                                  \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_payload, Fixture);                                   \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_wrong_owner, Fixture);                               \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_release, Fixture);                                   \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_lease_expiry, Fixture);                              \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_extend, Fixture);                                    \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_extend_expiry, Fixture);                             \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_ttl, Fixture);                                       \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_concurrent, Fixture);                                \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_inspect, Fixture);                                   \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_purge, Fixture);                                     \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_purge_in_flight, Fixture);                           \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_record_kind, Fixture);                               \
    TEST_CASE_TEMPLATE_INVOKE(onceproxy_store_ping, Fixture)
