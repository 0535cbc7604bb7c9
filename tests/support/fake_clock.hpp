#pragma once
// A manually advanced steady clock for hermetic tests: time moves only when a test says so.
// now() may be called from several threads at once (the memory store's shards do).

#include <atomic>
#include <chrono>
#include <functional>

namespace onceproxy::test {

class fake_clock {
public:
    using time_point = std::chrono::steady_clock::time_point;
    using duration = std::chrono::steady_clock::duration;

    /// Starts one hour after the epoch so that `now - lease` never underflows in tests.
    explicit fake_clock(time_point start = time_point{} + std::chrono::hours(1))
        : ticks_(start.time_since_epoch().count()) {}

    time_point now() const noexcept {
        return time_point{duration{ticks_.load(std::memory_order_acquire)}};
    }

    /// Moves time forward by `d` (never backwards: a steady clock).
    template <class Rep, class Period>
    void advance(std::chrono::duration<Rep, Period> d) noexcept {
        ticks_.fetch_add(std::chrono::duration_cast<duration>(d).count(),
                         std::memory_order_acq_rel);
    }

    /// A callable reading this clock; the clock must outlive it.
    std::function<time_point()> as_function() const {
        return [this] { return now(); };
    }

private:
    std::atomic<duration::rep> ticks_;
};

} // namespace onceproxy::test
