#pragma once
// A retry budget (Finagle's RetryBudget, gRPC's retry throttling): retries may be at most
// `ratio` of the requests over a sliding window, plus `min_per_second` per second so that light
// traffic can still retry. When an upstream is down every request fails, and the attempts stay
// near (1 + ratio) x requests instead of `attempts` x requests: retries cannot multiply an
// outage. Pure: `now` is an input; not thread-safe (upstream_guards locks around it).

#include "onceproxy/config/config.hpp"

#include <array>
#include <chrono>
#include <cstdint>

namespace onceproxy::egress {

class retry_budget {
public:
    using time_point = std::chrono::steady_clock::time_point;

    explicit retry_budget(const config::retry_budget_config& c) noexcept { configure(c); }

    /// New settings (a reload); the counts so far are kept.
    void configure(const config::retry_budget_config& c) noexcept;

    /// A request (its first attempt) was sent: a deposit.
    void on_request(time_point now) noexcept;

    /// A retry wants to go: true (and counted) when the window's retries stay within
    /// ratio x requests + min_per_second x window.
    bool try_retry(time_point now) noexcept;

    /// Requests and retries counted in the window ending at `now`.
    struct totals {
        std::uint64_t requests = 0;
        std::uint64_t retries = 0;
    };
    totals in_window(time_point now) noexcept;

private:
    /// The window is kept as `slots` buckets of window/slots each.
    static constexpr std::size_t slots = 10;
    struct bucket {
        std::int64_t index = -1; ///< which slot of time it counts (now / slot length)
        std::uint64_t requests = 0;
        std::uint64_t retries = 0;
    };
    bucket& current(time_point now) noexcept;

    config::retry_budget_config cfg_;
    std::chrono::nanoseconds slot_{};
    std::array<bucket, slots> ring_{};
};

} // namespace onceproxy::egress
