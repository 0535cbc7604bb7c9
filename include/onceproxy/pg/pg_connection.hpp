#pragma once
// One PostgreSQL connection on an Asio executor, in libpq's pipeline mode (libpq >= 14).
//
// - Nothing blocks and no thread is used per query: libpq connects with PQconnectStartParams /
//   PQconnectPoll and sends and reads in non-blocking mode; the driver waits for its socket
//   (PQsocket) to be readable or writable through Asio, and never reads it itself.
// - Many statements in flight: each async_exec hands its statement to libpq at once; the
//   statements of one event-loop turn are closed by one Sync (PQpipelineSync) and go out in one
//   write. While a batch is in flight, new statements wait and go out together as the next
//   batch when its Sync result arrives: the server commits them in one transaction, so one WAL
//   flush serves them all (under load, the batch grows instead of the queue of commits).
//   Results are matched to the statements in order.
// - The statements between two Syncs run in one implicit transaction on the server: an error
//   in one rolls back those before it and skips those after it. The driver hides this: it
//   hands a statement's success to its caller only once the Sync confirmed the commit, and
//   sends the statements of a failed batch that were rolled back or skipped again in the next
//   batch, so every statement behaves as if run on its own (autocommit). So each statement is
//   its own transaction: BEGIN ... COMMIT spread over several calls is not supported (a
//   rolled-back BEGIN would be sent again), nor are statements that cannot run in a
//   transaction block (CREATE DATABASE, VACUUM).
// - Prepared statements (pg_connection_options::statements) are prepared on every new
//   connection, in the pipeline, before it is ready.
// - Every statement is bounded by command_timeout; one not answered in time fails with
//   errc::timeout and closes the connection (a late result could no longer be matched), failing
//   every other pending statement with errc::connection_lost. A lost connection does the same.
//   The connection is not re-opened by itself: call async_connect again.
//
// Threading: a pg_connection belongs to ONE executor (a worker's io_context, single-threaded);
// call it on that executor's thread only. The handle is cheap to move; the shared state lives
// until its last coroutine finishes, so destroying the handle while statements are pending is
// safe (they fail with errc::connection_lost).

#include "onceproxy/pg/error.hpp"
#include "onceproxy/pg/pg_result.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace onceproxy::pg {

/// A statement prepared on every connection under `name`.
struct pg_statement {
    std::string name;
    std::string sql; ///< one statement, parameters $1, $2, ... (types inferred by the server)
};

struct pg_connection_options {
    /// libpq connection string: a URL (postgresql://user:pw@host:port/db?...) or key=value
    /// pairs. Several hosts with target_session_attrs=read-write find the primary.
    std::string conninfo;
    /// More libpq connection parameters (keyword, value), applied after conninfo's and winning
    /// over them: a password kept out of the URL, sslmode, options, application_name.
    std::vector<std::pair<std::string, std::string>> settings;
    std::chrono::milliseconds connect_timeout{2'000}; ///< the whole attempt, statements prepared
    std::chrono::milliseconds command_timeout{1'000}; ///< each statement, from issue to result
    std::vector<pg_statement> statements;
};

/// Outcome of a connection attempt, with a message for an operator.
struct pg_connect_report {
    /// Empty on success; errc::connect_failed (libpq's or the server's reason in `message`) or
    /// errc::timeout (connect_timeout elapsed).
    boost::system::error_code ec;
    std::string message;
};

class pg_connection {
public:
    using executor_type = boost::asio::any_io_executor;

    /// An idle connection bound to `ex`; no I/O until async_connect().
    pg_connection(executor_type ex, pg_connection_options options);
    /// Calls close().
    ~pg_connection();
    pg_connection(pg_connection&&) noexcept;
    pg_connection& operator=(pg_connection&&) noexcept;

    const executor_type& get_executor() const noexcept;

    /// Connects (closing the current connection first, if any), enters pipeline mode and
    /// prepares options.statements, all within connect_timeout. Runs on the executor.
    boost::asio::awaitable<pg_connect_report> async_connect();

    /// Runs the prepared statement `statement` with `params` and returns its result, at most
    /// command_timeout after the call. errc::not_connected at once when not ready.
    boost::asio::awaitable<pg_result> async_exec(std::string statement,
                                                 std::vector<pg_param> params = {},
                                                 pg_format result_format = pg_format::text);

    /// As async_exec, for one SQL statement not prepared beforehand (the unnamed statement).
    boost::asio::awaitable<pg_result> async_query(std::string sql,
                                                  std::vector<pg_param> params = {},
                                                  pg_format result_format = pg_format::text);

    /// Closes the connection; pending statements fail with errc::connection_lost and a
    /// connection attempt under way with errc::connect_failed.
    void close();

    /// True when statements can be sent now.
    bool ready() const noexcept;

    /// How many connections were established so far.
    std::uint64_t connect_count() const noexcept;

    /// How many batches (Syncs) were sent so far: the statements of one event-loop turn share
    /// one, and go out in one write.
    std::uint64_t sync_count() const noexcept;

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace onceproxy::pg
