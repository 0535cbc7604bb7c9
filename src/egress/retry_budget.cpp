#include "onceproxy/egress/retry_budget.hpp"

namespace onceproxy::egress {

void retry_budget::configure(const config::retry_budget_config& c) noexcept {
    const bool same_window = c.window == cfg_.window && slot_.count() != 0;
    cfg_ = c;
    if (!same_window) {
        slot_ = std::chrono::duration_cast<std::chrono::nanoseconds>(c.window) / slots;
        if (slot_.count() <= 0) {
            slot_ = std::chrono::nanoseconds(1);
        }
        ring_ = {}; // the slots measured another length of time
    }
}

retry_budget::bucket& retry_budget::current(time_point now) noexcept {
    const auto index = now.time_since_epoch() / slot_;
    auto& b = ring_[static_cast<std::size_t>(index) % slots];
    if (b.index != index) {
        b = bucket{index, 0, 0};
    }
    return b;
}

retry_budget::totals retry_budget::in_window(time_point now) noexcept {
    const auto index = now.time_since_epoch() / slot_;
    totals t;
    for (const auto& b : ring_) {
        if (b.index >= 0 && b.index > index - static_cast<std::int64_t>(slots) &&
            b.index <= index) {
            t.requests += b.requests;
            t.retries += b.retries;
        }
    }
    return t;
}

void retry_budget::on_request(time_point now) noexcept {
    ++current(now).requests;
}

bool retry_budget::try_retry(time_point now) noexcept {
    const auto t = in_window(now);
    const double window_s = std::chrono::duration<double>(cfg_.window).count();
    const double allowed =
        cfg_.ratio * static_cast<double>(t.requests) + cfg_.min_per_second * window_s;
    if (static_cast<double>(t.retries) + 1 > allowed) {
        return false;
    }
    ++current(now).retries;
    return true;
}

} // namespace onceproxy::egress
