#pragma once
// Process-wide execution counters of the test upstream, shared by every worker thread.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace onceproxy::test_upstream {

/// Counts executions: a total (atomic, the unkeyed hot path takes no lock) and one count per
/// Idempotency-Key (mutex-protected). Execution ids come from a separate counter that `reset()`
/// does not touch, so ids stay unique for the life of the process.
class execution_counts {
public:
    /// Records one execution; returns its process-unique sequence number (1, 2, ...).
    std::uint64_t record(std::string_view key, bool has_key) {
        total_.fetch_add(1, std::memory_order_relaxed);
        if (has_key) {
            std::lock_guard lock(mutex_);
            auto it = keys_.find(key);
            if (it == keys_.end())
                keys_.emplace(std::string(key), 1);
            else
                ++it->second;
        }
        return next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
    }

    /// Executions of `key` since the last reset (0 if never seen).
    std::uint64_t count(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = keys_.find(key);
        return it == keys_.end() ? 0 : it->second;
    }

    std::uint64_t total() const { return total_.load(std::memory_order_relaxed); }

    /// Copy of the per-key counts, ordered by key.
    std::map<std::string, std::uint64_t, std::less<>> keys() const {
        std::lock_guard lock(mutex_);
        return keys_;
    }

    void reset() {
        std::lock_guard lock(mutex_);
        keys_.clear();
        total_.store(0, std::memory_order_relaxed);
    }

private:
    std::atomic<std::uint64_t> total_{0};
    std::atomic<std::uint64_t> next_id_{0};
    mutable std::mutex mutex_;
    std::map<std::string, std::uint64_t, std::less<>> keys_;
};

} // namespace onceproxy::test_upstream
