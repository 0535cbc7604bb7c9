#include "onceproxy/egress/retry_budget.hpp"

#include <doctest/doctest.h>

using namespace onceproxy;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {
config::retry_budget_config budget(double ratio, double min_per_second,
                                   std::chrono::milliseconds window) {
    config::retry_budget_config c;
    c.ratio = ratio;
    c.min_per_second = min_per_second;
    c.window = window;
    return c;
}
} // namespace

TEST_CASE("retries stay within ratio x requests + min_per_second x window") {
    egress::retry_budget b(budget(0.2, 1, 10s));
    const auto t0 = clock_type::time_point{} + 1'000s;
    // A total outage: every request fails and wants two retries.
    int attempts = 0;
    for (int i = 0; i < 1000; ++i) {
        const auto now = t0 + std::chrono::milliseconds(i * 5); // 5 s in all, within the window
        b.on_request(now);
        ++attempts;
        for (int r = 0; r < 2; ++r) {
            if (b.try_retry(now)) {
                ++attempts;
            }
        }
    }
    // 1000 requests: 200 from the ratio plus 10 from the reserve.
    CHECK(attempts == 1000 + 200 + 10);
    const auto t = b.in_window(t0 + 5s);
    CHECK(t.requests == 1000);
    CHECK(t.retries == 210);
}

TEST_CASE("light traffic can still retry from the per-second reserve") {
    egress::retry_budget b(budget(0.0, 1, 10s));
    const auto t0 = clock_type::time_point{} + 1'000s;
    b.on_request(t0);
    int retries = 0;
    for (int i = 0; i < 20; ++i) {
        retries += b.try_retry(t0) ? 1 : 0;
    }
    CHECK(retries == 10);
}

TEST_CASE("the window slides: old requests and retries stop counting") {
    egress::retry_budget b(budget(0.5, 0, 10s));
    const auto t0 = clock_type::time_point{} + 1'000s;
    for (int i = 0; i < 10; ++i) {
        b.on_request(t0);
    }
    for (int i = 0; i < 5; ++i) {
        CHECK(b.try_retry(t0));
    }
    CHECK_FALSE(b.try_retry(t0)); // 5 of 10 at 50 %
    // Eleven seconds on, the old ones are out of the window: no requests, no retries.
    const auto later = t0 + 11s;
    CHECK(b.in_window(later).requests == 0);
    CHECK_FALSE(b.try_retry(later));
    b.on_request(later);
    b.on_request(later);
    CHECK(b.try_retry(later));
    CHECK_FALSE(b.try_retry(later));
}

TEST_CASE("a reload keeps the counts of the same window") {
    egress::retry_budget b(budget(0.1, 0, 10s));
    const auto t0 = clock_type::time_point{} + 1'000s;
    for (int i = 0; i < 10; ++i) {
        b.on_request(t0);
    }
    CHECK(b.try_retry(t0));
    CHECK_FALSE(b.try_retry(t0));
    b.configure(budget(0.3, 0, 10s));
    CHECK(b.in_window(t0).requests == 10);
    CHECK(b.try_retry(t0));
    CHECK(b.try_retry(t0));
    CHECK_FALSE(b.try_retry(t0));
}
