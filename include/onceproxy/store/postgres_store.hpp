#pragma once
// The PostgreSQL implementation of the store contract (SPEC §5), on the pg/ driver.
//
// Worker model, as redis_store: created with the worker executors, it keeps `pool` pipelined
// connections ON EACH worker; an operation uses a ready connection of the worker it is awaited
// on (round robin), so there is no lock and no thread hop on the hot path. From any other
// executor an operation fails with errc::unavailable.
//
// Data model: one row per key in the records table (src/store/postgres_sql.hpp has the schema,
// every statement and the reasoning); key_prefix + key is the row's key. Every operation is one
// prepared statement, one round trip, its own transaction; the server's clock decides expiry.
// A background sweep on the first worker deletes expired rows in bounded batches.
//
// Connections: each slot reconnects with exponential backoff (100 ms to 5 s, jittered) when
// its connection is lost. A URL with several hosts and target_session_attrs=read-write finds the
// primary after a failover; a connection that meets a read-only server (SQLSTATE 25006) is
// closed and re-opened. Sessions run at READ COMMITTED with the configured statement_timeout;
// the client waits statement_timeout + 1 s for an answer.
//
// Retries: a statement that met a serialization failure or a deadlock is sent again (at most 3
// times). A claim, complete, extend, inspect or ping whose answer was lost (connection lost,
// timeout) may have run: each is idempotent for its owner (a lost claim answers acquired again
// to the same owner token), so it is sent again once a connection is back, within
// connect_timeout. A release or purge whose answer was lost is not: the error is returned.
//
// Lifecycle (store.hpp): async_open() connects once on the calling executor and checks the
// schema (`migrate: auto` creates or upgrades it; `check` only reads its version), then starts
// the pools and the sweep. An unreachable server → degraded: the same check is retried in the
// background with backoff, and the pools start once it passes. A missing or older schema with
// `check`, a schema newer than this build, a role the server refuses (wrong password, no such
// role or database, no pg_hba entry) or a migration that fails → refuse to start.

#include "onceproxy/config/config.hpp"
#include "onceproxy/store/store.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::store {

class postgres_store final : public store {
public:
    /// Creates (but does not start) the pools. Throws std::invalid_argument with a clear message
    /// for a table name the config reader would refuse (start-up only). `workers` must not be
    /// empty; the executors must outlive the store's work (close()).
    postgres_store(const config::postgres_config& cfg,
                   std::vector<boost::asio::any_io_executor> workers);
    ~postgres_store() override;

    boost::asio::awaitable<open_report> async_open() override;
    void close() override;
    void set_password(std::string password) override;

    /// Claim-or-get: claim_sql (after lookup_sql when lookup_before_claim).
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
    boost::asio::awaitable<result<void>> async_ping() override;

    /// One sweep pass (what the background sweep runs each period): deletes expired rows in
    /// batches until a batch comes back short, at most 100 batches; returns the rows deleted.
    /// Awaited on a worker executor.
    boost::asio::awaitable<result<std::uint64_t>> async_sweep();

    /// The row key of store key `key` (key_prefix + key).
    std::string row_key(std::string_view key) const;

    /// Connections established so far on the worker of `ex` (tests, diagnostics).
    std::uint64_t connects(const boost::asio::any_io_executor& ex) const noexcept;

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace onceproxy::store
