#pragma once
// An Asio-native, pipelined Redis connection (SPEC §5), modelled on Boost.Redis's multiplexer.
//
// - The socket is ours (plain TCP, or TLS through asio::ssl for rediss://); hiredis's reply
//   reader decodes, inside the .cpp, and commands are encoded straight from the caller's
//   argument views (redis_args) into the write buffer.
// - Many commands in flight: every request joins a FIFO of pending requests, and replies are
//   matched to it in order. Commands issued in one event-loop turn leave in one write. That
//   pipeline is an I/O-free component (src/redis/redis_multiplexer.hpp); the socket code here
//   only moves bytes.
// - Nothing blocks: the transport (resolve, connect, TLS handshake) and then the handshake
//   (AUTH, SELECT, SCRIPT LOAD) are async and bounded together by connect_timeout; every
//   command is bounded by command_timeout.
// - A command not answered in time fails with errc::timeout, and the connection is closed and
//   re-opened: on a pipelined connection a late reply could no longer be matched safely. Every
//   other pending command then fails with errc::unavailable.
// - start() keeps the connection open: reconnect with exponential backoff and jitter, and a
//   PING every health_check_interval (a failed PING closes and reconnects).
//
// Threading: a redis_client belongs to ONE executor (a worker's io_context, single-threaded).
// Every member function must be called on that executor's thread (or before it runs); the
// object does no locking. The handle is cheap to move; the shared state lives until its last
// coroutine finishes, so destroying the handle while operations are pending is safe.

#include "onceproxy/redis/redis_args.hpp"
#include "onceproxy/redis/redis_reply.hpp"
#include "onceproxy/redis/redis_url.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace onceproxy::redis {

/// Where to connect, as an address source yields it (see redis_client_options::address_source).
struct redis_address {
    boost::system::error_code ec; ///< set: no address (the attempt fails with it and `message`)
    std::string message;
    std::string host;
    std::uint16_t port = 0;
};

struct redis_client_options {
    redis_url url;
    /// When set, asked at every connection attempt for the host and port to connect to (they
    /// replace url.host and url.port; the other url fields stay), e.g. a Sentinel discovery.
    /// The connection must then be to a master: ROLE is checked after AUTH, and a -READONLY
    /// reply closes the connection, so the next attempt asks the source again.
    std::function<boost::asio::awaitable<redis_address>()> address_source;
    /// When set, called on the client's executor each time the started client (start()) has a
    /// new connection ready: where it is, and whether the connection before it was closed by a
    /// -READONLY reply (a demoted master). Lets a Sentinel store see the master change.
    std::function<void(const redis_address& at, bool after_readonly)> on_connected;
    /// Subscriber connections (SUBSCRIBE): when set, each pub/sub message (["message", channel,
    /// payload] ...) is handed to it on the client's executor, in order; unset, a message is a
    /// reply nobody asked for, which closes the connection.
    std::function<void(redis_reply)> on_message;
    std::string tls_ca_file; ///< rediss://: CA bundle (PEM); empty = system default paths
    std::chrono::milliseconds connect_timeout{500};         ///< whole connect + TLS + AUTH + SELECT
    std::chrono::milliseconds command_timeout{250};         ///< each command, from issue to reply
    std::chrono::milliseconds health_check_interval{5'000}; ///< 0 = no health check
    std::chrono::milliseconds reconnect_min{50};            ///< first backoff delay
    std::chrono::milliseconds reconnect_max{2'000};         ///< backoff cap
    /// A connection that was up at least this long and is lost (closed by the peer, a master
    /// switch, -READONLY; not a command timeout) is re-opened at once, without backoff, and
    /// commands issued meanwhile wait for that attempt (at most command_timeout) instead of
    /// failing. A shorter-lived one backs off, so a server that drops every connection is not
    /// hammered. Zero or less: always back off.
    std::chrono::milliseconds stable_connection{1'000};
    /// Lua scripts loaded with SCRIPT LOAD on every (re)connect, before the connection is
    /// declared ready (so EVALSHA normally finds them after a restart or failover).
    std::vector<std::string> scripts;
};

/// Outcome of one command.
struct redis_exec_result {
    /// Empty on a reply (which may be an error reply: check reply.is_error()). Otherwise
    /// errc::unavailable (not connected, or the connection was lost before the reply),
    /// errc::timeout (no reply within command_timeout) or errc::protocol (malformed reply).
    boost::system::error_code ec;
    /// True once the command may have reached Redis (it was handed to a write). A failed
    /// command with written == false certainly had no effect.
    bool written = false;
    redis_reply reply;
};

/// Outcome of one connection attempt, with a message for an operator.
struct redis_connect_report {
    /// Empty on success; errc::unavailable (resolve, connect, closed), errc::tls_failed (TLS
    /// handshake refused or CA file unreadable),
    /// errc::timeout (connect_timeout elapsed), errc::auth_failed (AUTH refused),
    /// errc::protocol (SELECT or SCRIPT LOAD refused, or a malformed reply).
    boost::system::error_code ec;
    std::string message; ///< e.g. "AUTH to 127.0.0.1:6379 refused: WRONGPASS ..."
};

class redis_client {
public:
    using executor_type = boost::asio::any_io_executor;

    /// Creates an idle client bound to `ex`. No I/O until start() or async_connect_once().
    redis_client(executor_type ex, redis_client_options options);
    /// Calls stop().
    ~redis_client();
    redis_client(redis_client&&) noexcept;
    redis_client& operator=(redis_client&&) noexcept;

    const executor_type& get_executor() const noexcept;

    /// Spawns the connection loop on the executor: connect, and after any loss reconnect with
    /// exponential backoff (reconnect_min doubling to reconnect_max, each delay drawn in [d/2, d]),
    /// forever until stop(); the first attempt after losing a stable connection goes at once
    /// (see stable_connection). Call once.
    void start();

    /// Closes the connection, fails pending commands with errc::unavailable and ends the loop.
    void stop();

    /// Closes the open connection (pending commands fail with errc::unavailable); a started
    /// client reconnects (asking its address_source again). Call on the client's executor.
    void drop_connection();

    /// Closes the open connection, as drop_connection() does, and an attempt still under way,
    /// unless they are to host:port (the address of the latest attempt). Call on the client's
    /// executor.
    /// A client waiting out its reconnect backoff (after failed attempts, e.g. towards a master
    /// that died) tries again at once, its backoff started over.
    void drop_connection_unless_at(const std::string& host, std::uint16_t port);

    /// Waits until the connection open now closes (at once when none is open), e.g. the loss
    /// of a subscriber connection, or stop(). Runs on the client's executor.
    boost::asio::awaitable<void> async_wait_closed();

    /// The password of the next connections (AUTH); the open one stays. Call on the client's
    /// executor.
    void set_password(std::string password);

    /// One connection attempt, no retry (start-up checks): resolves, connects, TLS handshake,
    /// AUTH, SELECT, SCRIPT LOAD, all bounded by connect_timeout. On success the connection is
    /// ready for async_exec (but will not be re-opened if lost unless start() is called).
    boost::asio::awaitable<redis_connect_report> async_connect_once();

    /// Sends one command (`args[0]` is the command name; every argument is binary-safe) and
    /// waits for its reply, at most command_timeout. When the connection is not ready it fails
    /// at once with errc::unavailable, unless a connection attempt is under way or about to
    /// start (a stable connection was just lost, or a new master was announced): then it waits for
    /// that attempt first (at most command_timeout) and its reply gets a command_timeout of its
    /// own. Runs on the client's executor.
    /// The command is encoded by the call itself (on a ready connection into the write buffer,
    /// else into a copy of its own): the bytes of `args` are not used afterwards; the awaitable
    /// waits for the reply.
    boost::asio::awaitable<redis_exec_result> async_exec(redis_args args);

    /// durability replicated: sends `args` and then waits for a WAIT (`wait`, e.g. {"WAIT",
    /// "1", "50"}) that follows it on the same connection; the results of both. The WAITs of
    /// a connection are shared: while one is unanswered, the commands sent meanwhile wait for
    /// the next one, which goes out when it returns (Redis serves a connection's commands only
    /// after its WAIT anyway). So one WAIT answers a whole group, and while replicas lag a
    /// connection spends one wait timeout per group, not per command. A WAIT sent at once is
    /// bounded by command_timeout, a held one by twice that, both from the first command that
    /// joined it; a deadline closes the connection, as a command's does. No WAIT is awaited
    /// when `args` failed or came back an error reply. Waits for a connection under way as
    /// async_exec does. Keep `args` and `wait` alive while awaiting.
    boost::asio::awaitable<std::pair<redis_exec_result, redis_exec_result>>
    async_exec_replicated(redis_args args, redis_args wait);

    /// A shared WAIT (`wait`, as async_exec_replicated) behind everything sent on the current
    /// connection so far, e.g. after a command's reply; errc::unavailable when not ready. Keep
    /// `wait` alive while awaiting.
    boost::asio::awaitable<redis_exec_result> async_wait_replicas(redis_args wait);

    /// Redis Cluster: sends `ASKING` and then `args` back to back on this connection (nothing
    /// else between them) and returns the reply to `args`, as async_exec does. Fails with
    /// errc::unavailable at once when the connection is not ready.
    boost::asio::awaitable<redis_exec_result> async_exec_asking(redis_args args);

    /// Waits until the connection is ready or `timeout` elapses; true when ready.
    boost::asio::awaitable<bool> async_wait_ready(std::chrono::milliseconds timeout);

    /// True when commands can be sent now.
    bool ready() const noexcept;

    /// How many connections were established so far (reconnects are visible as > 1).
    std::uint64_t connect_count() const noexcept;

    /// How many connection attempts were made so far (successful or not).
    std::uint64_t attempt_count() const noexcept;

    /// How many socket writes were issued so far (commands of one event-loop turn share one).
    std::uint64_t write_count() const noexcept;

    /// The last connection failure (what an operator needs to read), empty if none.
    const redis_connect_report& last_failure() const noexcept;

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

} // namespace onceproxy::redis
