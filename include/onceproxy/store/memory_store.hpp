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
// Memory budget (`max_bytes`): each entry is charged key + fingerprint + owner + holder +
// payload + `entry_overhead` bytes, to the whole store and to the entry's holder (the
// claim_request's `holder`: a principal, or the client address of an anonymous request).
//   - claim: admitted only if the new lease fits both in the holder's bound
//     (`max_bytes_per_holder`) and in `max_bytes`. Over its bound, the holder's own oldest
//     evictable records (non-2xx answers) are evicted until the lease fits; if its leases and
//     2xx records alone fill its bound, the claim is refused with errc::holder_full (that holder
//     only). A full store makes room in this order: (1) every shard is swept for expired
//     entries; (2) the oldest evictable records of the heaviest holder (most bytes charged
//     among the holders that have evictable records) are evicted, then those of the next
//     heaviest, until the lease fits. If only leases and 2xx records remain, the claim is
//     refused with errc::store_full and nothing changes.
//   - complete: the payload is charged to the holder without checking its bound (its lease
//     passed it), and must fit in `max_bytes` after the same steps (1) and (2); otherwise
//     errc::store_full, and the lease stays as it was (the caller answers unrecorded and may
//     retry while it owns the lease).
//   - Never evicted: in-flight leases and 2xx records (a retry could otherwise execute twice);
//     they stay until they expire, are released, or complete. An evicted non-2xx record is
//     forgotten: a retry of its request executes again. That is the price of a bounded store
//     shared by callers who do not trust each other; 2xx answers, whose repetition is the
//     harm this proxy prevents, are never traded for it.
//
// Lock order: a shard's mutex, then holders_mutex_ (never the other way, never two shards).

#include <onceproxy/store/store.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <queue>
#include <set>
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
    /// `max_bytes_per_holder` is clamped to `max_bytes`.
    memory_store(std::size_t max_bytes, std::size_t max_bytes_per_holder,
                 clock_fn now = &std::chrono::steady_clock::now);

    memory_store(const memory_store&) = delete;
    memory_store& operator=(const memory_store&) = delete;

    /// Nothing to connect: always opens, never degraded.
    boost::asio::awaitable<open_report> async_open() override;
    /// Nothing to stop: the records live as long as the object.
    void close() override;

    boost::asio::awaitable<result<claim_result>> async_claim(claim_request req) override;
    boost::asio::awaitable<result<fence_status>>
    async_complete(std::string_view key, std::string_view owner, std::string_view payload,
                   duration ttl, record_kind kind, claimed_lease claimed) override;
    boost::asio::awaitable<result<fence_status>> async_release(std::string_view key,
                                                               std::string_view owner) override;
    boost::asio::awaitable<result<fence_status>>
    async_extend(std::string_view key, std::string_view owner, duration lease) override;
    boost::asio::awaitable<result<key_info>> async_inspect(std::string key) override;
    boost::asio::awaitable<result<purge_status>> async_purge(std::string key, bool force) override;
    /// Always succeeds.
    boost::asio::awaitable<result<void>> async_ping() override;

    /// The synchronous operations behind the awaitables (same contracts), callable from any
    /// thread; the awaitables only wrap them.
    result<claim_result> claim(const claim_request& req);
    result<fence_status> complete(const std::string& key, const std::string& owner,
                                  std::string payload, duration ttl,
                                  record_kind kind = record_kind::kept);
    result<fence_status> release(const std::string& key, const std::string& owner);
    result<fence_status> extend(const std::string& key, const std::string& owner, duration lease);
    result<key_info> inspect(const std::string& key);
    result<purge_status> purge(const std::string& key, bool force);

    /// Bytes currently charged against the budget (entries not yet reaped included).
    std::size_t bytes_used() const noexcept { return used_.load(std::memory_order_relaxed); }
    std::size_t max_bytes() const noexcept { return max_bytes_; }
    std::size_t max_bytes_per_holder() const noexcept { return max_bytes_per_holder_; }
    /// Bytes charged to `holder` (0 when it holds nothing).
    std::size_t holder_bytes(const std::string& holder) const;
    /// Records evicted before their ttl ended, since the store was made.
    std::uint64_t evictions() const noexcept { return evictions_.load(std::memory_order_relaxed); }
    /// Number of stored entries, expired but not yet reaped ones included (locks every shard).
    std::size_t entry_count() const;
    /// Removes every expired entry (locks each shard in turn). Used when the budget is hit.
    void sweep_expired();

private:
    using time_point = std::chrono::steady_clock::time_point;

    struct entry {
        std::string fingerprint{};
        std::string owner{};
        std::string payload{};
        std::string holder{};
        bool completed = false;
        time_point expiry{};
        time_point claimed{};        ///< when the lease was taken (key administration: owner age)
        std::int64_t created_ms = 0; ///< claim_request::created_ms (or the system clock's)
        std::size_t charged = 0;     ///< bytes counted in used_ and in its holder's account
        bool evictable = false;      ///< completed with record_kind::evictable
        /// evictable: the entry's place in its holder's `evictable` list.
        std::list<std::string>::iterator evict_pos{};
    };

    /// What one holder holds (guarded by holders_mutex_); removed when it holds nothing.
    struct holder_account {
        std::size_t bytes = 0;
        /// Keys of its evictable records, oldest completion first.
        std::list<std::string> evictable;
    };
    using holder_map = std::unordered_map<std::string, holder_account>;
    /// Holders with evictable records by bytes charged (the last is the heaviest).
    using weight_index = std::set<std::pair<std::size_t, const std::string*>>;

    /// Why a charge was refused.
    enum class charge_status { ok, store_full, holder_full };

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
    /// Charges `bytes` to the store and to `holder` if both stay within their budgets (the
    /// holder's only when `check_holder`); otherwise changes nothing.
    charge_status try_charge(const std::string& holder, std::size_t bytes, bool check_holder);
    /// Gives back an entry's charge and drops it from its holder's evictable list.
    void uncharge(const entry& e);
    /// The store lacked room (`why`) for `bytes` more of `holder`: makes some, in the documented
    /// order (`swept`: step 1 is done). False when nothing more can be freed.
    bool make_room(charge_status why, const std::string& holder, std::size_t bytes, bool& swept);
    /// Evicts the oldest evictable record of `holder`, or of the heaviest holder when null;
    /// false when there is none.
    bool evict_one(const std::string* holder);
    /// (holders_mutex_ held) Moves `account`'s place in weights_ after `change` ran on it.
    template <class F>
    void reweigh(holder_map::iterator account, F change);

    std::size_t max_bytes_;
    std::size_t max_bytes_per_holder_;
    clock_fn now_;
    std::atomic<std::size_t> used_{0};
    std::atomic<std::uint64_t> evictions_{0};
    std::array<shard, shard_count> shards_;
    mutable std::mutex holders_mutex_;
    holder_map holders_;
    weight_index weights_;
};

} // namespace onceproxy::store
