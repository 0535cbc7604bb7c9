#include <onceproxy/core/exchange_fsm.hpp>

#include "support/fake_clock.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <ostream>
#include <string>

namespace onceproxy::core {
// Readable failure messages (doctest finds these by argument-dependent lookup).
std::ostream& operator<<(std::ostream& os, action_kind k) {
    return os << to_string(k);
}
std::ostream& operator<<(std::ostream& os, state s) {
    return os << to_string(s);
}
std::ostream& operator<<(std::ostream& os, exchange_outcome o) {
    return os << to_string(o);
}
std::ostream& operator<<(std::ostream& os, observation o) {
    return os << to_string(o);
}
std::ostream& operator<<(std::ostream& os, problem_code c) {
    return os << to_string(c);
}
std::ostream& operator<<(std::ostream& os, idempotency_status s) {
    return os << (s == idempotency_status::none ? "none" : to_string(s));
}
std::ostream& operator<<(std::ostream& os, late_answer l) {
    return os << to_string(l);
}
std::ostream& operator<<(std::ostream& os, record_kind r) {
    return os << (r == record_kind::upstream_response ? "upstream_response"
                                                      : "outcome_unknown_problem");
}
} // namespace onceproxy::core

namespace {

using namespace std::chrono_literals;
using namespace onceproxy::core;
using onceproxy::config::concurrent_policy;
using onceproxy::config::idempotency_config;
using onceproxy::config::idempotency_mode;
using onceproxy::config::store_error_policy;
using onceproxy::config::uncertain_policy;
using std::chrono::seconds;

/// A required route with the product defaults of SPEC §4 (record 2xx-4xx, release 408, 425,
/// 429 and 5xx, lease 30 s, TTL 24 h, wait_timeout 10 s, max_record_bytes 1 MiB).
idempotency_config make_policy() {
    idempotency_config p;
    p.mode = idempotency_mode::required;
    for (unsigned s = 200; s < 500; ++s) {
        p.record.set(s);
    }
    p.release.set(408).set(425).set(429);
    for (unsigned s = 500; s < 600; ++s) {
        p.release.set(s);
    }
    return p;
}

const request_facts with_key{true, key_presence::present};

claim_event acquired() {
    return {claim_result_kind::acquired, 0ms, true};
}
claim_event in_flight(duration remaining) {
    return {claim_result_kind::in_flight, remaining, true};
}
claim_event completed(bool replayable = true) {
    return {claim_result_kind::completed, 0ms, replayable};
}
claim_event mismatch() {
    return {claim_result_kind::mismatch, 0ms, true};
}
claim_event claim_failed() {
    return {claim_result_kind::store_error, 0ms, true};
}

upstream_event response(unsigned status, std::size_t body_bytes = 10) {
    return {upstream_result::response, status, body_bytes};
}
upstream_event streaming(unsigned status, std::size_t body_bytes) {
    return {upstream_result::streaming, status, body_bytes};
}
upstream_event uncertain(upstream_result r) {
    return {r, 0, 0};
}

/// One exchange on a fake clock.
struct exchange {
    explicit exchange(idempotency_config p = make_policy(), exchange_timing t = {},
                      upstream_deadlines d = {})
        : policy(std::move(p)), fsm(policy, t, d) {}

    time_point now() const { return clock.now(); }
    void advance(std::chrono::steady_clock::duration d) { clock.advance(d); }

    /// start → claim → acquired → forward, at t0 (the claim is issued and answered at once).
    action start_and_acquire() {
        action a = fsm.start(with_key, now());
        REQUIRE(a.kind == action_kind::claim);
        a = fsm.on_claim(acquired(), now());
        REQUIRE(a.kind == action_kind::forward);
        return a;
    }

    onceproxy::test::fake_clock clock;
    idempotency_config policy;
    exchange_fsm fsm;
};

void check_done(exchange& x, exchange_outcome expected) {
    CHECK(x.fsm.current_state() == state::finished);
    REQUIRE(x.fsm.outcome().has_value());
    CHECK(*x.fsm.outcome() == expected);
}

void check_reject(const action& a, problem_code code, unsigned status, seconds retry_after = 0s,
                  idempotency_status header = idempotency_status::none) {
    CHECK(a.kind == action_kind::reject);
    CHECK(a.problem == code);
    CHECK(a.http_status == status);
    CHECK(a.retry_after == retry_after);
    CHECK(a.status_header == header);
}

} // namespace

TEST_CASE("exchange_fsm: which methods a route guards") {
    idempotency_config p = make_policy();
    CHECK(guards_method(p, "POST"));
    CHECK(guards_method(p, "PATCH"));
    CHECK_FALSE(guards_method(p, "PUT"));
    CHECK_FALSE(guards_method(p, "DELETE"));
    p.methods = {"POST", "PUT", "DELETE", "GET", "HEAD", "OPTIONS"};
    CHECK(guards_method(p, "PUT"));
    CHECK(guards_method(p, "DELETE"));
    // Safe methods are never guarded, even when listed.
    CHECK_FALSE(guards_method(p, "GET"));
    CHECK_FALSE(guards_method(p, "HEAD"));
    CHECK_FALSE(guards_method(p, "OPTIONS"));
    p.mode = idempotency_mode::off;
    CHECK_FALSE(guards_method(p, "POST"));
    p.mode = idempotency_mode::optional;
    CHECK(guards_method(p, "POST"));
}

TEST_CASE("exchange_fsm: requests that are not protected pass through") {
    SUBCASE("method or route not guarded") {
        exchange x;
        action a = x.fsm.start({false, key_presence::present}, x.now());
        CHECK(a.kind == action_kind::passthrough);
        CHECK(x.fsm.current_state() == state::answering);
        CHECK_FALSE(x.fsm.outcome().has_value());
        a = x.fsm.on_responded(x.now());
        CHECK(a.kind == action_kind::done);
        check_done(x, exchange_outcome::passthrough);
    }
    SUBCASE("route mode off") {
        idempotency_config p = make_policy();
        p.mode = idempotency_mode::off;
        exchange x(p);
        CHECK(x.fsm.start(with_key, x.now()).kind == action_kind::passthrough);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::passthrough);
    }
    SUBCASE("optional route without a key") {
        idempotency_config p = make_policy();
        p.mode = idempotency_mode::optional;
        exchange x(p);
        CHECK(x.fsm.start({true, key_presence::missing}, x.now()).kind == action_kind::passthrough);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::passthrough);
    }
}

TEST_CASE("exchange_fsm: missing and invalid keys are rejected without touching the store") {
    SUBCASE("required route, no key: 400 missing_key") {
        exchange x;
        action a = x.fsm.start({true, key_presence::missing}, x.now());
        check_reject(a, problem_code::missing_key, 400);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::missing_key);
    }
    SUBCASE("required route, malformed key: 400 invalid_key") {
        exchange x;
        check_reject(x.fsm.start({true, key_presence::invalid}, x.now()), problem_code::invalid_key,
                     400);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::invalid_key);
    }
    SUBCASE("optional route, malformed key: still 400 invalid_key") {
        idempotency_config p = make_policy();
        p.mode = idempotency_mode::optional;
        exchange x(p);
        check_reject(x.fsm.start({true, key_presence::invalid}, x.now()), problem_code::invalid_key,
                     400);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::invalid_key);
    }
}

TEST_CASE("exchange_fsm: first execution is claimed, forwarded, completed, answered stored") {
    exchange x;
    const time_point t0 = x.now();
    action a = x.fsm.start(with_key, t0);
    CHECK(a.kind == action_kind::claim);
    CHECK(a.lease == 30s);
    CHECK(x.fsm.current_state() == state::claiming);

    x.advance(2ms);
    a = x.fsm.on_claim(acquired(), x.now());
    CHECK(a.kind == action_kind::forward);
    // First extension a third into the lease, counted from when the claim was issued.
    CHECK(a.wake_at == t0 + 10s);
    CHECK(x.fsm.current_state() == state::forwarding);
    CHECK(x.fsm.lease_deadline() == t0 + 30s);

    x.advance(120ms);
    a = x.fsm.on_upstream(response(201, 512), x.now());
    CHECK(a.kind == action_kind::complete);
    CHECK(a.record == record_kind::upstream_response);
    CHECK(a.replayable);
    CHECK(a.ttl == x.policy.ttl);
    CHECK(x.fsm.current_state() == state::completing);

    a = x.fsm.on_complete(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::respond);
    CHECK(a.status_header == idempotency_status::stored);
    CHECK_FALSE(x.fsm.outcome().has_value());

    a = x.fsm.on_responded(x.now());
    CHECK(a.kind == action_kind::done);
    check_done(x, exchange_outcome::stored);
}

TEST_CASE("exchange_fsm: recorded 4xx answers are stored like successes") {
    for (unsigned status : {400U, 404U, 409U, 422U, 302U}) {
        CAPTURE(status);
        exchange x;
        x.start_and_acquire();
        action a = x.fsm.on_upstream(response(status), x.now());
        CHECK(a.kind == action_kind::complete);
        a = x.fsm.on_complete(fence_event::ok, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::stored);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::stored);
    }
}

TEST_CASE("exchange_fsm: a duplicate finds a record and replays it") {
    exchange x;
    x.fsm.start(with_key, x.now());
    action a = x.fsm.on_claim(completed(), x.now());
    CHECK(a.kind == action_kind::replay);
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::replayed);
}

TEST_CASE("exchange_fsm: a record that is not replayable answers 409, never a re-run") {
    exchange x;
    x.fsm.start(with_key, x.now());
    check_reject(x.fsm.on_claim(completed(false), x.now()), problem_code::response_not_replayable,
                 409);
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::not_replayable);
}

TEST_CASE("exchange_fsm: a different fingerprint is a mismatch, status from the config") {
    SUBCASE("default 422") {
        exchange x;
        x.fsm.start(with_key, x.now());
        check_reject(x.fsm.on_claim(mismatch(), x.now()), problem_code::payload_mismatch, 422);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::mismatch);
    }
    SUBCASE("configured 409") {
        idempotency_config p = make_policy();
        p.mismatch_status = 409;
        exchange x(p);
        x.fsm.start(with_key, x.now());
        check_reject(x.fsm.on_claim(mismatch(), x.now()), problem_code::payload_mismatch, 409);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::mismatch);
    }
}

TEST_CASE("exchange_fsm: concurrent conflict answers 409 with Retry-After from the lease") {
    struct row {
        duration remaining;
        seconds retry_after;
    };
    for (row r : {row{2500ms, 3s}, row{3000ms, 3s}, row{3001ms, 4s}, row{200ms, 1s}, row{1ms, 1s},
                  row{0ms, 1s}, row{30s, 30s}}) {
        CAPTURE(r.remaining.count());
        exchange x;
        x.fsm.start(with_key, x.now());
        check_reject(x.fsm.on_claim(in_flight(r.remaining), x.now()), problem_code::in_progress,
                     409, r.retry_after);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::in_progress);
    }
}

TEST_CASE("exchange_fsm: store error at claim follows on_store_error") {
    SUBCASE("fail_closed: 503 store_unavailable with Retry-After") {
        exchange x;
        x.fsm.start(with_key, x.now());
        check_reject(x.fsm.on_claim(claim_failed(), x.now()), problem_code::store_unavailable, 503,
                     1s);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::store_error);
    }
    SUBCASE("fail_open: forwarded unprotected, counted as a store error") {
        idempotency_config p = make_policy();
        p.on_store_error = store_error_policy::fail_open;
        exchange x(p);
        x.fsm.start(with_key, x.now());
        CHECK(x.fsm.on_claim(claim_failed(), x.now()).kind == action_kind::passthrough);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::store_error);
    }
    SUBCASE("fail_open never runs a waiting duplicate next to the attempt it saw in flight") {
        idempotency_config p = make_policy();
        p.on_store_error = store_error_policy::fail_open;
        p.concurrent = concurrent_policy::wait;
        exchange x(p);
        x.fsm.start(with_key, x.now());
        action a = x.fsm.on_claim(in_flight(20s), x.now());
        REQUIRE(a.kind == action_kind::wait_until);
        x.advance(a.wake_at - x.now());
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::claim);
        check_reject(x.fsm.on_claim(claim_failed(), x.now()), problem_code::store_unavailable, 503,
                     1s);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::store_error);
    }
    SUBCASE("the Retry-After of the 503 is a timing knob") {
        exchange_timing t;
        t.store_unavailable_retry_after = 5s;
        exchange x(make_policy(), t);
        x.fsm.start(with_key, x.now());
        CHECK(x.fsm.on_claim(claim_failed(), x.now()).retry_after == 5s);
    }
}

TEST_CASE("exchange_fsm: the lease is extended every lease/3 while forwarding") {
    exchange x;
    const time_point t0 = x.now();
    action a = x.start_and_acquire();
    REQUIRE(a.wake_at == t0 + 10s);

    // An early tick changes nothing.
    x.advance(9s);
    a = x.fsm.on_tick(x.now());
    CHECK(a.kind == action_kind::wait_until);
    CHECK(a.wake_at == t0 + 10s);
    CHECK(x.fsm.current_state() == state::forwarding);

    x.advance(1s);
    a = x.fsm.on_tick(x.now());
    CHECK(a.kind == action_kind::extend_lease);
    CHECK(a.lease == 30s);
    CHECK(x.fsm.current_state() == state::extending);

    // The answer takes 5 ms; the new schedule counts from when the extension was issued.
    x.advance(5ms);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::wait_until);
    CHECK(a.wake_at == t0 + 20s);
    CHECK(x.fsm.lease_deadline() == t0 + 40s);

    x.advance(10s - 5ms);
    a = x.fsm.on_tick(x.now());
    CHECK(a.kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    CHECK(a.wake_at == t0 + 30s);
    CHECK(x.fsm.lease_deadline() == t0 + 50s);

    // A late tick (the worker was busy) extends at once, and the schedule follows it.
    x.advance(12s);
    a = x.fsm.on_tick(x.now());
    CHECK(a.kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    CHECK(a.wake_at == t0 + 42s);
    CHECK(x.fsm.lease_deadline() == t0 + 62s);

    // The upstream answers in the end: recorded as usual.
    x.advance(1s);
    CHECK(x.fsm.on_upstream(response(200), x.now()).kind == action_kind::complete);
    CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::respond);
    x.fsm.on_responded(x.now());
    check_done(x, exchange_outcome::stored);
}

TEST_CASE("exchange_fsm: a failed extension is retried with backoff") {
    exchange x;
    const time_point t0 = x.now();
    x.start_and_acquire();
    x.advance(10s);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    action a = x.fsm.on_extend(fence_event::store_error, x.now());
    CHECK(a.kind == action_kind::wait_until);
    CHECK(a.wake_at == t0 + 10s + 50ms);
    CHECK(x.fsm.lease_deadline() == t0 + 30s);

    x.advance(50ms);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::store_error, x.now());
    CHECK(a.wake_at == t0 + 10s + 150ms);

    x.advance(100ms);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    CHECK(a.wake_at == t0 + 10s + 150ms + 10s);
    CHECK(x.fsm.lease_deadline() == t0 + 10s + 150ms + 30s);

    // After a success the backoff starts over.
    x.advance(10s);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::store_error, x.now());
    CHECK(a.wake_at == x.now() + 50ms);
}

TEST_CASE("exchange_fsm: the extension backoff is capped") {
    exchange x;
    x.start_and_acquire();
    x.advance(10s);
    duration expected = 50ms;
    for (int i = 0; i < 8; ++i) {
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
        action a = x.fsm.on_extend(fence_event::store_error, x.now());
        CHECK(a.wake_at - x.now() == expected);
        x.advance(a.wake_at - x.now());
        expected = std::min(expected * 2, duration{1000});
    }
    CHECK(expected == 1000ms);
}

TEST_CASE("exchange_fsm: a lost lease is never written to; the answer goes out unrecorded") {
    exchange x;
    x.start_and_acquire();
    x.advance(10s);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    action a = x.fsm.on_extend(fence_event::not_owner, x.now());
    CHECK(x.fsm.lease_lost());
    CHECK(a.kind == action_kind::wait_until);
    CHECK(a.wake_at == time_point::max());
    // No more extensions, however long the upstream takes.
    x.advance(60s);
    CHECK(x.fsm.on_tick(x.now()).wake_at == time_point::max());

    SUBCASE("recordable response") {
        a = x.fsm.on_upstream(response(200), x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::unrecorded);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::lease_lost);
    }
    SUBCASE("response that would be released") {
        a = x.fsm.on_upstream(response(503), x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::none);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::lease_lost);
    }
    SUBCASE("outcome unknown under hold: nothing left to hold, no Retry-After") {
        a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
        check_reject(a, problem_code::upstream_timeout, 504);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::lease_lost);
    }
}

TEST_CASE("exchange_fsm: lost lease with on_upstream_uncertain fail") {
    idempotency_config p = make_policy();
    p.on_upstream_uncertain = uncertain_policy::fail;
    exchange x(p);
    x.start_and_acquire();
    x.advance(10s);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    x.fsm.on_extend(fence_event::not_owner, x.now());
    action a = x.fsm.on_upstream(uncertain(upstream_result::reset), x.now());
    check_reject(a, problem_code::upstream_outcome_unknown, 502, 0s,
                 idempotency_status::unrecorded);
    x.fsm.on_responded(x.now());
    check_done(x, exchange_outcome::lease_lost);
}

TEST_CASE("exchange_fsm: completion refused by fencing is counted as a lost lease") {
    exchange x;
    x.start_and_acquire();
    REQUIRE(x.fsm.on_upstream(response(200), x.now()).kind == action_kind::complete);
    action a = x.fsm.on_complete(fence_event::not_owner, x.now());
    CHECK(a.kind == action_kind::respond);
    CHECK(a.status_header == idempotency_status::unrecorded);
    // No background retry: the key belongs to someone else.
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::lease_lost);
}

TEST_CASE("exchange_fsm: statuses in the release list free the key") {
    for (unsigned status : {500U, 502U, 503U, 408U, 425U, 429U}) {
        CAPTURE(status);
        exchange x;
        x.start_and_acquire();
        action a = x.fsm.on_upstream(response(status), x.now());
        CHECK(a.kind == action_kind::release);
        CHECK(x.fsm.current_state() == state::releasing);
        a = x.fsm.on_release(fence_event::ok, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::none);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::released);
    }
}

TEST_CASE("exchange_fsm: release wins over record; statuses in neither list are released") {
    idempotency_config p = make_policy();
    p.record.reset();
    for (unsigned s = 100; s < 600; ++s) {
        p.record.set(s);
    }
    p.release.reset();
    p.release.set(409);

    SUBCASE("in both lists") {
        exchange x(p);
        x.start_and_acquire();
        CHECK(x.fsm.on_upstream(response(409), x.now()).kind == action_kind::release);
    }
    SUBCASE("in the record list only") {
        exchange x(p);
        x.start_and_acquire();
        CHECK(x.fsm.on_upstream(response(503), x.now()).kind == action_kind::complete);
    }
    SUBCASE("in neither list") {
        idempotency_config only_2xx = make_policy();
        only_2xx.record.reset();
        for (unsigned s = 200; s < 300; ++s) {
            only_2xx.record.set(s);
        }
        exchange x(only_2xx);
        x.start_and_acquire();
        CHECK(x.fsm.on_upstream(response(404), x.now()).kind == action_kind::release);
    }
    SUBCASE("a status outside 100..599 is not recordable") {
        exchange x(p);
        x.start_and_acquire();
        CHECK(x.fsm.on_upstream(response(999), x.now()).kind == action_kind::release);
    }
}

TEST_CASE("exchange_fsm: a release that fails or is fenced still answers the client") {
    SUBCASE("not owner") {
        exchange x;
        x.start_and_acquire();
        x.fsm.on_upstream(response(500), x.now());
        action a = x.fsm.on_release(fence_event::not_owner, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::none);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::lease_lost);
    }
    SUBCASE("store error") {
        exchange x;
        x.start_and_acquire();
        x.fsm.on_upstream(response(500), x.now());
        action a = x.fsm.on_release(fence_event::store_error, x.now());
        CHECK(a.kind == action_kind::respond);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::store_error);
    }
}

TEST_CASE("exchange_fsm: a connect failure before sending always releases") {
    for (auto policy :
         {uncertain_policy::hold, uncertain_policy::release, uncertain_policy::fail}) {
        CAPTURE(static_cast<int>(policy));
        idempotency_config p = make_policy();
        p.on_upstream_uncertain = policy;
        exchange x(p);
        x.start_and_acquire();
        action a = x.fsm.on_upstream(uncertain(upstream_result::not_sent), x.now());
        CHECK(a.kind == action_kind::release);
        a = x.fsm.on_release(fence_event::ok, x.now());
        check_reject(a, problem_code::upstream_unavailable, 502);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::released);
    }
}

TEST_CASE("exchange_fsm: outcome unknown with hold keeps the lease") {
    exchange x;
    const time_point t0 = x.now();
    x.start_and_acquire();
    SUBCASE("timeout: 504 upstream.timeout, Retry-After = remaining lease") {
        x.advance(12'500ms);
        action a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
        // Lease ends at t0 + 30 s: 17.5 s left, rounded up.
        check_reject(a, problem_code::upstream_timeout, 504, 18s);
        CHECK(x.fsm.lease_deadline() == t0 + 30s);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::held);
    }
    SUBCASE("reset after sending: 502 upstream.unavailable") {
        x.advance(1s);
        action a = x.fsm.on_upstream(uncertain(upstream_result::reset), x.now());
        check_reject(a, problem_code::upstream_unavailable, 502, 29s);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::held);
    }
    SUBCASE("malformed answer after sending: 502 upstream.bad_response, still held") {
        // The request reached the upstream: the answer says so rather than "unreachable".
        x.advance(1s);
        action a = x.fsm.on_upstream(uncertain(upstream_result::bad_response), x.now());
        check_reject(a, problem_code::upstream_bad_response, 502, 29s);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::held);
    }
}

TEST_CASE("exchange_fsm: outcome unknown with release frees the key") {
    idempotency_config p = make_policy();
    p.on_upstream_uncertain = uncertain_policy::release;
    exchange x(p);
    x.start_and_acquire();
    action a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
    CHECK(a.kind == action_kind::release);
    a = x.fsm.on_release(fence_event::ok, x.now());
    check_reject(a, problem_code::upstream_timeout, 504);
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::released);
}

TEST_CASE("exchange_fsm: outcome unknown with fail records the 502 problem") {
    idempotency_config p = make_policy();
    p.on_upstream_uncertain = uncertain_policy::fail;
    exchange x(p);
    x.start_and_acquire();
    for (auto kind :
         {upstream_result::timed_out, upstream_result::reset, upstream_result::bad_response}) {
        CAPTURE(static_cast<int>(kind));
        exchange y(p);
        y.start_and_acquire();
        action a = y.fsm.on_upstream(uncertain(kind), y.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::outcome_unknown_problem);
        CHECK(a.replayable);
        CHECK(a.ttl == p.ttl);
        a = y.fsm.on_complete(fence_event::ok, y.now());
        // The first caller gets exactly what every retry will replay.
        check_reject(a, problem_code::upstream_outcome_unknown, 502, 0s,
                     idempotency_status::stored);
        CHECK(y.fsm.on_responded(y.now()).kind == action_kind::done);
        check_done(y, exchange_outcome::outcome_unknown);
    }
    SUBCASE("recording the problem fails: answered unrecorded, retried in the background") {
        action a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
        a = x.fsm.on_complete(fence_event::store_error, x.now());
        check_reject(a, problem_code::upstream_outcome_unknown, 502, 0s,
                     idempotency_status::unrecorded);
        a = x.fsm.on_responded(x.now());
        CHECK(a.kind == action_kind::wait_until);
        x.advance(a.wake_at - x.now());
        a = x.fsm.on_tick(x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::outcome_unknown_problem);
        CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::outcome_unknown);
    }
}

TEST_CASE("exchange_fsm: a response over max_record_bytes is answered and kept unreplayable") {
    idempotency_config p = make_policy();
    p.max_record_bytes = 1000;
    SUBCASE("one byte over") {
        exchange x(p);
        x.start_and_acquire();
        action a = x.fsm.on_upstream(response(200, 1001), x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::upstream_response);
        CHECK_FALSE(a.replayable);
        a = x.fsm.on_complete(fence_event::ok, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::stored);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::not_replayable);
    }
    SUBCASE("exactly the limit is replayable") {
        exchange x(p);
        x.start_and_acquire();
        action a = x.fsm.on_upstream(response(200, 1000), x.now());
        CHECK(a.replayable);
        x.fsm.on_complete(fence_event::ok, x.now());
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::stored);
    }
    SUBCASE("an oversized response that is not recordable is simply released") {
        exchange x(p);
        x.start_and_acquire();
        CHECK(x.fsm.on_upstream(response(500, 5000), x.now()).kind == action_kind::release);
    }
}

TEST_CASE("exchange_fsm: an answer too large to hold streams under the lease, then is kept "
          "unreplayable") {
    idempotency_config p = make_policy();
    p.max_record_bytes = 1000;
    exchange x(p);
    const time_point t0 = x.now();
    x.start_and_acquire();
    x.advance(1s);
    action a = x.fsm.on_upstream(streaming(200, 1001), x.now());
    CHECK(a.kind == action_kind::stream);
    // The head goes out before the record exists: it says what a first execution says.
    CHECK(a.status_header == idempotency_status::stored);
    CHECK(a.wake_at == t0 + 10s);
    CHECK(x.fsm.current_state() == state::forwarding);

    // A long body: the lease is still extended while it streams.
    x.advance(9s);
    a = x.fsm.on_tick(x.now());
    CHECK(a.kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::wait_until);
    CHECK(x.fsm.lease_deadline() == t0 + 40s);

    SUBCASE("the body ends: completed as not replayable, the answer already went out") {
        a = x.fsm.on_upstream(response(200, 5'000'000), x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::upstream_response);
        CHECK_FALSE(a.replayable);
        a = x.fsm.on_complete(fence_event::ok, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::not_replayable);
    }
    SUBCASE("the client hangs up mid-body: the record is completed all the same") {
        x.fsm.on_client_gone();
        a = x.fsm.on_upstream(response(200, 2000), x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK_FALSE(a.replayable);
        CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::not_replayable);
    }
    SUBCASE("the completion fails: retried in the background like an unrecorded answer") {
        REQUIRE(x.fsm.on_upstream(response(200, 2000), x.now()).kind == action_kind::complete);
        a = x.fsm.on_complete(fence_event::store_error, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::unrecorded);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::wait_until);
    }
    SUBCASE("the body breaks off: an unknown outcome, held by default") {
        a = x.fsm.on_upstream(uncertain(upstream_result::reset), x.now());
        CHECK(a.kind == action_kind::reject);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::held);
    }
}

TEST_CASE("exchange_fsm: a streamed answer whose body breaks follows on_upstream_uncertain") {
    idempotency_config p = make_policy();
    p.max_record_bytes = 1000;
    SUBCASE("fail records the 502 problem") {
        p.on_upstream_uncertain = uncertain_policy::fail;
        exchange x(p);
        x.start_and_acquire();
        REQUIRE(x.fsm.on_upstream(streaming(200, 1001), x.now()).kind == action_kind::stream);
        action a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::outcome_unknown_problem);
        x.fsm.on_complete(fence_event::ok, x.now());
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::outcome_unknown);
    }
    SUBCASE("release frees the key") {
        p.on_upstream_uncertain = uncertain_policy::release;
        exchange x(p);
        x.start_and_acquire();
        REQUIRE(x.fsm.on_upstream(streaming(201, 1001), x.now()).kind == action_kind::stream);
        CHECK(x.fsm.on_upstream(uncertain(upstream_result::bad_response), x.now()).kind ==
              action_kind::release);
        x.fsm.on_release(fence_event::ok, x.now());
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::released);
    }
}

TEST_CASE("exchange_fsm: a streaming answer that is not recorded is released, then passed on") {
    idempotency_config p = make_policy();
    p.max_record_bytes = 1000;
    SUBCASE("a status in the release list") {
        exchange x(p);
        x.start_and_acquire();
        action a = x.fsm.on_upstream(streaming(503, 1001), x.now());
        CHECK(a.kind == action_kind::release);
        a = x.fsm.on_release(fence_event::ok, x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::none);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::released);
    }
    SUBCASE("the lease was lost: passed on unrecorded, the key untouched") {
        exchange x(p);
        x.start_and_acquire();
        x.advance(10s);
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
        x.fsm.on_extend(fence_event::not_owner, x.now());
        action a = x.fsm.on_upstream(streaming(200, 1001), x.now());
        CHECK(a.kind == action_kind::respond);
        CHECK(a.status_header == idempotency_status::unrecorded);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::lease_lost);
    }
}

TEST_CASE("exchange_fsm: a refused completion is answered unrecorded and retried until the "
          "lease ends") {
    exchange x;
    const time_point t0 = x.now();
    x.start_and_acquire();
    x.advance(1s);
    REQUIRE(x.fsm.on_upstream(response(201), x.now()).kind == action_kind::complete);
    action a = x.fsm.on_complete(fence_event::store_error, x.now());
    CHECK(a.kind == action_kind::respond);
    CHECK(a.status_header == idempotency_status::unrecorded);
    CHECK_FALSE(x.fsm.outcome().has_value());

    a = x.fsm.on_responded(x.now());
    CHECK(a.kind == action_kind::wait_until);
    CHECK(a.wake_at == t0 + 1s + 50ms);
    CHECK(x.fsm.current_state() == state::retry_wait);

    SUBCASE("an early tick waits on") {
        x.advance(10ms);
        a = x.fsm.on_tick(x.now());
        CHECK(a.kind == action_kind::wait_until);
        CHECK(a.wake_at == t0 + 1s + 50ms);
    }
    SUBCASE("the retry succeeds: the record exists after all") {
        x.advance(50ms);
        a = x.fsm.on_tick(x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.replayable);
        CHECK(a.ttl == x.policy.ttl);
        a = x.fsm.on_complete(fence_event::ok, x.now());
        // The client was answered already: nothing more to say.
        CHECK(a.kind == action_kind::done);
        check_done(x, exchange_outcome::stored);
    }
    SUBCASE("the lease was taken over meanwhile") {
        x.advance(50ms);
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::complete);
        CHECK(x.fsm.on_complete(fence_event::not_owner, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::lease_lost);
    }
    SUBCASE("every retry fails: backoff doubles to 1 s and stops before the lease ends") {
        std::vector<duration> delays;
        time_point last_attempt = x.now();
        int attempts = 0;
        while (a.kind == action_kind::wait_until && attempts < 100) {
            delays.push_back(std::chrono::duration_cast<duration>(a.wake_at - x.now()));
            x.advance(a.wake_at - x.now());
            a = x.fsm.on_tick(x.now());
            REQUIRE(a.kind == action_kind::complete);
            ++attempts;
            last_attempt = x.now();
            a = x.fsm.on_complete(fence_event::store_error, x.now());
        }
        CHECK(a.kind == action_kind::done);
        check_done(x, exchange_outcome::record_failed);
        REQUIRE(delays.size() >= 6);
        CHECK(delays[0] == 50ms);
        CHECK(delays[1] == 100ms);
        CHECK(delays[2] == 200ms);
        CHECK(delays[3] == 400ms);
        CHECK(delays[4] == 800ms);
        CHECK(delays[5] == 1000ms);
        CHECK(delays.back() == 1000ms);
        // Never retried past the lease end, and kept going until the last second of it.
        CHECK(last_attempt < t0 + 30s);
        CHECK(last_attempt >= t0 + 28s);
    }
}

TEST_CASE("exchange_fsm: a completion retry due after the lease end gives up") {
    exchange x;
    x.start_and_acquire();
    x.advance(29'960ms); // 40 ms of lease left, the first retry would be 50 ms away
    REQUIRE(x.fsm.on_upstream(response(200), x.now()).kind == action_kind::complete);
    x.fsm.on_complete(fence_event::store_error, x.now());
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::record_failed);
}

TEST_CASE("exchange_fsm: the client goes away while the upstream call runs") {
    SUBCASE("the response is still recorded, nobody is answered") {
        exchange x;
        x.start_and_acquire();
        x.fsm.on_client_gone();
        CHECK(x.fsm.client_gone());
        REQUIRE(x.fsm.on_upstream(response(200), x.now()).kind == action_kind::complete);
        CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::stored);
    }
    SUBCASE("a release still happens") {
        exchange x;
        x.start_and_acquire();
        x.fsm.on_client_gone();
        REQUIRE(x.fsm.on_upstream(response(503), x.now()).kind == action_kind::release);
        CHECK(x.fsm.on_release(fence_event::ok, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::released);
    }
    SUBCASE("a failed completion goes straight to the background retry") {
        exchange x;
        x.start_and_acquire();
        x.fsm.on_client_gone();
        REQUIRE(x.fsm.on_upstream(response(200), x.now()).kind == action_kind::complete);
        action a = x.fsm.on_complete(fence_event::store_error, x.now());
        CHECK(a.kind == action_kind::wait_until);
        x.advance(50ms);
        CHECK(x.fsm.on_tick(x.now()).kind == action_kind::complete);
        CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::stored);
    }
    SUBCASE("lease extension goes on") {
        exchange x;
        x.start_and_acquire();
        x.fsm.on_client_gone();
        x.advance(10s);
        CHECK(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    }
}

TEST_CASE("exchange_fsm: concurrent wait re-claims with bounded backoff and replays") {
    idempotency_config p = make_policy();
    p.concurrent = concurrent_policy::wait;
    exchange x(p);
    const time_point t0 = x.now();
    x.fsm.start(with_key, x.now());

    std::vector<duration> delays;
    action a = x.fsm.on_claim(in_flight(20s), x.now());
    for (int i = 0; i < 7; ++i) {
        REQUIRE(a.kind == action_kind::wait_until);
        CHECK(x.fsm.current_state() == state::waiting);
        delays.push_back(std::chrono::duration_cast<duration>(a.wake_at - x.now()));
        x.advance(a.wake_at - x.now());
        a = x.fsm.on_tick(x.now());
        REQUIRE(a.kind == action_kind::claim);
        CHECK(a.lease == p.lease);
        a = x.fsm.on_claim(in_flight(20s), x.now());
    }
    CHECK(delays == std::vector<duration>{10ms, 20ms, 40ms, 80ms, 160ms, 250ms, 250ms});
    CHECK(x.now() == t0 + 810ms);

    SUBCASE("the first attempt completes: replay") {
        x.advance(a.wake_at - x.now());
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::claim);
        CHECK(x.fsm.on_claim(completed(), x.now()).kind == action_kind::replay);
        CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::replayed);
    }
    SUBCASE("the first attempt was released: this one executes") {
        x.advance(a.wake_at - x.now());
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::claim);
        const time_point claimed_at = x.now();
        a = x.fsm.on_claim(acquired(), x.now());
        CHECK(a.kind == action_kind::forward);
        CHECK(a.wake_at == claimed_at + 10s);
        CHECK(x.fsm.lease_deadline() == claimed_at + 30s);
        CHECK(x.fsm.on_upstream(response(200), x.now()).kind == action_kind::complete);
        CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::respond);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::stored);
    }
    SUBCASE("the record is not replayable: 409") {
        x.advance(a.wake_at - x.now());
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::claim);
        check_reject(x.fsm.on_claim(completed(false), x.now()),
                     problem_code::response_not_replayable, 409);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::not_replayable);
    }
    SUBCASE("the store fails during the wait: on_store_error applies") {
        x.advance(a.wake_at - x.now());
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::claim);
        check_reject(x.fsm.on_claim(claim_failed(), x.now()), problem_code::store_unavailable, 503,
                     1s);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::store_error);
    }
    SUBCASE("the client leaves: the wait stops at the next tick") {
        x.fsm.on_client_gone();
        x.advance(a.wake_at - x.now());
        CHECK(x.fsm.on_tick(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::in_progress);
    }
    SUBCASE("an early tick does not claim") {
        a = x.fsm.on_tick(x.now());
        CHECK(a.kind == action_kind::wait_until);
        CHECK(x.fsm.current_state() == state::waiting);
    }
}

TEST_CASE("exchange_fsm: concurrent wait gives up at wait_timeout with 409") {
    idempotency_config p = make_policy();
    p.concurrent = concurrent_policy::wait;
    p.wait_timeout = 1s;
    exchange x(p);
    const time_point t0 = x.now();
    x.fsm.start(with_key, x.now());
    action a = x.fsm.on_claim(in_flight(25s), x.now());
    int claims = 1;
    while (a.kind == action_kind::wait_until && claims < 100) {
        CHECK(a.wake_at <= t0 + 1s);
        x.advance(a.wake_at - x.now());
        a = x.fsm.on_tick(x.now());
        REQUIRE(a.kind == action_kind::claim);
        ++claims;
        a = x.fsm.on_claim(in_flight(std::chrono::duration_cast<duration>(25s - (x.now() - t0))),
                           x.now());
    }
    // One last claim exactly at the deadline, then 409 with the other lease's remaining time.
    CHECK(x.now() == t0 + 1s);
    check_reject(a, problem_code::in_progress, 409, 24s);
    CHECK(claims == 9); // 0, 10, 30, 70, 150, 310, 560, 810, 1000 ms
    x.fsm.on_responded(x.now());
    check_done(x, exchange_outcome::in_progress);
}

TEST_CASE("exchange_fsm: concurrent wait re-claims as soon as the other lease lapses") {
    idempotency_config p = make_policy();
    p.concurrent = concurrent_policy::wait;
    exchange x(p);
    x.fsm.start(with_key, x.now());
    x.advance(300ms);
    action a = x.fsm.on_claim(in_flight(4ms), x.now());
    CHECK(a.wake_at == x.now() + 4ms);
    x.advance(4ms);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::claim);
    CHECK(x.fsm.on_claim(acquired(), x.now()).kind == action_kind::forward);
}

TEST_CASE("exchange_fsm: problem codes and names are stable") {
    CHECK(to_string(problem_code::missing_key) == "idempotency.missing_key");
    CHECK(to_string(problem_code::invalid_key) == "idempotency.invalid_key");
    CHECK(to_string(problem_code::payload_mismatch) == "idempotency.payload_mismatch");
    CHECK(to_string(problem_code::in_progress) == "idempotency.in_progress");
    CHECK(to_string(problem_code::store_unavailable) == "idempotency.store_unavailable");
    CHECK(to_string(problem_code::response_not_replayable) ==
          "idempotency.response_not_replayable");
    CHECK(to_string(problem_code::upstream_unavailable) == "upstream.unavailable");
    CHECK(to_string(problem_code::upstream_timeout) == "upstream.timeout");
    CHECK(to_string(problem_code::upstream_outcome_unknown) == "upstream.outcome_unknown");
    CHECK(to_string(idempotency_status::stored) == "stored");
    CHECK(to_string(idempotency_status::unrecorded) == "unrecorded");
    CHECK(to_string(exchange_outcome::record_failed) == "record_failed");
    CHECK(to_string(exchange_outcome::lease_lost) == "lease_lost");
    CHECK(to_string(action_kind::extend_lease) == "extend_lease");
    CHECK(to_string(state::retry_wait) == "retry_wait");
}

// --- observe mode (issue 13): decide as `required`, act as plain proxying ---------------------

namespace {

idempotency_config observe_policy() {
    idempotency_config p = make_policy();
    p.mode = idempotency_mode::observe;
    return p;
}

/// A passthrough instead of what enforcement would have done, the store left untouched.
void check_observed_passthrough(exchange& x, action a, observation would) {
    CHECK(a.kind == action_kind::passthrough);
    CHECK(a.status_header == idempotency_status::none);
    REQUIRE(x.fsm.observed().has_value());
    CHECK(*x.fsm.observed() == would);
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::passthrough);
}

} // namespace

TEST_CASE("exchange_fsm: observe mode guards the route's methods like required") {
    idempotency_config p = observe_policy();
    CHECK(guards_method(p, "POST"));
    CHECK(guards_method(p, "PATCH"));
    CHECK_FALSE(guards_method(p, "GET"));
}

TEST_CASE("exchange_fsm: observe mode records a first execution as required does, without "
          "Idempotency-Status") {
    exchange x(observe_policy());
    const time_point t0 = x.now();
    action a = x.fsm.start(with_key, t0);
    REQUIRE(a.kind == action_kind::claim);
    CHECK(a.lease == 30s);
    a = x.fsm.on_claim(acquired(), x.now());
    REQUIRE(a.kind == action_kind::forward);
    CHECK(a.wake_at == t0 + 10s);
    // The lease is extended while the upstream works, as on a required route.
    x.advance(10s);
    a = x.fsm.on_tick(x.now());
    REQUIRE(a.kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    REQUIRE(a.kind == action_kind::wait_until);
    a = x.fsm.on_upstream(response(201, 512), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK(a.replayable);
    CHECK(a.ttl == x.policy.ttl);
    a = x.fsm.on_complete(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::respond);
    CHECK(a.status_header == idempotency_status::none);
    CHECK_FALSE(x.fsm.observed().has_value());
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::stored);
}

TEST_CASE("exchange_fsm: observe mode releases what required releases") {
    exchange x(observe_policy());
    x.start_and_acquire();
    action a = x.fsm.on_upstream(response(503), x.now());
    REQUIRE(a.kind == action_kind::release);
    a = x.fsm.on_release(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::respond);
    CHECK(a.status_header == idempotency_status::none);
    x.fsm.on_responded(x.now());
    check_done(x, exchange_outcome::released);
    CHECK_FALSE(x.fsm.observed().has_value());
}

TEST_CASE("exchange_fsm: observe mode forwards where required would replay, reject or wait") {
    SUBCASE("a completed record: would replay") {
        exchange x(observe_policy());
        REQUIRE(x.fsm.start(with_key, x.now()).kind == action_kind::claim);
        check_observed_passthrough(x, x.fsm.on_claim(completed(), x.now()), observation::replay);
    }
    SUBCASE("a record kept without its body: would answer 409 not_replayable") {
        exchange x(observe_policy());
        x.fsm.start(with_key, x.now());
        check_observed_passthrough(x, x.fsm.on_claim(completed(false), x.now()),
                                   observation::not_replayable);
    }
    SUBCASE("the key in flight: would answer 409 in_progress") {
        exchange x(observe_policy());
        x.fsm.start(with_key, x.now());
        check_observed_passthrough(x, x.fsm.on_claim(in_flight(20s), x.now()),
                                   observation::conflict);
    }
    SUBCASE("the key in flight with concurrent: wait: never waits") {
        idempotency_config p = observe_policy();
        p.concurrent = concurrent_policy::wait;
        exchange x(p);
        x.fsm.start(with_key, x.now());
        check_observed_passthrough(x, x.fsm.on_claim(in_flight(20s), x.now()),
                                   observation::conflict);
    }
    SUBCASE("another fingerprint: would answer 422") {
        exchange x(observe_policy());
        x.fsm.start(with_key, x.now());
        check_observed_passthrough(x, x.fsm.on_claim(mismatch(), x.now()), observation::mismatch);
    }
    SUBCASE("no key: would answer 400 missing_key; the store is not asked") {
        exchange x(observe_policy());
        check_observed_passthrough(x, x.fsm.start({true, key_presence::missing}, x.now()),
                                   observation::missing_key);
    }
    SUBCASE("a malformed key: would answer 400 invalid_key; the store is not asked") {
        exchange x(observe_policy());
        check_observed_passthrough(x, x.fsm.start({true, key_presence::invalid}, x.now()),
                                   observation::invalid_key);
    }
}

TEST_CASE("exchange_fsm: observe mode never fails closed on a store error") {
    idempotency_config p = observe_policy();
    p.on_store_error = store_error_policy::fail_closed;
    exchange x(p);
    x.fsm.start(with_key, x.now());
    action a = x.fsm.on_claim(claim_failed(), x.now());
    CHECK(a.kind == action_kind::passthrough);
    CHECK_FALSE(x.fsm.observed().has_value()); // nothing enforcement would have done differently
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::store_error);
}

TEST_CASE("exchange_fsm: observe mode streams an answer too large to hold without "
          "Idempotency-Status") {
    exchange x(observe_policy());
    x.start_and_acquire();
    action a = x.fsm.on_upstream(streaming(200, 2 << 20), x.now());
    REQUIRE(a.kind == action_kind::stream);
    CHECK(a.status_header == idempotency_status::none);
    a = x.fsm.on_upstream(response(200, 5 << 20), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK_FALSE(a.replayable);
    a = x.fsm.on_complete(fence_event::ok, x.now());
    CHECK(a.status_header == idempotency_status::none);
    x.fsm.on_responded(x.now());
    check_done(x, exchange_outcome::not_replayable);
}

TEST_CASE("exchange_fsm: observe mode keeps on_upstream_uncertain: hold's lease") {
    exchange x(observe_policy());
    x.start_and_acquire();
    action a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
    check_reject(a, problem_code::upstream_timeout, 504, 30s);
    x.fsm.on_responded(x.now());
    check_done(x, exchange_outcome::held);
    CHECK_FALSE(x.fsm.observed().has_value());
}

TEST_CASE("exchange_fsm: other modes never report an observation") {
    for (auto mode : {idempotency_mode::required, idempotency_mode::optional}) {
        idempotency_config p = make_policy();
        p.mode = mode;
        exchange x(p);
        x.fsm.start(with_key, x.now());
        x.fsm.on_claim(completed(), x.now());
        x.fsm.on_responded(x.now());
        CHECK_FALSE(x.fsm.observed().has_value());
    }
}

// --- Late answers (issue 26): timeout 3 s, late_answer_timeout 15 s, lease 30 s ------------------

namespace {

/// A late-answer exchange past its 504: forwarded at t0, overdue at t0 + 3 s, the 504 answered.
struct late_exchange : exchange {
    explicit late_exchange(idempotency_config p = make_policy())
        : exchange(std::move(p), {}, upstream_deadlines{3s, 15s}) {
        t0 = now();
        const action fwd = start_and_acquire();
        // The first wake-up is the upstream timeout, before the first extension (t0 + 10 s).
        CHECK(fwd.wake_at == t0 + 3s);
        advance(3s);
        const action a = fsm.on_tick(now());
        // The client gets the 504 it always got, Retry-After = the lease left (27 s).
        check_reject(a, problem_code::upstream_timeout, 504, 27s);
        CHECK_FALSE(fsm.late().has_value());
        const action w = fsm.on_responded(now());
        // Back to waiting for the call, without its client, until the lease is due an extension.
        CHECK(w.kind == action_kind::wait_until);
        CHECK(w.wake_at == t0 + 10s);
        CHECK(fsm.current_state() == state::forwarding);
        CHECK(fsm.client_gone());
    }
    time_point t0;
};

} // namespace

TEST_CASE("exchange_fsm: late answers off (the default): no tick before the first extension") {
    exchange x;
    const time_point t0 = x.now();
    CHECK(x.start_and_acquire().wake_at == t0 + 10s);
    // late_answer_timeout not above timeout: off as well; the only earlier wake-up is the
    // engine's own bound on the call (timeout + 1 s), past the forwarder's timeout.
    exchange same(make_policy(), {}, upstream_deadlines{3s, 3s});
    CHECK(same.start_and_acquire().wake_at == same.now() + 4s);
}

TEST_CASE("exchange_fsm: an answer within the timeout is answered as usual") {
    exchange x(make_policy(), {}, upstream_deadlines{3s, 15s});
    x.start_and_acquire();
    x.advance(2s);
    action a = x.fsm.on_upstream(response(201), x.now());
    REQUIRE(a.kind == action_kind::complete);
    a = x.fsm.on_complete(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::respond);
    CHECK(a.status_header == idempotency_status::stored);
    CHECK(x.fsm.on_responded(x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::stored);
    CHECK_FALSE(x.fsm.late().has_value());
}

TEST_CASE("exchange_fsm: a late answer is recorded without a client-facing action") {
    late_exchange x;
    x.advance(1'200ms);
    action a = x.fsm.on_upstream(response(201), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK(a.record == record_kind::upstream_response);
    CHECK(a.replayable);
    a = x.fsm.on_complete(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::done);
    check_done(x, exchange_outcome::stored);
    CHECK(x.fsm.late() == late_answer::recorded);
}

TEST_CASE("exchange_fsm: the lease is extended while a late answer is awaited") {
    late_exchange x;
    x.advance(7s); // t0 + 10 s
    action a = x.fsm.on_tick(x.now());
    REQUIRE(a.kind == action_kind::extend_lease);
    a = x.fsm.on_extend(fence_event::ok, x.now());
    CHECK(a.kind == action_kind::wait_until);
    // The next extension is due at t0 + 20 s, but the engine's own bound on the call comes
    // first: late_answer_timeout (15 s) + 1 s after forward.
    CHECK(a.wake_at == x.t0 + 16s);
    CHECK(x.fsm.lease_deadline() == x.t0 + 40s);
    x.advance(2s);
    a = x.fsm.on_upstream(response(200), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
    CHECK(x.fsm.late() == late_answer::recorded);
}

TEST_CASE("exchange_fsm: no answer by late_answer_timeout: on_upstream_uncertain applies") {
    SUBCASE("hold") {
        late_exchange x;
        x.advance(12s);
        CHECK(x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now()).kind ==
              action_kind::done);
        check_done(x, exchange_outcome::held);
        CHECK(x.fsm.late() == late_answer::unanswered);
    }
    SUBCASE("release") {
        idempotency_config p = make_policy();
        p.on_upstream_uncertain = uncertain_policy::release;
        late_exchange x(p);
        action a = x.fsm.on_upstream(uncertain(upstream_result::reset), x.now());
        REQUIRE(a.kind == action_kind::release);
        CHECK(x.fsm.on_release(fence_event::ok, x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::released);
        CHECK(x.fsm.late() == late_answer::unanswered);
    }
    SUBCASE("fail: late answers are off, the record is written at the timeout as before") {
        idempotency_config p = make_policy();
        p.on_upstream_uncertain = uncertain_policy::fail;
        exchange x(p, {}, upstream_deadlines{3s, 15s});
        const time_point t0 = x.now();
        CHECK_FALSE(x.fsm.awaits_late_answers());
        // No 504 of the engine's at the upstream timeout: the forwarder's own timeout ends the
        // call; the engine only bounds it (timeout + 1 s).
        CHECK(x.start_and_acquire().wake_at == t0 + 4s);
        x.advance(3s);
        action a = x.fsm.on_upstream(uncertain(upstream_result::timed_out), x.now());
        REQUIRE(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::outcome_unknown_problem);
        CHECK_FALSE(x.fsm.late().has_value());
    }
}

TEST_CASE("exchange_fsm: a call that never ends is given up at connect_timeout + its deadline "
          "+ 1 s, as an unknown outcome") {
    SUBCASE("late answers off (fail route): the client gets the outcome_unknown record") {
        idempotency_config p = make_policy();
        p.on_upstream_uncertain = uncertain_policy::fail;
        exchange x(p, {}, upstream_deadlines{3s, 15s, 1s});
        const time_point t0 = x.now();
        // Bound: 1 s connect + 3 s timeout + 1 s.
        CHECK(x.start_and_acquire().wake_at == t0 + 5s);
        x.advance(5s);
        action a = x.fsm.on_tick(x.now());
        REQUIRE(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::outcome_unknown_problem);
    }
    SUBCASE("late answers on (hold route): 504 at the timeout, then the lease is let go") {
        exchange x(make_policy(), {}, upstream_deadlines{3s, 15s, 1s});
        const time_point t0 = x.now();
        CHECK(x.start_and_acquire().wake_at == t0 + 3s);
        x.advance(3s);
        check_reject(x.fsm.on_tick(x.now()), problem_code::upstream_timeout, 504, 27s);
        action a = x.fsm.on_responded(x.now());
        REQUIRE(a.kind == action_kind::wait_until);
        CHECK(a.wake_at == t0 + 10s); // the first extension
        x.advance(7s);
        REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
        a = x.fsm.on_extend(fence_event::ok, x.now());
        REQUIRE(a.kind == action_kind::wait_until);
        CHECK(a.wake_at == t0 + 17s); // 1 s connect + 15 s late_answer_timeout + 1 s
        x.advance(7s);
        CHECK(x.fsm.on_tick(x.now()).kind == action_kind::done);
        check_done(x, exchange_outcome::held);
        CHECK(x.fsm.late() == late_answer::unanswered);
    }
}

TEST_CASE("exchange_fsm: a late answer the route releases frees the key") {
    late_exchange x;
    action a = x.fsm.on_upstream(response(503), x.now());
    REQUIRE(a.kind == action_kind::release);
    CHECK(x.fsm.on_release(fence_event::ok, x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::released);
    CHECK(x.fsm.late() == late_answer::released);
}

TEST_CASE("exchange_fsm: a late answer too large to hold is kept head-only, never streamed") {
    late_exchange x;
    action a = x.fsm.on_upstream(streaming(200, 2 << 20), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK_FALSE(a.replayable);
    CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::not_replayable);
    CHECK(x.fsm.late() == late_answer::recorded);
}

TEST_CASE("exchange_fsm: a late answer the store refuses at first is retried in the background") {
    late_exchange x;
    action a = x.fsm.on_upstream(response(200), x.now());
    REQUIRE(a.kind == action_kind::complete);
    a = x.fsm.on_complete(fence_event::store_error, x.now());
    REQUIRE(a.kind == action_kind::wait_until);
    x.advance(a.wake_at - x.now());
    a = x.fsm.on_tick(x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
    check_done(x, exchange_outcome::stored);
    CHECK(x.fsm.late() == late_answer::recorded);
}

TEST_CASE("exchange_fsm: a late answer after the lease was lost is not recorded") {
    late_exchange x;
    x.advance(7s);
    REQUIRE(x.fsm.on_tick(x.now()).kind == action_kind::extend_lease);
    action a = x.fsm.on_extend(fence_event::not_owner, x.now());
    CHECK(a.kind == action_kind::wait_until);
    a = x.fsm.on_upstream(response(200), x.now());
    CHECK(a.kind == action_kind::done);
    check_done(x, exchange_outcome::lease_lost);
    CHECK(x.fsm.late() == late_answer::unrecorded);
}

TEST_CASE("exchange_fsm: a client gone before the timeout: the late answer is still awaited") {
    exchange x(make_policy(), {}, upstream_deadlines{3s, 15s});
    x.start_and_acquire();
    x.fsm.on_client_gone();
    x.advance(3s);
    action a = x.fsm.on_tick(x.now());
    CHECK(a.kind == action_kind::wait_until); // no 504 to write: straight to waiting
    a = x.fsm.on_upstream(response(200), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK(x.fsm.on_complete(fence_event::ok, x.now()).kind == action_kind::done);
    CHECK(x.fsm.late() == late_answer::recorded);
}

TEST_CASE("exchange_fsm: a stream under way is never cut by the timeout tick") {
    exchange x(make_policy(), {}, upstream_deadlines{3s, 15s});
    const time_point t0 = x.now();
    x.start_and_acquire();
    x.advance(1s);
    action a = x.fsm.on_upstream(streaming(200, 2 << 20), x.now());
    REQUIRE(a.kind == action_kind::stream);
    CHECK(a.wake_at == t0 + 10s);
    x.advance(4s);
    CHECK(x.fsm.on_tick(x.now()).kind == action_kind::wait_until);
    a = x.fsm.on_upstream(response(200, 3 << 20), x.now());
    REQUIRE(a.kind == action_kind::complete);
    CHECK_FALSE(x.fsm.late().has_value());
}

namespace {

upstream_event grpc_answer(unsigned grpc_status) {
    upstream_event ev{upstream_result::response, 200, 12};
    ev.grpc_status = grpc_status;
    return ev;
}

} // namespace

TEST_CASE("exchange_fsm: a gRPC call's grpc-status decides, not its HTTP 200") {
    SUBCASE("OK and the definitive errors are recorded") {
        for (const unsigned code : {0U, 3U, 5U, 6U, 7U, 9U, 11U, 12U, 16U}) {
            exchange x;
            x.start_and_acquire();
            auto a = x.fsm.on_upstream(grpc_answer(code), x.now());
            CHECK(a.kind == action_kind::complete);
            a = x.fsm.on_complete(fence_event::ok, x.now());
            CHECK(a.kind == action_kind::respond);
            CHECK(a.status_header == idempotency_status::stored);
        }
    }
    SUBCASE("UNAVAILABLE, RESOURCE_EXHAUSTED and ABORTED release the key") {
        for (const unsigned code : {8U, 10U, 14U}) {
            exchange x;
            x.start_and_acquire();
            auto a = x.fsm.on_upstream(grpc_answer(code), x.now());
            CHECK(a.kind == action_kind::release);
            a = x.fsm.on_release(fence_event::ok, x.now());
            CHECK(a.kind == action_kind::respond);
            CHECK(a.status_header == idempotency_status::none);
            x.fsm.on_responded(x.now());
            check_done(x, exchange_outcome::released);
        }
    }
    SUBCASE("any other code is uncertain: hold passes the answer on and keeps the lease") {
        for (const unsigned code : {1U, 2U, 4U, 13U, 15U, 42U}) {
            exchange x;
            x.start_and_acquire();
            auto a = x.fsm.on_upstream(grpc_answer(code), x.now());
            CHECK(a.kind == action_kind::respond); // the upstream's own answer, no store step
            CHECK(a.status_header == idempotency_status::none);
            a = x.fsm.on_responded(x.now());
            CHECK(a.kind == action_kind::done);
            check_done(x, exchange_outcome::held);
        }
    }
    SUBCASE("uncertain with release: the key is freed, the answer passed on") {
        auto p = make_policy();
        p.on_upstream_uncertain = uncertain_policy::release;
        exchange x(p);
        x.start_and_acquire();
        auto a = x.fsm.on_upstream(grpc_answer(4), x.now());
        CHECK(a.kind == action_kind::release);
        a = x.fsm.on_release(fence_event::ok, x.now());
        CHECK(a.kind == action_kind::respond);
        x.fsm.on_responded(x.now());
        check_done(x, exchange_outcome::released);
    }
    SUBCASE("uncertain with fail: outcome_unknown is recorded and answered") {
        auto p = make_policy();
        p.on_upstream_uncertain = uncertain_policy::fail;
        exchange x(p);
        x.start_and_acquire();
        auto a = x.fsm.on_upstream(grpc_answer(13), x.now());
        CHECK(a.kind == action_kind::complete);
        CHECK(a.record == record_kind::outcome_unknown_problem);
        a = x.fsm.on_complete(fence_event::ok, x.now());
        check_reject(a, problem_code::upstream_outcome_unknown, 502, 0s,
                     idempotency_status::stored);
    }
    SUBCASE("the route's own sets: release wins over record") {
        auto p = make_policy();
        p.grpc_record.reset().set(0).set(14);
        p.grpc_release.reset().set(14);
        exchange x(p);
        x.start_and_acquire();
        CHECK(x.fsm.on_upstream(grpc_answer(14), x.now()).kind == action_kind::release);
    }
}

TEST_CASE("exchange_fsm: the client's deadline (grpc-timeout) caps wait_timeout") {
    auto p = make_policy();
    p.concurrent = concurrent_policy::wait;
    p.wait_timeout = 10s;
    upstream_deadlines d;
    d.client_deadline = 300ms;
    exchange x(p, {}, d);
    const auto started = x.now();
    auto a = x.fsm.start(with_key, x.now());
    REQUIRE(a.kind == action_kind::claim);
    a = x.fsm.on_claim(in_flight(20s), x.now());
    REQUIRE(a.kind == action_kind::wait_until);
    // Re-claims back off until the capped wait_timeout has passed, then 409.
    for (int i = 0; i < 100 && a.kind != action_kind::reject; ++i) {
        x.clock.advance(a.wake_at - x.now());
        a = x.fsm.on_tick(x.now());
        if (a.kind == action_kind::claim) {
            a = x.fsm.on_claim(in_flight(20s), x.now());
        }
    }
    CHECK(a.kind == action_kind::reject);
    CHECK(a.problem == problem_code::in_progress);
    CHECK(x.now() - started <= 400ms);
}
