#pragma once
// The Redis implementation of the store contract (SPEC §5).
//
// Worker model: the store is created with the list of worker executors (one io_context per
// worker thread) and opens `connections_per_worker` pipelined connections ON EACH of them. An
// operation looks up the connection of the executor it is awaited on
// (`co_await this_coro::executor`, matched by execution context) and round-robins between that
// worker's connections: no lock and no thread hop on the hot path. Precondition: every
// operation is awaited from a coroutine running on one of those executors, and each executor's
// context is run by one thread; from any other executor an operation fails with
// errc::unavailable.
//
// Lifecycle (app/, through the store interface): construct with the worker executors →
// co_await async_open() (check, then start; refuse to start on an error only) → serve → stop()
// before the worker loops are torn down (the connections keep their loops busy: reader, writer,
// health timer) → destroy once the worker threads have been joined.
//
// Cluster mode (`cluster.nodes` set instead of `url`): each worker has a redis_cluster router
// (redis_cluster.hpp) instead of plain connections; an operation goes to the master of its
// key's hash slot. Every script touches exactly one key (KEYS[1]), so it runs on one node.
//
// Data model (Cluster-ready: every command and script touches only KEYS[1]): one Redis string
// per idempotency key, named key_prefix + key, whose value is laid out by redis_record.hpp
// (version, state in flight | completed, owner token, fingerprint, claim time, then the
// payload once completed). A claim is one native SET key value NX PX lease GET; the fenced
// writes (complete, release, extend) and key administration are one EVALSHA each, matching a
// lease by the prefix of its value. A record of layout version 1 (a hash, written by an
// earlier version) is still read. Redis's own expiry (PEXPIRE) ends leases and records: no
// cleanup job. Scripts are loaded with SCRIPT LOAD on every connect; a NOSCRIPT reply
// (restart, failover, SCRIPT FLUSH) is answered by one EVAL of the same script, which also
// reloads it.
//
// The driver (connection, Cluster router, Sentinel discovery) is the redis/ module; this
// header names its types only for the diagnostics hooks below.

#include "onceproxy/config/config.hpp"
#include "onceproxy/store/store.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/system/error_code.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

// The driver (include/onceproxy/redis/), named here only by the diagnostics hooks below.
namespace onceproxy::redis {
class redis_client;
class redis_route;
class redis_sentinel;
} // namespace onceproxy::redis

namespace onceproxy::store {

/// Result of the start-up check, for the operator.
struct redis_startup_report {
    /// Empty: usable. Otherwise the connection error (errc::unavailable, timeout,
    /// auth_failed, protocol) or boost::system::errc::operation_not_permitted when
    /// maxmemory-policy is allkeys-* and the config says `refuse`.
    boost::system::error_code ec;
    std::string message;               ///< why it failed, naming host:port; empty on success
    std::vector<std::string> warnings; ///< for the caller to log
};

class redis_store final : public store {
public:
    /// Creates (but does not start) the per-worker connections. Throws std::invalid_argument
    /// with a clear message when `cfg.url` is invalid (start-up only). `workers` must not be
    /// empty; the executors must outlive the store.
    redis_store(const config::redis_config& cfg, std::vector<boost::asio::any_io_executor> workers);

    /// Precondition: the workers' io_contexts are stopped (or not running concurrently).
    ~redis_store() override;

    /// Starts every connection on its worker executor (connect, then reconnect with backoff
    /// forever), and with Sentinel the watch of +switch-master on the first worker's executor
    /// (redis_sentinel.hpp). Thread-safe (posts to each executor).
    void start();

    /// Closes every connection and ends the Sentinel watch; pending operations fail with
    /// errc::unavailable. Thread-safe (posts to each executor).
    void stop();

    /// The store lifecycle (store.hpp): async_check_startup(), then start(). Unreachable or
    /// timed out → degraded: started anyway, and the maxmemory-policy check runs once Redis
    /// answers (a refusal found then takes the store out of service, logged). A wrong password,
    /// a refused SELECT or an evicting Redis with `refuse` → error.
    boost::asio::awaitable<open_report> async_open() override;

    /// stop().
    void close() override;

    /// True with Sentinel (`sentinel` set): the store follows the master's moves.
    bool follows_master() const noexcept override;

    /// Sentinel: `observer` counts the moves (redis_sentinel.hpp). Otherwise ignored.
    void set_master_switch_observer(std::function<void(master_switch_cause)> observer) override;

    /// Sentinel: the discovery and watch shared by every connection (tests, diagnostics);
    /// nullptr otherwise.
    redis::redis_sentinel* sentinel() noexcept;

    /// Posts the password to every connection's executor (used from their next reconnect) and
    /// to the first one's for the start-up check's copy. Thread-safe.
    void set_password(std::string password) override;

    /// Start-up check on a one-shot connection of the calling executor (any executor): connects
    /// (bounded by connect_timeout: an unreachable Redis or a wrong password gives a clear error
    /// quickly), loads the scripts, and reads `CONFIG GET maxmemory-policy`. allkeys-* with
    /// maxmemory_policy refuse → error; with warn → warning. CONFIG refused → warning.
    boost::asio::awaitable<redis_startup_report> async_check_startup();

    /// Claim-or-get in one EVALSHA. A claim whose reply was lost after it was written
    /// (timeout, disconnect) is resolved by reading the record's owner once the connection is
    /// back (at most connect_timeout): our token → acquired; otherwise the original error.
    /// Errors: errc::unavailable, timeout, protocol (unexpected reply), script_missing.
    boost::asio::awaitable<result<claim_result>> async_claim(claim_request req) override;

    /// One EVALSHA; ok also when the same owner already completed it (lost reply, retried).
    boost::asio::awaitable<result<fence_status>>
    async_complete(std::string_view key, std::string_view owner, std::string_view payload,
                   duration ttl, record_kind kind, claimed_lease claimed) override;

    /// One EVALSHA; deletes the record only if it is a lease held by `owner`.
    boost::asio::awaitable<result<fence_status>> async_release(std::string_view key,
                                                               std::string_view owner) override;

    /// One EVALSHA; sets the lease expiry to now + lease only if `owner` holds it.
    boost::asio::awaitable<result<fence_status>>
    async_extend(std::string_view key, std::string_view owner, duration lease) override;

    /// One EVALSHA (reads the record, its PTTL, and the lease's claim time against Redis's
    /// clock, so the owner age does not depend on the proxy's clock).
    boost::asio::awaitable<result<key_info>> async_inspect(std::string key) override;

    /// One EVALSHA; refuses a held lease unless `force`.
    boost::asio::awaitable<result<purge_status>> async_purge(std::string key, bool force) override;

    /// PING on the calling worker's connection.
    boost::asio::awaitable<result<void>> async_ping() override;

    /// The connection an operation awaited on `ex` would use next (tests, diagnostics);
    /// nullptr if `ex` is not a worker executor, and in Cluster mode.
    redis::redis_client* client_for(const boost::asio::any_io_executor& ex) noexcept;

    /// The Redis key that holds the record of store key `key` (key_prefix + key).
    std::string redis_key(std::string_view key) const;

    struct impl;

private:
    boost::asio::awaitable<void> deferred_check();
    /// A claim that met a record of layout version 1 (a hash, written by an earlier version).
    boost::asio::awaitable<result<claim_result>>
    claim_v1(redis::redis_route& c, const std::string& key, const claim_request& req);
    /// A claim whose reply was lost after it was written (`ec`: timeout or a lost connection):
    /// it may have taken effect, so it is never sent again blindly; the key is read instead,
    /// and our own in-flight value means the claim is ours. Else `ec`. `round_trips`: those
    /// made before the read (which adds one, and a WAIT one more).
    boost::asio::awaitable<result<claim_result>>
    recover_lost_claim(redis::redis_route& c, const std::string& key, const claim_request& req,
                       boost::system::error_code ec, unsigned round_trips);

    std::unique_ptr<impl> impl_;
};

} // namespace onceproxy::store
