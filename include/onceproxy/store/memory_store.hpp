#pragma once
// The embedded store (SPEC §5 "memory"): one process only, forgotten at exit. Same semantics as
// redis_store: leases, record TTLs, fencing by owner token, fingerprint mismatch detection; it
// passes tests/conformance/store_suite.hpp.
//
// Threading: shared by every worker. Keys are spread over `shard_count` shards by hash; each
// shard has its own mutex and map, held only for a short critical section (never across a
// suspension point). Every async_* completes synchronously: the awaitable finishes without
// suspending, on the awaiting coroutine's executor.
//
// Expiry: an expired lease or record is absent. It is removed lazily when its key is touched,
// and incrementally: every operation on a shard first removes up to `reap_per_operation`
// already-expired entries of that shard (a min-heap of expiry times). There is no background
// thread and no full scan on the hot path.
//
// Memory budget (`max_bytes`): each entry is charged key + fingerprint + owner + payload +
// `entry_overhead` bytes. The rule, checked atomically against one process-wide counter:
//   - claim: admitted only if the new lease fits in the budget. If it does not, every shard is
//     swept for expired entries (slow path, only when full) and the claim is tried once more;
//     if it still does not fit, it is refused with errc::store_full and nothing changes.
//   - complete: the payload is admitted if the lease's charge plus the payload fits in the
//     budget (after the same sweep); otherwise errc::store_full, and the lease stays as it was
//     (the caller answers unrecorded and may retry while it owns the lease).
//   - Nothing live is ever evicted: in-flight leases and unexpired records stay until they
//     expire, are released, or complete. A full store therefore refuses new keys (the route's
//     on_store_error decides: 503 or unprotected passthrough) rather than forgetting a record
//     and allowing a second execution.

#include <onceproxy/store/store.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

namespace onceproxy::store {

class memory_store final : public store {
public:
    using clock_fn = std::function<std::chrono::steady_clock::time_point()>;

    static constexpr std::size_t shard_count = 64;
    static constexpr std::size_t reap_per_operation = 8;
    /// Bytes charged per entry on top of its strings (map node, heap entry, bookkeeping).
    static constexpr std::size_t entry_overhead = 160;

    /// `now` is read on every operation, from any thread (tests pass a fake clock).
    explicit memory_store(std::size_t max_bytes, clock_fn now = &std::chrono::steady_clock::now);

    memory_store(const memory_store&) = delete;
    memory_store& operator=(const memory_store&) = delete;

    /// Nothing to connect: always opens, never degraded.
    boost::asio::awaitable<open_report> async_open() override;
    /// Nothing to stop: the records live as long as the object.
    void close() override;

    boost::asio::awaitable<result<claim_result>> async_claim(claim_request req) override;
    boost::asio::awaitable<result<fence_status>>
    async_complete(std::string key, std::string owner, std::string payload, duration ttl) override;
    boost::asio::awaitable<result<fence_status>> async_release(std::string key,
                                                               std::string owner) override;
    boost::asio::awaitable<result<fence_status>> async_extend(std::string key, std::string owner,
                                                              duration lease) override;
    boost::asio::awaitable<result<key_info>> async_inspect(std::string key) override;
    boost::asio::awaitable<result<purge_status>> async_purge(std::string key, bool force) override;
    /// Always succeeds.
    boost::asio::awaitable<result<void>> async_ping() override;

    /// The synchronous operations behind the awaitables (same contracts), callable from any
    /// thread; the awaitables only wrap them.
    result<claim_result> claim(const claim_request& req);
    result<fence_status> complete(const std::string& key, const std::string& owner,
                                  std::string payload, duration ttl);
    result<fence_status> release(const std::string& key, const std::string& owner);
    result<fence_status> extend(const std::string& key, const std::string& owner, duration lease);
    result<key_info> inspect(const std::string& key);
    result<purge_status> purge(const std::string& key, bool force);

    /// Bytes currently charged against the budget (entries not yet reaped included).
    std::size_t bytes_used() const noexcept { return used_.load(std::memory_order_relaxed); }
    std::size_t max_bytes() const noexcept { return max_bytes_; }
    /// Number of stored entries, expired but not yet reaped ones included (locks every shard).
    std::size_t entry_count() const;
    /// Removes every expired entry (locks each shard in turn). Used when the budget is hit.
    void sweep_expired();

private:
    using time_point = std::chrono::steady_clock::time_point;

    struct entry {
        std::string fingerprint;
        std::string owner;
        std::string payload;
        bool completed = false;
        time_point expiry;
        time_point claimed;      ///< when the lease was taken (key administration: owner age)
        std::size_t charged = 0; ///< bytes counted in used_ for this entry
    };

    struct expiry_item {
        time_point expiry;
        std::string key;
        bool operator>(const expiry_item& other) const noexcept { return expiry > other.expiry; }
    };

    struct shard {
        mutable std::mutex mutex;
        std::unordered_map<std::string, entry> entries;
        /// Min-heap of (expiry, key); an item is stale when the entry's expiry changed since.
        std::priority_queue<expiry_item, std::vector<expiry_item>, std::greater<>> expiries;
    };

    shard& shard_for(const std::string& key) noexcept;
    /// Pops up to `limit` due heap items of `s` (lock held), erasing entries that expired.
    void reap(shard& s, time_point now, std::size_t limit);
    /// The live entry for `key`, or nullptr; an expired entry is erased first (lock held).
    entry* find_live(shard& s, const std::string& key, time_point now);
    void erase(shard& s, std::unordered_map<std::string, entry>::iterator it);
    /// Adds `bytes` to used_ if the total stays within max_bytes_.
    bool try_charge(std::size_t bytes) noexcept;
    void uncharge(std::size_t bytes) noexcept;

    std::size_t max_bytes_;
    clock_fn now_;
    std::atomic<std::size_t> used_{0};
    std::array<shard, shard_count> shards_;
};

} // namespace onceproxy::store
