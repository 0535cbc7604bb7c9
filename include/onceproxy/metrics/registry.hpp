#pragma once
// Every metric onceproxy exposes, in one place (SPEC §6). Counters are relaxed atomics, updated
// from any worker; exposition renders the Prometheus text format on the admin listener.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::metrics {

/// The one final outcome each request records (SPEC §6).
enum class outcome : std::uint8_t {
    stored,          ///< first execution, response recorded
    replayed,        ///< recorded response replayed
    in_progress,     ///< 409: same key still in flight
    mismatch,        ///< same key, different fingerprint
    missing_key,     ///< required route without a key
    invalid_key,     ///< malformed, too long or repeated key
    released,        ///< response not recordable: key freed
    held,            ///< outcome unknown, lease kept until it lapses
    outcome_unknown, ///< outcome unknown recorded as 502 (route set to fail)
    not_replayable,  ///< response too large to record / replay refused
    lease_lost,      ///< completion refused: another owner holds the key
    record_failed,   ///< the store never accepted the completion
    store_error,     ///< store unreachable (fail-closed 503 or fail-open)
    passthrough,     ///< plain proxying (no route guard, safe method, optional without key)
    rejected,        ///< refused before routing (malformed request, too large, no route)
};
inline constexpr std::size_t outcome_count = 15;

std::string_view outcome_name(outcome o) noexcept;

/// Fixed-bucket latency histogram (seconds), lock-free.
class histogram {
public:
    static constexpr std::array<double, 14> bounds{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                   0.1,    0.25,  0.5,    1,     2.5,  5,     10};
    void observe(std::chrono::nanoseconds d) noexcept;
    void render(std::string& out, std::string_view name, std::string_view labels) const;

private:
    std::array<std::atomic<std::uint64_t>, bounds.size() + 1> buckets_{};
    std::atomic<std::uint64_t> count_{0};
    std::atomic<std::uint64_t> sum_ns_{0};
};

/// Per-route counters and histograms, index = route index in the config (last = unrouted).
struct route_metrics {
    std::string name;
    std::array<std::atomic<std::uint64_t>, outcome_count> outcomes{};
    histogram request_duration;
    histogram upstream_duration;
    histogram store_duration;
};

class registry {
public:
    /// `route_names`: config route names in order; an extra "(none)" series is added.
    explicit registry(const std::vector<std::string>& route_names);

    route_metrics& route(std::size_t index) noexcept { return *routes_[index]; }
    route_metrics& unrouted() noexcept { return *routes_.back(); }
    std::size_t unrouted_index() const noexcept { return routes_.size() - 1; }

    std::atomic<std::int64_t> open_connections{0};
    std::atomic<std::uint64_t> store_errors{0};
    std::atomic<std::uint64_t> upstream_errors{0};
    std::atomic<std::uint64_t> upstream_timeouts{0};
    std::atomic<std::uint64_t> connection_limit{0};    ///< effective limits.max_connections
    std::atomic<std::uint64_t> connections_refused{0}; ///< over the limit: 503 and closed
    std::atomic<std::uint64_t> accept_errors_proxy{0}; ///< accept() failures, proxy listener
    std::atomic<std::uint64_t> accept_errors_admin{0}; ///< accept() failures, admin listener
    std::atomic<std::uint64_t> internal_errors{0};
    std::atomic<std::uint64_t> tunnels_total{0}; ///< upgraded connections (101), ever
    std::atomic<std::int64_t> tunnels_open{
        0}; ///< upgraded connections open now     ///< exceptions caught in an event loop
    std::atomic<std::uint64_t> access_log_dropped{0}; ///< lines the log writer had no room for

    /// Prometheus text exposition format 0.0.4.
    std::string render() const;

private:
    std::vector<std::unique_ptr<route_metrics>> routes_;
};

} // namespace onceproxy::metrics
