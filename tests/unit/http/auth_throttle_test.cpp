#include "http/auth_throttle.hpp"

#include <doctest/doctest.h>

#include <string>

using onceproxy::http::auth_throttle;
using namespace std::chrono_literals;

TEST_CASE("auth_throttle: a burst of failures, then one per refill period") {
    const auto t0 = auth_throttle::clock::time_point{} + 1h;
    auth_throttle t(10, 1s, 100);
    for (int i = 0; i < 10; ++i) {
        CHECK(t.retry_after("10.0.0.1", t0) == 0s);
        t.note_failure("10.0.0.1", t0);
    }
    // The 11th attempt within the same instant waits one refill period.
    CHECK(t.retry_after("10.0.0.1", t0) == 1s);
    CHECK(t.retry_after("10.0.0.1", t0 + 400ms) == 600ms);
    CHECK(t.retry_after("10.0.0.1", t0 + 1s) == 0s);
    t.note_failure("10.0.0.1", t0 + 1s);
    CHECK(t.retry_after("10.0.0.1", t0 + 1s) == 1s);
    // Another address has its own budget.
    CHECK(t.retry_after("10.0.0.2", t0) == 0s);
    // Ten quiet seconds refill the whole burst.
    const auto later = t0 + 11s;
    for (int i = 0; i < 10; ++i) {
        CHECK(t.retry_after("10.0.0.1", later) == 0s);
        t.note_failure("10.0.0.1", later);
    }
    CHECK(t.retry_after("10.0.0.1", later) > 0s);
}

TEST_CASE("auth_throttle: 500 wrong tokens in one second get 10 tries") {
    const auto t0 = auth_throttle::clock::time_point{} + 1h;
    auth_throttle t(10, 1s, 100);
    int tried = 0;
    for (int i = 0; i < 500; ++i) {
        const auto now = t0 + i * 2ms;
        if (t.retry_after("::1", now) == 0s) {
            ++tried;
            t.note_failure("::1", now);
        }
    }
    CHECK(tried == 10);
}

TEST_CASE("auth_throttle: the number of addresses is bounded; beyond it they share a budget") {
    const auto t0 = auth_throttle::clock::time_point{} + 1h;
    auth_throttle t(2, 1s, 4);
    for (int i = 0; i < 4; ++i) {
        t.note_failure("a" + std::to_string(i), t0);
    }
    CHECK(t.size() == 4);
    // Full: new addresses go to the shared budget, which a burst exhausts for all of them.
    t.note_failure("b1", t0);
    t.note_failure("b2", t0);
    CHECK(t.size() == 5);
    CHECK(t.retry_after("b3", t0) > 0s);
    CHECK(t.retry_after("a0", t0) == 0s); // known addresses keep their own
    // Once the tracked addresses have recovered, they are forgotten and new ones tracked again.
    t.note_failure("c1", t0 + 5s);
    CHECK(t.size() <= 4);
    CHECK(t.retry_after("c1", t0 + 5s) == 0s);
    t.note_failure("c1", t0 + 5s);
    CHECK(t.retry_after("c1", t0 + 5s) == 1s);
}
