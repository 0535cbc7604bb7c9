#include "onceproxy/wire/deadline_watch.hpp"

#include <doctest/doctest.h>

#include <chrono>

using onceproxy::wire::lag_meter;
using namespace std::chrono_literals;

TEST_SUITE("lag meter") {

    TEST_CASE("reports the largest lateness of each window once the window is over") {
        lag_meter m(1s);
        const lag_meter::clock::time_point t0{};
        m.start(t0);
        CHECK_FALSE(m.note(t0 + 50ms, 1ms));
        CHECK_FALSE(m.note(t0 + 100ms, 300ms)); // a blocked turn
        CHECK_FALSE(m.note(t0 + 450ms, 2ms));
        const auto first = m.note(t0 + 1000ms, 1ms);
        REQUIRE(first);
        CHECK(*first == 300ms);
        // The next window starts afresh: the earlier worst is not carried over.
        CHECK_FALSE(m.note(t0 + 1500ms, 4ms));
        const auto second = m.note(t0 + 2000ms, 3ms);
        REQUIRE(second);
        CHECK(*second == 4ms);
    }

    TEST_CASE("a tick that itself ends the window counts in it (a stall longer than a window)") {
        lag_meter m(1s);
        const lag_meter::clock::time_point t0{};
        m.start(t0);
        const auto r = m.note(t0 + 5s, 4950ms);
        REQUIRE(r);
        CHECK(*r == 4950ms);
    }
}
