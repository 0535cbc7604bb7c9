#include "onceproxy/egress/circuit_breaker.hpp"

#include <doctest/doctest.h>

using namespace onceproxy;
using namespace std::chrono_literals;
using egress::breaker_state;
using clock_type = std::chrono::steady_clock;

namespace {
config::breaker_config breaker(unsigned failures, std::chrono::milliseconds cool_down,
                               unsigned probes = 1) {
    config::breaker_config c;
    c.failures = failures;
    c.cool_down = cool_down;
    c.probes = probes;
    return c;
}
const auto t0 = clock_type::time_point{} + 1'000s;
} // namespace

TEST_CASE("consecutive failures open the breaker; a success in between resets the count") {
    egress::circuit_breaker b(breaker(3, 10s));
    CHECK_FALSE(b.on_result(true, false, t0));
    CHECK_FALSE(b.on_result(true, false, t0));
    CHECK_FALSE(b.on_result(false, false, t0)); // the count starts again
    CHECK_FALSE(b.on_result(true, false, t0));
    CHECK_FALSE(b.on_result(true, false, t0));
    CHECK(b.state() == breaker_state::closed);
    CHECK(b.on_result(true, false, t0) == breaker_state::open);
    const auto a = b.admit(t0 + 4s);
    CHECK_FALSE(a.allowed);
    CHECK(a.retry_after == 6s);
}

TEST_CASE("after the cool-down one probe goes; its success closes the breaker") {
    egress::circuit_breaker b(breaker(1, 10s));
    CHECK(b.on_result(true, false, t0) == breaker_state::open);
    const auto probe = b.admit(t0 + 10s);
    CHECK(probe.allowed);
    CHECK(probe.probe);
    CHECK(probe.became == breaker_state::half_open);
    const auto second = b.admit(t0 + 10s); // the probe is still out
    CHECK_FALSE(second.allowed);
    CHECK(b.on_result(false, true, t0 + 11s) == breaker_state::closed);
    const auto after = b.admit(t0 + 11s);
    CHECK(after.allowed);
    CHECK_FALSE(after.probe);
}

TEST_CASE("a failed probe opens it again for a whole cool-down") {
    egress::circuit_breaker b(breaker(2, 5s, 2));
    b.on_result(true, false, t0);
    CHECK(b.on_result(true, false, t0) == breaker_state::open);
    const auto p1 = b.admit(t0 + 5s);
    const auto p2 = b.admit(t0 + 5s);
    CHECK((p1.allowed && p2.allowed && p1.probe && p2.probe));
    CHECK_FALSE(b.admit(t0 + 5s).allowed); // two probes at once at most
    CHECK(b.on_result(true, true, t0 + 6s) == breaker_state::open);
    CHECK_FALSE(b.admit(t0 + 10s).allowed);
    CHECK(b.admit(t0 + 11s).allowed);
}

TEST_CASE("an abandoned probe frees its place") {
    egress::circuit_breaker b(breaker(1, 1s));
    b.on_result(true, false, t0);
    const auto p = b.admit(t0 + 1s);
    CHECK(p.probe);
    CHECK_FALSE(b.admit(t0 + 1s).allowed);
    b.on_abandoned(true);
    CHECK(b.admit(t0 + 1s).allowed);
}

TEST_CASE("a disabled breaker never opens") {
    auto c = breaker(1, 10s);
    c.enabled = false;
    egress::circuit_breaker b(c);
    for (int i = 0; i < 10; ++i) {
        CHECK_FALSE(b.on_result(true, false, t0));
    }
    CHECK(b.admit(t0).allowed);
    CHECK(b.state() == breaker_state::closed);
}
