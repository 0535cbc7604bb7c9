#pragma once
// The slow-body defence of one request body read whole (limits.body_timeout,
// limits.min_body_rate, limits.max_body_time): each read must bring bytes within body_timeout,
// once the body has taken longer than body_timeout it must have averaged at least
// min_body_rate bytes per second since its first byte was awaited, and the whole body must be
// in within max_body_time. A client trickling a byte just inside every deadline is cut, and so
// is one that keeps its average just above the rate while it holds a buffered body (issue 26).

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace onceproxy::http {

class body_pace {
public:
    using clock = std::chrono::steady_clock;

    /// `grace`: body_timeout; `max_total`: max_body_time, counted from `start`.
    body_pace(clock::time_point start, clock::duration grace, std::size_t min_rate,
              clock::duration max_total = clock::duration::max()) noexcept
        : start_(start), grace_(grace), min_rate_(min_rate),
          end_(max_total >= clock::time_point::max() - start ? clock::time_point::max()
                                                             : start + max_total) {}

    /// `total` body bytes have arrived by `now`: false when the body is too slow, or its whole
    /// time is over.
    bool on_progress(std::uint64_t total, clock::time_point now) const noexcept {
        if (now >= end_) {
            return false;
        }
        const auto elapsed = now - start_;
        if (elapsed <= grace_) {
            return true;
        }
        const double seconds = std::chrono::duration<double>(elapsed).count();
        return static_cast<double>(total) >= static_cast<double>(min_rate_) * seconds;
    }

    /// The deadline of the next read started at `now`: `grace` later, but never past the end
    /// of the body's whole time.
    clock::time_point read_deadline(clock::time_point now) const noexcept {
        return end_ - now <= grace_ ? end_ : now + grace_;
    }

private:
    clock::time_point start_;
    clock::duration grace_;
    std::size_t min_rate_;
    clock::time_point end_; ///< the whole body is due by then
};

} // namespace onceproxy::http
