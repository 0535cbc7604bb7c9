#pragma once
// Process-wide execution counters of the test upstream, shared by every worker thread.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace onceproxy::test_upstream {

/// Counts executions: a total (atomic, the unkeyed hot path takes no lock), one count per
/// Idempotency-Key and, for requests without a key, one count per X-Test-Fault-Id (both
/// mutex-protected; the fault ids are not reported by /__counts). Execution ids come from a
/// separate counter that `reset()` does not touch, so ids stay unique for the life of the process.
class execution_counts {
public:
    struct execution {
        std::uint64_t id = 0;  ///< process-unique sequence number (1, 2, ...)
        std::uint64_t nth = 0; ///< executions of the key (or fault id) since the last reset, this
                               ///< one included; 0 for a request with neither
    };

    /// Records one execution of a request with Idempotency-Key `key` (when `has_key`), else
    /// with X-Test-Fault-Id `fault_id` (when not empty).
    execution record(std::string_view key, bool has_key, std::string_view fault_id = {}) {
        total_.fetch_add(1, std::memory_order_relaxed);
        execution e;
        if (has_key || !fault_id.empty()) {
            std::lock_guard lock(mutex_);
            e.nth = bump(has_key ? keys_ : fault_ids_, has_key ? key : fault_id);
        }
        e.id = next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
        return e;
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
        fault_ids_.clear();
        total_.store(0, std::memory_order_relaxed);
    }

private:
    using count_map = std::map<std::string, std::uint64_t, std::less<>>;

    static std::uint64_t bump(count_map& counts, std::string_view name) {
        auto it = counts.find(name);
        if (it == counts.end())
            it = counts.emplace(std::string(name), 0).first;
        return ++it->second;
    }

    std::atomic<std::uint64_t> total_{0};
    std::atomic<std::uint64_t> next_id_{0};
    mutable std::mutex mutex_;
    count_map keys_;
    count_map fault_ids_;
};

} // namespace onceproxy::test_upstream
