#pragma once
// Samples of the per-route series taken now and then (the admin listener takes one a minute),
// so that the status page can show figures over a recent window, which the cumulative series
// of /metrics do not: "last hour", and latency percentiles over the last minutes.

#include "onceproxy/metrics/registry.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace onceproxy::metrics {

/// One route's counters at one moment.
struct route_sample {
    std::string name;
    std::array<std::uint64_t, outcome_count> requests{};
    std::array<std::uint64_t, core::observation_count> observed{};
    histogram_cells::counts latency; ///< onceproxy_request_duration_seconds
};

struct sample {
    std::chrono::steady_clock::time_point at;
    std::vector<route_sample> routes; ///< registry::routes() order

    /// The route named `name`; nullptr when it had no series yet.
    const route_sample* route(std::string_view name) const noexcept;
};

/// Every route's series of `reg` now.
sample sample_of(const registry& reg, std::chrono::steady_clock::time_point now);

/// The last `keep` samples, oldest first.
class history {
public:
    explicit history(std::size_t keep) : keep_(keep) {}

    void add(sample s);
    /// The newest sample taken at least `age` before `now`, else the oldest one (the window
    /// is then shorter); nullptr when there is none.
    const sample* at_least(std::chrono::steady_clock::duration age,
                           std::chrono::steady_clock::time_point now) const noexcept;

private:
    std::size_t keep_;
    std::deque<sample> samples_;
};

/// The `q` quantile (0 < q < 1) of the observations counted in `h`, in seconds, interpolated
/// linearly inside its bucket as Prometheus's histogram_quantile does (an observation in the
/// +Inf bucket counts as the largest finite bound). Negative when `h` is empty.
double quantile(double q, const histogram_cells::counts& h) noexcept;

/// `now` minus `before`, bucket by bucket (counters only grow; a bucket that did not is 0).
histogram_cells::counts difference(const histogram_cells::counts& now,
                                   const histogram_cells::counts& before) noexcept;

} // namespace onceproxy::metrics
