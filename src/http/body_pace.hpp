#pragma once
// The slow-body defence of one request body (limits.body_timeout, limits.min_body_rate): each
// read must bring bytes within body_timeout (a deadline the caller arms), and once the body has
// taken longer than body_timeout it must have averaged at least min_body_rate bytes per second
// since its first byte was awaited. A client trickling a byte just inside every deadline is cut.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace onceproxy::http {

class body_pace {
public:
    using clock = std::chrono::steady_clock;

    body_pace(clock::time_point start, clock::duration grace, std::size_t min_rate) noexcept
        : start_(start), grace_(grace), min_rate_(min_rate) {}

    /// `total` body bytes have arrived by `now`: false when the body is too slow.
    bool on_progress(std::uint64_t total, clock::time_point now) const noexcept {
        const auto elapsed = now - start_;
        if (elapsed <= grace_) {
            return true;
        }
        const double seconds = std::chrono::duration<double>(elapsed).count();
        return static_cast<double>(total) >= static_cast<double>(min_rate_) * seconds;
    }

private:
    clock::time_point start_;
    clock::duration grace_;
    std::size_t min_rate_;
};

} // namespace onceproxy::http
