#include "onceproxy/egress/retry_policy.hpp"

#include <doctest/doctest.h>

using namespace onceproxy;
using namespace std::chrono_literals;
using egress::attempt_result;

TEST_CASE("idempotent methods are the ones RFC 9110 names") {
    for (const char* m : {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"}) {
        CHECK(egress::idempotent_method(m));
    }
    for (const char* m : {"POST", "PATCH", "CONNECT", "get", "PROPFIND"}) {
        CHECK_FALSE(egress::idempotent_method(m));
    }
}

TEST_CASE("the default retry conditions are the ones the docs list") {
    const config::retry_config r;
    for (unsigned s : {408U, 425U, 429U, 502U, 503U, 504U}) {
        CHECK(egress::retried_status(r, s));
    }
    for (unsigned s : {200U, 400U, 409U, 422U, 500U, 501U, 599U, 600U, 1000U}) {
        CHECK_FALSE(egress::retried_status(r, s));
    }
    CHECK(egress::retried_on(r, attempt_result::connect_failure));
    CHECK(egress::retried_on(r, attempt_result::reset));
    CHECK(egress::retried_on(r, attempt_result::retryable_status));
    CHECK_FALSE(egress::retried_on(r, attempt_result::timeout));
    CHECK_FALSE(egress::retried_on(r, attempt_result::answered));
    CHECK_FALSE(egress::retried_on(r, attempt_result::other));
    config::retry_config t = r;
    t.on_timeout = true;
    t.on_reset = false;
    CHECK(egress::retried_on(t, attempt_result::timeout));
    CHECK_FALSE(egress::retried_on(t, attempt_result::reset));
}

TEST_CASE("the backoff ceiling doubles from base_delay up to max_delay") {
    config::retry_config r;
    r.base_delay = 100ms;
    r.max_delay = 1'000ms;
    CHECK(egress::backoff_ceiling(r, 1) == 100ms);
    CHECK(egress::backoff_ceiling(r, 2) == 200ms);
    CHECK(egress::backoff_ceiling(r, 3) == 400ms);
    CHECK(egress::backoff_ceiling(r, 4) == 800ms);
    CHECK(egress::backoff_ceiling(r, 5) == 1'000ms);
    CHECK(egress::backoff_ceiling(r, 99) == 1'000ms); // no overflow far out
}

TEST_CASE("full jitter spans zero to the ceiling") {
    CHECK(egress::full_jitter(400ms, 0.0) == 0ms);
    CHECK(egress::full_jitter(400ms, 0.5) == 200ms);
    CHECK(egress::full_jitter(400ms, 0.999999) == 399ms);
    CHECK(egress::full_jitter(400ms, 7.0) == 400ms); // clamped
}

TEST_CASE("Retry-After: seconds or an HTTP date") {
    // 1994-11-06 08:49:37 UTC
    const auto now = std::chrono::system_clock::from_time_t(784111777);
    CHECK(egress::parse_retry_after("3", now) == 3'000ms);
    CHECK(egress::parse_retry_after(" 0 ", now) == 0ms);
    CHECK(egress::parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now) == 10'000ms);
    CHECK(egress::parse_retry_after("Sun, 06 Nov 1994 08:40:00 GMT", now) == 0ms); // past
    CHECK(egress::parse_retry_after("99999999999999999999999", now) ==
          std::chrono::milliseconds::max());
    CHECK_FALSE(egress::parse_retry_after("", now));
    CHECK_FALSE(egress::parse_retry_after("-1", now));
    CHECK_FALSE(egress::parse_retry_after("1.5", now));
    CHECK_FALSE(egress::parse_retry_after("soon", now));
    CHECK_FALSE(egress::parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT trailing", now));
}

TEST_CASE("the wait honours Retry-After up to max_retry_after") {
    config::retry_config r;
    r.max_retry_after = 5'000ms;
    CHECK(egress::next_wait(r, 120ms, std::nullopt) == 120ms);
    CHECK(egress::next_wait(r, 120ms, 1'000ms) == 1'000ms); // the upstream's is longer
    CHECK(egress::next_wait(r, 120ms, 50ms) == 120ms);      // the backoff is longer
    CHECK(egress::next_wait(r, 120ms, 5'000ms) == 5'000ms); // at the cap
    CHECK_FALSE(egress::next_wait(r, 120ms, 5'001ms));      // past it: no retry
}
