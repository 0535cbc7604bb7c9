#pragma once
// Forwarding one request to an upstream over a per-worker keep-alive pool (SPEC §1).
// Knows nothing about idempotency keys: it reports *how far* a request got, which is what the
// engine needs to tell "certainly never sent" from "outcome unknown".

#include "onceproxy/config/config.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/message_parser.hpp"
#include "onceproxy/wire/message_reader.hpp"
#include "onceproxy/wire/stream.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace onceproxy::upstream {

using request = boost::beast::http::request<boost::beast::http::string_body>;
using response = boost::beast::http::response<boost::beast::http::string_body>;

/// How a forward attempt ended.
enum class forward_status {
    ok,                 ///< a complete response was read
    connect_failed,     ///< no connection: nothing of the request was sent (always safe to retry)
    pool_exhausted,     ///< no connection slot within connect_timeout: nothing was sent
    tls_failed,         ///< the TLS handshake with an https:// upstream failed: nothing was sent
    timeout_after_send, ///< request (partly) sent, no complete response in time: outcome unknown
    reset_after_send,   ///< request (partly) sent, connection failed before a complete response
    response_too_large, ///< response exceeded limits.max_response_bytes (upstream did execute)
    bad_response,       ///< unparsable response after the request was sent: outcome unknown
    tunnel_limit,       ///< an upgrade found the upstream's max_tunnels in use: nothing was sent
};

/// True when the upstream certainly never received the request.
constexpr bool nothing_sent(forward_status s) noexcept {
    return s == forward_status::connect_failed || s == forward_status::pool_exhausted ||
           s == forward_status::tls_failed || s == forward_status::tunnel_limit;
}

class tls_client;
class h2_pool;

/// One upstream connection of a worker's pool. While lent out (streaming) it belongs to the
/// borrower, who hands it back with forwarder::release. Read and write it through `stream`
/// (TLS when the upstream is https://; wire::async_read reads an answer into `buffer`).
struct connection {
    connection(boost::asio::any_io_executor ex, wire::deadline_watch& watch);
    ~connection();
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;
    /// The connection, plain or TLS. Ends without close_notify (destroyed, or closed when the
    /// pool drops it): pooled connections usually end that way, and the upstream's end of an
    /// answer is framed, never the close. Deadlines cancel the operations of its socket.
    wire::stream stream;
    wire::deadline_watch::slot dl; ///< connect, write and read deadlines
    /// Bounded like the client side: an over-long header, chunk line or trailer section from
    /// the upstream is a parse error (bad_response), not unbounded memory or a throw.
    boost::beast::flat_buffer buffer;
    std::chrono::steady_clock::time_point idle_since{}; ///< when pooled (wire::coarse_now)
    char watch_byte = 0; ///< what the idle watch reads (a byte there makes it unusable)
    std::string head;    ///< the serialised request head being written
    /// The fields of the answer being read on the plain path (keep_raw_fields), reused from
    /// answer to answer on this connection.
    wire::raw_header_store answer_fields;
    /// https:// upstreams: the TLS state of its pool (outlives the connection), for
    /// tls_refused's log.
    tls_client* tls = nullptr;
    /// Lent for an upgrade, or a transfer that outlasted long_transfer_after: counted against
    /// the upstream's max_tunnels, not max_connections.
    bool tunnel = false;
};

/// True when `ec`, an error of the first exchange on a new TLS connection, is a fatal alert by
/// which the upstream refused the handshake. TLS 1.3 reports a refused client certificate only
/// after the client finished its part of the handshake: the request written meanwhile was never
/// read, so nothing was sent as far as the upstream's application is concerned. Logs why.
bool tls_refused(connection& c, const boost::system::error_code& ec);

/// What forwarder::async_acquire lends: a connection, or why there is none (nothing was sent).
struct lent_connection {
    std::unique_ptr<connection> conn;
    bool reused = false; ///< from the idle pool (it may turn out closed on the first write)
    forward_status failure = forward_status::ok;
};

/// The rest of an answer whose body outgrew the caller's hold limit: still on the connection.
struct unread_body {
    unread_body(std::unique_ptr<connection> c, wire::response_parser&& p)
        : conn(std::move(c)), parser(std::move(p)) {}
    /// Lent to the caller, who hands it back with forwarder::release once the body is read.
    std::unique_ptr<connection> conn;
    /// Has read the head and the bytes held; reads on from `conn`. Its message's head and body
    /// were moved into forward_result::res: only its staging body (empty, capacity unchanged:
    /// set stream_body before reading on), trailers and framing state are left.
    wire::response_parser parser;
};

/// A call to a plain HTTP/1.1 upstream that reached its checkpoint (async_forward's
/// `checkpoint`) before the answer was whole: the request is on its way, part of it or all
/// written, and nothing read of the answer is lost. forwarder::async_resume goes on with it.
/// Only the forwarder looks inside.
struct paused_forward {
    std::size_t upstream_index = 0;
    std::unique_ptr<connection> conn;
    bool reused = false; ///< taken from the idle pool
    /// A reused connection found closed before any byte was written may be replaced (once).
    bool replaceable = false;
    std::size_t written = 0; ///< bytes of the request (head, then body) written so far
    bool head_request = false;
    std::optional<std::size_t> max_response;
    std::optional<std::size_t> hold;
    std::chrono::steady_clock::time_point deadline; ///< of the whole call
    /// Where the answer's header fields go instead of forward_result::res (async_forward's
    /// `answer_fields`), or null.
    wire::raw_header_store* answer_fields = nullptr;
    /// The answer being read, once the whole request is written.
    std::optional<wire::response_parser> parser;
};

struct forward_result {
    forward_status status = forward_status::ok;
    /// Valid when status == ok: the whole answer, or with `rest`, its head and the body bytes
    /// held so far (more than the hold limit). Without its header fields when `raw_fields`.
    response res;
    /// The answer's header fields (and reason phrase) went to async_forward's `answer_fields`,
    /// as received, hop-by-hop ones included; `res` holds its status, version and body.
    bool raw_fields = false;
    std::unique_ptr<unread_body> rest; ///< the body did not fit the hold limit
    /// The answer's trailer fields, from an HTTP/2 upstream (a gRPC call's grpc-status ...).
    boost::beast::http::fields trailers;
    /// Set (with status ok and nothing else) when the call reached its checkpoint first.
    std::unique_ptr<paused_forward> paused;
};

/// A streamed body (a slow download or upload) that has gone on this long gives its ordinary
/// slot up for one of the upstream's max_tunnels budget: see forwarder::move_to_long_transfers.
inline constexpr std::chrono::seconds long_transfer_after{1};

/// One worker's pools, one per configured upstream. Lives on one worker's executor; all calls
/// must come from coroutines running on that executor (no locking).
class forwarder {
public:
    /// `watch`: the worker's coarse deadline clock (connect and response deadlines).
    /// `previous`: the forwarder of the config this one replaces (a reload), on the same
    /// executor: the pools of upstreams whose settings did not change are shared with it, idle
    /// connections included; the others start empty. A pool the new config dropped closes with
    /// the last forwarder holding it (once the requests still running on the old config end).
    forwarder(boost::asio::any_io_executor ex, std::shared_ptr<const config::config> cfg,
              wire::deadline_watch& watch, const forwarder* previous = nullptr);
    ~forwarder();
    forwarder(const forwarder&) = delete;
    forwarder& operator=(const forwarder&) = delete;

    /// Sends `req` (already rewritten: hop-by-hop headers removed, X-Forwarded-* added) to the
    /// upstream with index `upstream_index` and reads the whole response. A pooled connection
    /// found closed before any byte was written is replaced by a fresh one; a request is never
    /// re-sent once a byte of it was written. `head_request` tells the parser not to expect a body.
    /// `max_response`: the response body limit (nullopt: none). `hold`: at most this many body
    /// bytes (plus one) are held in memory; a longer body is not read on, but handed over with
    /// its connection in forward_result::rest (nullopt: the whole body is read, up to
    /// `max_response`). `deadline`: the bound on the whole exchange instead of the upstream's
    /// `timeout` (a guarded request reading a late answer, issue 26).
    /// A final status the request did not ask for, 101 Switching Protocols (the forwarder never
    /// asks for an upgrade), or outside 100-599 is a bad_response (RFC 9110 §15, issue 26).
    /// `checkpoint` (pausable upstreams only): when it passes before the answer is whole, the
    /// call returns forward_result::paused instead, to be resumed (async_resume). It is a pause,
    /// not a deadline: the request is never sent again, nothing of the answer is lost.
    /// `answer_fields` (HTTP/1.1 upstreams; ignored for HTTP/2): the answer's header fields go
    /// there, as received, instead of into `res` (forward_result::raw_fields), for a caller
    /// that passes them on rather than looks them up. It must outlive the call, resumed or not.
    boost::asio::awaitable<forward_result>
    async_forward(std::size_t upstream_index, request& req, std::optional<std::size_t> max_response,
                  std::optional<std::size_t> hold = std::nullopt,
                  std::optional<std::chrono::milliseconds> deadline = std::nullopt,
                  std::optional<std::chrono::steady_clock::time_point> checkpoint = std::nullopt,
                  wire::raw_header_store* answer_fields = nullptr);

    /// Goes on with a paused call (`req` is the request it was sending) until its answer or
    /// its deadline, as if it had never paused.
    boost::asio::awaitable<forward_result> async_resume(std::unique_ptr<paused_forward> call,
                                                        request& req);

    /// True when a call to upstream `upstream_index` can pause at a checkpoint: a plain
    /// HTTP/1.1 upstream. A TLS read cancelled mid-record could not be taken up again, and an
    /// HTTP/2 stream is read by its connection, not by the call.
    bool pausable(std::size_t upstream_index) const;

    /// Lends a connection of upstream `upstream_index` (pooled or new, within connect_timeout
    /// and max_connections) for a streamed exchange. A pooled connection is first checked for
    /// a close the upstream sent while it sat idle (one system call) unless `verify_idle` is
    /// false: a caller that can send its request again when a reused connection turns out
    /// closed before any answer byte skips the check (see plain_relay).
    /// `tunnel`: the request asks for an upgrade, which may hold the connection for as long as
    /// the tunnel lives. Such a connection is counted against max_tunnels instead of
    /// max_connections, so tunnels never take the slots ordinary requests need; with
    /// max_tunnels in use the answer is tunnel_limit at once (no wait).
    boost::asio::awaitable<lent_connection>
    async_acquire(std::size_t upstream_index, bool verify_idle = true, bool tunnel = false);

    /// Takes a lent connection back: pooled when `reusable` (a complete exchange on a
    /// keep-alive connection with nothing left unread), closed otherwise. A tunnel's connection
    /// (one that did not upgrade) is pooled only when an ordinary slot is free.
    void release(std::size_t upstream_index, std::unique_ptr<connection> c, bool reusable);

    /// A lent connection whose transfer has gone on for long_transfer_after: when the
    /// upstream's max_tunnels budget has room, the connection is counted there from now on and
    /// its max_connections slot goes to the oldest queued request, so long transfers never
    /// take the slots ordinary requests need. With the budget in use (or the connection
    /// already counted there), nothing changes. Released as a tunnel's connection.
    void move_to_long_transfers(std::size_t upstream_index, connection& c);

    /// The settings of upstream `upstream_index`.
    const config::upstream_config& upstream(std::size_t upstream_index) const;

    /// Upstream `upstream_index`'s HTTP/2 connections (protocol h2 or h2c), else null (HTTP/1.1:
    /// async_acquire lends its connections). async_forward serves both.
    h2_pool* h2(std::size_t upstream_index) const;

    /// Closes idle pooled connections (drain).
    void close_idle();

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

} // namespace onceproxy::upstream
