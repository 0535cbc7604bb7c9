#pragma once
// Process-wide log of when requests arrived, per Idempotency-Key (or X-Test-Fault-Id for a
// request without a key), shared by every worker thread: GET /__attempts?key=K lets a test
// measure the gaps between a client's retries as the upstream saw them.

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::test_upstream {

/// Arrival times (steady clock, milliseconds with fractions) per key, in arrival order. Bounded:
/// at most `max_keys` keys (a new key past it evicts the oldest one) and `max_per_key` times per
/// key (later arrivals are not logged). `reset()` clears it.
class attempt_log {
public:
    static constexpr std::size_t max_keys = 1000;
    static constexpr std::size_t max_per_key = 1000;

    /// The steady clock now, in milliseconds.
    static double now_ms() {
        return std::chrono::duration<double, std::milli>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }

    void record(std::string_view key, double at_ms) {
        std::lock_guard lock(mutex_);
        auto it = times_.find(key);
        if (it == times_.end()) {
            if (times_.size() >= max_keys) {
                times_.erase(order_.front());
                order_.pop_front();
            }
            it = times_.emplace(std::string(key), std::vector<double>{}).first;
            order_.push_back(it->first);
        }
        if (it->second.size() < max_per_key)
            it->second.push_back(at_ms);
    }

    /// Arrival times of `key` (empty if never seen, or evicted).
    std::vector<double> times(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = times_.find(key);
        return it == times_.end() ? std::vector<double>{} : it->second;
    }

    void reset() {
        std::lock_guard lock(mutex_);
        times_.clear();
        order_.clear();
    }

private:
    mutable std::mutex mutex_;
    std::map<std::string, std::vector<double>, std::less<>> times_;
    std::deque<std::string> order_; // keys in first-arrival order, for eviction
};

} // namespace onceproxy::test_upstream
