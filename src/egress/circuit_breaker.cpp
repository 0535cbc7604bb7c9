#include "onceproxy/egress/circuit_breaker.hpp"

namespace onceproxy::egress {

void circuit_breaker::configure(const config::breaker_config& c) noexcept {
    cfg_ = c;
    if (!c.enabled) {
        state_ = breaker_state::closed;
        consecutive_failures_ = 0;
        probes_in_flight_ = 0;
    }
}

circuit_breaker::admission circuit_breaker::admit(time_point now) noexcept {
    admission a;
    if (!cfg_.enabled) {
        return a;
    }
    if (state_ == breaker_state::open) {
        if (now < open_until_) {
            a.allowed = false;
            a.retry_after = std::chrono::ceil<std::chrono::milliseconds>(open_until_ - now);
            return a;
        }
        state_ = breaker_state::half_open;
        probes_in_flight_ = 0;
        a.became = breaker_state::half_open;
    }
    if (state_ == breaker_state::half_open) {
        if (probes_in_flight_ >= cfg_.probes) {
            a.allowed = false;
            a.retry_after = std::chrono::milliseconds(1'000); // a probe is under way
            return a;
        }
        ++probes_in_flight_;
        a.probe = true;
    }
    return a;
}

std::optional<breaker_state> circuit_breaker::on_result(bool failed, bool probe,
                                                        time_point now) noexcept {
    if (!cfg_.enabled) {
        return std::nullopt;
    }
    if (probe && probes_in_flight_ > 0) {
        --probes_in_flight_;
    }
    if (!failed) {
        consecutive_failures_ = 0;
        if (state_ == breaker_state::half_open && probe) {
            state_ = breaker_state::closed;
            return state_;
        }
        return std::nullopt;
    }
    ++consecutive_failures_;
    const bool trips = (state_ == breaker_state::half_open && probe) ||
                       (state_ == breaker_state::closed && consecutive_failures_ >= cfg_.failures);
    if (!trips) {
        return std::nullopt;
    }
    state_ = breaker_state::open;
    open_until_ = now + cfg_.cool_down;
    probes_in_flight_ = 0;
    return state_;
}

void circuit_breaker::on_abandoned(bool probe) noexcept {
    if (probe && probes_in_flight_ > 0) {
        --probes_in_flight_;
    }
}

} // namespace onceproxy::egress
