#pragma once
// The idempotency store contract (SPEC §5). Two implementations: memory_store (embedded, one
// process) and redis_store (shared by replicas). Both pass tests/conformance/store_suite.hpp.
//
// Every operation is one atomic step and, on Redis, one round trip (a claim that finds a key in
// flight reads its remaining lease in a second one). Record payloads are opaque
// bytes to the store (core/record_codec serialises them); the store keeps, per key:
//   owner token, fingerprint, state (in flight | completed), lease expiry or record TTL.
//
// Lifecycle (app/): construct → co_await async_open() once, before serving (refuse to start
// only when it reports an error) → serve → close() before the worker loops are torn down →
// destroy once the worker threads have been joined. A store that cannot reach its backend at
// start opens degraded: it keeps trying in the background, and operations fail with
// errc::unavailable until it answers (routes follow on_store_error meanwhile; issue 9).
//
// Threading: a store object is shared by all workers; its operations may be awaited from any
// worker's executor concurrently. Operational failures (Redis down, timeout) come back as an
// error_code in the result, never as an exception.
//
// The request path's operations (claim, complete, release, extend) take views of the caller's
// bytes (key, owner, fingerprint, record): the caller keeps them alive until the operation's
// result is back (co_awaits it at once, as the exchange does). A store keeps no view beyond the
// operation: what it stores or sends, it copies.

#include "onceproxy/redis/master_switch_cause.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::store {

using duration = std::chrono::milliseconds;
template <class T>
using result = boost::system::result<T>;

/// What a claim found, decided atomically with taking the lease.
enum class claim_status {
    acquired,  ///< the key was free: the caller now holds the lease
    in_flight, ///< another owner holds a lease, same fingerprint
    completed, ///< a record exists with the same fingerprint: replay it
    mismatch,  ///< a lease or record exists with a different fingerprint
};

/// Views of the caller's bytes (see above).
struct claim_request {
    std::string_view key;         ///< store key (already a hash of prefix/route/principal/key)
    std::string_view fingerprint; ///< request fingerprint bytes
    std::string_view owner;       ///< unique owner token of this attempt
    duration lease{30'000};       ///< lease length if acquired
    /// Who the entry is charged to, for the memory store's per-holder bound: a hash of the
    /// principal, or the client address of an anonymous request. The Redis store ignores it.
    std::string_view holder{};
    /// When the claim was made (ms since the Unix epoch), stored beside the record and bound
    /// into a sealed record's authenticated data; 0: the store's own clock.
    std::int64_t created_ms = 0;
};

/// What the caller's claim wrote, for complete: the claim's fingerprint and created_ms, as given
/// to async_claim (a nonzero created_ms). The Redis store rebuilds the exact lease value from
/// them, so that its script compares the lease whole. Unknown (created_ms 0, e.g. `{}`): the
/// lease is matched by its owner alone, with the same outcome. The memory and PostgreSQL stores
/// ignore it.
struct claimed_lease {
    std::string_view fingerprint;
    std::int64_t created_ms = 0;
};

/// What kind of answer a completed record holds, for the memory store's eviction order.
enum class record_kind {
    kept,     ///< a 2xx answer, or an uncertain outcome: never evicted before its ttl ends
    evictable ///< any other answer: may be evicted when the store or its holder is full
};

struct claim_result {
    claim_status status = claim_status::acquired;
    duration remaining_lease{0}; ///< in_flight: time until the lease lapses
    std::string record;          ///< completed: the payload given to complete()
    std::int64_t created_ms = 0; ///< completed: the claim's created_ms, as stored beside it
    /// Round trips the claim took: 1, except where the store must read twice (Redis: an
    /// in-flight key's remaining lease, a record of an earlier layout).
    unsigned round_trips = 1;
};

/// How a fenced operation (complete, release, extend) went.
enum class fence_status {
    ok,        ///< done; the caller owned the lease
    not_owner, ///< the lease was lost (expired, taken over): nothing changed
};

/// What an operator's look-up found under one key (key administration, SPEC §6).
enum class key_state {
    absent,    ///< nothing: no lease, no record (or only expired ones)
    in_flight, ///< a lease is held
    completed, ///< a record is kept
};

struct key_info {
    key_state state = key_state::absent;
    /// in_flight: time until the lease lapses; completed: time until the record expires.
    duration remaining{0};
    /// in_flight: time since the lease was taken; negative when the store does not know (a
    /// lease taken by a version that did not note it).
    duration owner_age{-1};
    std::string record; ///< completed: the payload given to complete()
    /// completed: what is stored beside the record (a sealed record is bound to them; 0 and
    /// empty for a record of Redis layout 1).
    std::string fingerprint{};
    std::int64_t created_ms = 0;
};

/// What a purge did.
enum class purge_status {
    absent,        ///< nothing to purge
    purged_record, ///< a completed record was deleted
    purged_lease,  ///< a held lease was deleted (forced): its owner is fenced
    in_flight,     ///< refused: a lease is held and the purge was not forced; nothing changed
};

/// How opening a store went, for the operator.
struct open_report {
    /// Empty: the store may be used (perhaps degraded). Set: refuse to start; the setting or
    /// backend would break the contract (a wrong password, an evicting Redis with
    /// maxmemory_policy refuse). Never set merely because the backend is unreachable.
    boost::system::error_code ec;
    std::string message; ///< why it failed, or why it is degraded; empty otherwise
    /// The backend did not answer: the store started anyway and reconnects with backoff.
    bool degraded = false;
    std::vector<std::string> warnings; ///< for the log
};

/// What moved a store to another master (Redis behind Sentinel): the driver's own enum, the
/// `cause` label of onceproxy_store_master_switches_total.
using redis::master_switch_cause;
using redis::master_switch_cause_count;

class store {
public:
    virtual ~store() = default;

    /// Connects (bounded by the store's connect timeout) and starts whatever keeps the store
    /// usable (reconnects, health checks). Call once, before serving, from any executor.
    virtual boost::asio::awaitable<open_report> async_open() = 0;

    /// Stops the background work and closes connections; pending operations fail with
    /// errc::unavailable. Thread-safe; call once, while the worker loops still run.
    virtual void close() = 0;

    /// A new password (a reload read a changed `password_file`): connections made from now on
    /// authenticate with it; those open stay as they are. Thread-safe. A store without
    /// credentials ignores it.
    virtual void set_password(std::string password) { (void)password; }

    /// True when the store follows a master that can move (Redis behind Sentinel): it then
    /// calls the function given to set_master_switch_observer on each move.
    virtual bool follows_master() const noexcept { return false; }

    /// `observer` is called (from any worker thread, one call at a time) each time the store
    /// moves to another master, with the cause. Call before async_open(); the function must
    /// outlive the store's work (close()).
    virtual void set_master_switch_observer(std::function<void(master_switch_cause)> observer) {
        (void)observer;
    }

    /// Claim-or-get: takes a lease on a free key, or reports what is there.
    virtual boost::asio::awaitable<result<claim_result>> async_claim(claim_request req) = 0;

    /// Turns the caller's lease into a completed record with `payload`, kept for `ttl` (the
    /// memory store may evict a record of `kind` evictable earlier; the Redis store ignores it).
    /// `claimed`: what the caller's claim wrote, or `{}` when unknown (see claimed_lease).
    virtual boost::asio::awaitable<result<fence_status>>
    async_complete(std::string_view key, std::string_view owner, std::string_view payload,
                   duration ttl, record_kind kind, claimed_lease claimed) = 0;

    /// Deletes the caller's lease so a retry may execute.
    virtual boost::asio::awaitable<result<fence_status>> async_release(std::string_view key,
                                                                       std::string_view owner) = 0;

    /// Pushes the caller's lease expiry to now + `lease`.
    virtual boost::asio::awaitable<result<fence_status>>
    async_extend(std::string_view key, std::string_view owner, duration lease) = 0;

    /// Key administration: what is stored under `key`, read in one atomic step; changes nothing.
    virtual boost::asio::awaitable<result<key_info>> async_inspect(std::string key) = 0;

    /// Key administration: deletes the record or lease under `key`, in one atomic step. A held
    /// lease is deleted only with `force`; its owner is then fenced: its later complete, extend
    /// and release answer not_owner and re-create nothing, so a retry executes again.
    virtual boost::asio::awaitable<result<purge_status>> async_purge(std::string key,
                                                                     bool force) = 0;

    /// Health: a cheap liveness probe for /readyz, on the calling worker's connection
    /// (memory: always answers).
    virtual boost::asio::awaitable<result<void>> async_ping() = 0;
};

} // namespace onceproxy::store
