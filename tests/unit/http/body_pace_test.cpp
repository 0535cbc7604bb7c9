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

TEST_CASE("a body above the minimum rate is still cut at its whole-body time") {
    const auto t0 = body_pace::clock::time_point{} + 1h;
    const body_pace pace(t0, 30s, 1024, 60s);
    // 1 MiB - 200 bytes at once, then a byte every 8 s: far above 1 KiB/s on average.
    CHECK(pace.on_progress(1024 * 1024 - 200, t0 + 1s));
    CHECK(pace.on_progress(1024 * 1024 - 190, t0 + 59s));
    CHECK_FALSE(pace.on_progress(1024 * 1024 - 189, t0 + 60s));
    CHECK_FALSE(pace.on_progress(1024 * 1024 - 100, t0 + 10min));
}

TEST_CASE("a read waits body_timeout at most, and never past the whole-body time") {
    const auto t0 = body_pace::clock::time_point{} + 1h;
    const body_pace pace(t0, 30s, 1024, 60s);
    CHECK(pace.read_deadline(t0) == t0 + 30s);
    CHECK(pace.read_deadline(t0 + 20s) == t0 + 50s);
    CHECK(pace.read_deadline(t0 + 45s) == t0 + 60s);
    CHECK(pace.read_deadline(t0 + 90s) == t0 + 60s);
    const body_pace unbounded(t0, 30s, 1024);
    CHECK(unbounded.read_deadline(t0 + 24h) == t0 + 24h + 30s);
    CHECK(unbounded.on_progress(1024 * 1024 * 1024, t0 + 24h));
}
