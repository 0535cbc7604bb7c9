#pragma once
// The idempotency store contract (SPEC §5). Two implementations: memory_store (embedded, one
// process) and redis_store (shared by replicas). Both pass tests/conformance/store_suite.hpp.
//
// Every operation is one atomic step and, on Redis, one round trip. Record payloads are opaque
// bytes to the store (core/record_codec serialises them); the store keeps, per key:
//   owner token, fingerprint, state (in flight | completed), lease expiry or record TTL.
//
// Threading: a store object is shared by all workers; its operations may be awaited from any
// worker's executor concurrently. Operational failures (Redis down, timeout) come back as an
// error_code in the result, never as an exception.

#include <boost/asio/awaitable.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <cstdint>
#include <string>

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

struct claim_request {
    std::string key;         ///< store key (already a hash of prefix/route/principal/key)
    std::string fingerprint; ///< request fingerprint bytes
    std::string owner;       ///< unique owner token of this attempt
    duration lease{30'000};  ///< lease length if acquired
};

struct claim_result {
    claim_status status = claim_status::acquired;
    duration remaining_lease{0}; ///< in_flight: time until the lease lapses
    std::string record;          ///< completed: the payload given to complete()
};

/// How a fenced operation (complete, release, extend) went.
enum class fence_status {
    ok,        ///< done; the caller owned the lease
    not_owner, ///< the lease was lost (expired, taken over): nothing changed
};

class store {
public:
    virtual ~store() = default;

    /// Claim-or-get: takes a lease on a free key, or reports what is there.
    virtual boost::asio::awaitable<result<claim_result>> async_claim(claim_request req) = 0;

    /// Turns the caller's lease into a completed record with `payload`, kept for `ttl`.
    virtual boost::asio::awaitable<result<fence_status>>
    async_complete(std::string key, std::string owner, std::string payload, duration ttl) = 0;

    /// Deletes the caller's lease so a retry may execute.
    virtual boost::asio::awaitable<result<fence_status>> async_release(std::string key,
                                                                       std::string owner) = 0;

    /// Pushes the caller's lease expiry to now + `lease`.
    virtual boost::asio::awaitable<result<fence_status>>
    async_extend(std::string key, std::string owner, duration lease) = 0;

    /// Cheap liveness probe for /readyz (memory: always true).
    virtual boost::asio::awaitable<result<void>> async_ping() = 0;
};

} // namespace onceproxy::store
