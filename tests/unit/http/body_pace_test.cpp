#include "http/body_pace.hpp"

#include <doctest/doctest.h>

using onceproxy::http::body_pace;
using namespace std::chrono_literals;

TEST_CASE("a body is never too slow within the grace period") {
    const auto t0 = body_pace::clock::time_point{} + 1h;
    const body_pace pace(t0, 30s, 1024);
    CHECK(pace.on_progress(0, t0));
    CHECK(pace.on_progress(0, t0 + 30s));
}

TEST_CASE("after the grace period the body must average the minimum rate") {
    const auto t0 = body_pace::clock::time_point{} + 1h;
    const body_pace pace(t0, 30s, 1024);
    CHECK(pace.on_progress(40 * 1024, t0 + 40s)); // exactly 1 KiB/s
    CHECK_FALSE(pace.on_progress(40 * 1024 - 1, t0 + 40s));
    CHECK_FALSE(pace.on_progress(31, t0 + 31s));          // a byte a second: cut
    CHECK(pace.on_progress(100 * 1024 * 1024, t0 + 60s)); // a fast start carries a slow end
}
