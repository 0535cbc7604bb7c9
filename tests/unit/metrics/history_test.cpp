#include "onceproxy/metrics/history.hpp"

#include <doctest/doctest.h>

using namespace onceproxy::metrics;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {
histogram_cells::counts observed(std::initializer_list<std::chrono::nanoseconds> values) {
    histogram_cells h;
    for (auto v : values) {
        h.observe(v);
    }
    return h.read();
}
} // namespace

TEST_SUITE("history") {
    TEST_CASE("quantile interpolates inside the bucket, as histogram_quantile does") {
        CHECK(quantile(0.5, {}) < 0); // nothing observed
        // 0.5 ms, 1 ms bucket bounds: four observations in (0.5 ms, 1 ms].
        const auto h = observed({700us, 800us, 900us, 900us});
        CHECK(h.count == 4);
        CHECK(quantile(0.5, h) == doctest::Approx(0.00075));
        CHECK(quantile(0.99, h) == doctest::Approx(0.0005 + 0.0005 * 0.99));
        // Two buckets: the p50 in the first, the p99 in the second.
        const auto two = observed({100us, 100us, 3ms, 3ms});
        CHECK(quantile(0.5, two) == doctest::Approx(0.0005));
        CHECK(quantile(0.99, two) > 0.0025);
        CHECK(quantile(0.99, two) <= 0.005);
        // Beyond the last bound: the largest finite bound.
        CHECK(quantile(0.99, observed({20s})) == doctest::Approx(10.0));
    }

    TEST_CASE("difference is per bucket and never negative") {
        const auto before = observed({700us});
        const auto now = observed({700us, 700us, 3ms});
        const auto d = difference(now, before);
        CHECK(d.count == 2);
        CHECK(quantile(0.99, d) > 0.0025);
        CHECK(difference(before, now).count == 0);
    }

    TEST_CASE("samples: the route counts, and the newest one old enough") {
        registry reg({"pay"});
        auto& pay = reg.route(0);
        pay.counter(family::requests, outcome::stored).add(3);
        pay.counter(family::observed, onceproxy::core::observation::replay).inc();
        pay.histogram(family::request_duration).observe(2ms);
        const auto t0 = clock_type::now();
        auto s = sample_of(reg, t0);
        REQUIRE(s.route("pay") != nullptr);
        CHECK(s.route("pay")->requests[static_cast<std::size_t>(outcome::stored)] == 3);
        CHECK(s.route("pay")->observed[0] == 1);
        CHECK(s.route("pay")->latency.count == 1);
        CHECK(s.route("(none)") != nullptr);
        CHECK(s.route("other") == nullptr);

        history h(3);
        CHECK(h.at_least(60s, t0) == nullptr);
        for (int minute = 0; minute < 5; ++minute) {
            h.add(sample_of(reg, t0 + minute * 60s));
        }
        // Kept: minutes 2, 3, 4.
        CHECK(h.at_least(60s, t0 + 4min + 1s)->at == t0 + 3min);
        CHECK(h.at_least(120s, t0 + 4min)->at == t0 + 2min);
        // Not that old: the oldest kept.
        CHECK(h.at_least(1h, t0 + 4min)->at == t0 + 2min);
    }
}
