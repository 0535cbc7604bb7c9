#pragma once
// A circuit breaker per upstream: `failures` consecutive failed attempts (no connection, a
// reset, a timeout, or a 5xx answer) open it; while open, requests are refused at once without
// a send (503 egress.circuit_open with Retry-After); after `cool_down` it is half-open and lets
// `probes` attempts through at once: a success closes it, a failure opens it again.
// Pure: `now` is an input; not thread-safe (upstream_guards locks around it).

#include "onceproxy/config/config.hpp"

#include <chrono>
#include <cstdint>
#include <optional>

namespace onceproxy::egress {

/// The breaker's state; the `state` and `to` labels of the breaker metrics.
enum class breaker_state : std::uint8_t {
    closed,    ///< attempts go
    open,      ///< attempts are refused until the cool-down ends
    half_open, ///< up to `probes` attempts at once test the upstream
};
inline constexpr std::size_t breaker_state_count = 3;

class circuit_breaker {
public:
    using time_point = std::chrono::steady_clock::time_point;

    explicit circuit_breaker(const config::breaker_config& c) noexcept : cfg_(c) {}

    /// New settings (a reload). Disabling it closes it.
    void configure(const config::breaker_config& c) noexcept;

    /// The verdict on one attempt about to be sent.
    struct admission {
        bool allowed = true;
        bool probe = false; ///< a half-open probe: report its result with `probe` set
        std::chrono::milliseconds retry_after{0}; ///< refused: until the cool-down ends
        std::optional<breaker_state> became;      ///< the state changed (open → half_open)
    };
    admission admit(time_point now) noexcept;

    /// How an admitted attempt ended: `failed` (no answer, or 5xx) or not. Returns the new
    /// state when it changed.
    std::optional<breaker_state> on_result(bool failed, bool probe, time_point now) noexcept;

    /// An admitted probe that ended without a verdict (the request was abandoned).
    void on_abandoned(bool probe) noexcept;

    breaker_state state() const noexcept { return state_; }

private:
    config::breaker_config cfg_;
    breaker_state state_ = breaker_state::closed;
    unsigned consecutive_failures_ = 0;
    unsigned probes_in_flight_ = 0;
    time_point open_until_{};
};

} // namespace onceproxy::egress
