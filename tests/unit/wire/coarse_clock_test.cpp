#include "onceproxy/wire/coarse_clock.hpp"

#include <doctest/doctest.h>

#include <time.h>

#include <chrono>

using onceproxy::wire::coarse_margin;
using onceproxy::wire::coarse_now;
using onceproxy::wire::coarse_wall_now;
using std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST_SUITE("coarse clock") {

    TEST_CASE("the margin is two resolutions of the coarse clock") {
        timespec r{};
        REQUIRE(::clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0);
        const auto resolution =
            std::chrono::seconds(r.tv_sec) + std::chrono::nanoseconds(r.tv_nsec);
        CHECK(coarse_margin() == 2 * resolution);
        CHECK(coarse_margin() > 0ns);
    }

    TEST_CASE("never earlier than steady_clock::now() read before it, at most the margin later "
              "than it read after") {
        // Many samples: the coarse clock's lag behind the precise one moves over each jiffy.
        for (int i = 0; i < 2000; ++i) {
            const auto before = steady_clock::now();
            const auto coarse = coarse_now();
            const auto after = steady_clock::now();
            INFO("sample ", i, ": coarse - before = ", (coarse - before).count(),
                 " ns, margin = ", coarse_margin().count(), " ns");
            REQUIRE(coarse >= before);
            REQUIRE(coarse <= after + coarse_margin());
        }
    }

    TEST_CASE("the wall clock read coarsely is never later than system_clock::now() read after "
              "it, at most the margin earlier than it read before") {
        using std::chrono::system_clock;
        for (int i = 0; i < 2000; ++i) {
            const auto before = system_clock::now();
            const auto coarse = coarse_wall_now();
            const auto after = system_clock::now();
            INFO("sample ", i, ": before - coarse = ", (before - coarse).count(),
                 " ns, margin = ", coarse_margin().count(), " ns");
            REQUIRE(coarse <= after);
            REQUIRE(coarse >= before - coarse_margin());
        }
    }
}
