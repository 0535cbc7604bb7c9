#pragma once
// The pieces every streamed body is made of, shared by the plain path (plain_relay) and the
// guarded path when an answer is too large to hold (exchange_runner): the framing an answer travels
// with, chunk framing, and the loop that relays an answer's body from an upstream connection to the
// client through one bounded staging buffer, each piece written before the next is read
// (back-pressure: a slow client slows the upstream).

#include "onceproxy/http/context.hpp"
#include "onceproxy/upstream/forwarder.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/message_parser.hpp"
#include "onceproxy/wire/stream.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/fields.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace onceproxy::http {

/// Bytes of body staged between a read and the matching write (per direction, per connection):
/// what bounds a streamed exchange's memory whatever the body size.
inline constexpr std::size_t relay_chunk = 64 * 1024;

/// How an answer's body travels to the client.
struct response_framing {
    bool no_body = false; ///< HEAD, 1xx, 204, 304
    /// A body the client cannot delimit by Content-Length: chunked to an HTTP/1.1 client
    /// (trailers passed on), close-delimited to an HTTP/1.0 one.
    bool rechunk = false;
    bool keep = false; ///< the client connection carries on after this answer
};

/// The framing of an answer with `status` to a request (`head_request`) from a client speaking
/// HTTP/1.`client_version % 10`; `length_known`: the upstream delimits the body by
/// Content-Length (not chunked, not close-delimited). `may_keep`: the client asked for
/// keep-alive and the connection may carry another request (not draining, cap not reached).
[[nodiscard]] response_framing frame_response(unsigned status, bool head_request, bool length_known,
                                              unsigned client_version, bool may_keep) noexcept;

/// Which way trailer fields travel.
enum class trailer_side {
    to_upstream, ///< a request's, from the client to the upstream: an allowlist
    to_client,   ///< a response's, from the upstream to the client: a denylist
};

/// True when trailer field `name` may travel on `side` (RFC 9110 §6.5.1). A request's trailers
/// pass only when they are Content-Digest, Repr-Digest, Digest, Signature or Signature-Input; a
/// response's pass unless they are framing, routing, credential, Proxy-* or Idempotency-Status
/// fields.
[[nodiscard]] bool trailer_may_travel(std::string_view name, trailer_side side) noexcept;

/// "0\r\n" + the trailer fields that may travel + "\r\n": the end of a chunked body. Fields the
/// proxy depends on (`in_use`) never travel as trailers either: an upstream that merges
/// trailers into the header (Beast's own parser does) must not see a key or a principal the
/// proxy did not vouch for.
[[nodiscard]] std::string last_chunk(const boost::beast::http::fields& trailers, trailer_side side,
                                     std::span<const std::string_view> in_use = {});

/// The buffers of one gather write: `head`, then `piece` (as one chunk of a chunked body when
/// `chunked`; nothing for an empty piece), then `tail`. Coalescing a head with the body bytes
/// already at hand saves a system call per small message. Not copyable: the buffers point
/// into the object's own chunk-size line.
class gather {
public:
    gather(std::string_view head, std::string_view piece, bool chunked, std::string_view tail);
    gather(const gather&) = delete;
    gather& operator=(const gather&) = delete;

    const std::array<boost::asio::const_buffer, 5>& buffers() const { return bufs_; }

private:
    std::array<char, 20> size_line_{};
    std::array<boost::asio::const_buffer, 5> bufs_{};
};

/// Writes `data` as one piece of a body (a chunk when `chunked`) to `s` (the client or an
/// upstream connection) within `timeout` on `dl`; false when the write failed.
boost::asio::awaitable<bool> write_piece(wire::stream& s, wire::deadline_watch::slot& dl,
                                         std::chrono::steady_clock::duration timeout,
                                         std::string_view data, bool chunked);

/// Parses the bytes already in `buffer` into `parser`'s staging body, without I/O.
template <bool isRequest>
boost::system::error_code stage_buffered(wire::message_parser<isRequest>& parser,
                                         boost::beast::flat_buffer& buffer) {
    boost::system::error_code ec;
    while (!parser.is_done() && buffer.size() > 0) {
        const auto used = parser.put(buffer.data(), ec);
        buffer.consume(used);
        if (ec == boost::beast::http::error::need_more ||
            ec == boost::beast::http::error::need_buffer) {
            return {};
        }
        if (ec || used == 0) {
            break;
        }
    }
    return ec;
}

/// How a failed read of an answer (its head or body) reads to the engine: every one of them
/// comes after the request was sent, so each is an unknown outcome; the kind only changes the
/// problem.
[[nodiscard]] upstream::forward_status read_failure(const boost::system::error_code& ec,
                                                    bool timed_out);

/// How relaying an answer's body ended.
enum class body_end {
    complete,        ///< the body ended as framed and the client has all of it
    upstream_failed, ///< the upstream broke off, stalled past its timeout, or sent garbage
    client_failed,   ///< a write to the client failed or stalled past idle_timeout
};

/// Watches a streamed body's transfer (either way) for lasting over
/// upstream::long_transfer_after, then moves its upstream connection to the upstream's
/// long-transfer budget (forwarder::move_to_long_transfers). Checked between pieces: one clock
/// read per piece, none per byte.
class long_transfer_watch {
public:
    /// `fwd`: the forwarder that lent the connection (null: no watch).
    long_transfer_watch(upstream::forwarder* fwd, std::size_t upstream_index)
        : fwd_(fwd), upstream_index_(upstream_index), since_(std::chrono::steady_clock::now()) {}

    /// After a piece of the transfer on `conn`.
    void on_piece(upstream::connection& conn) {
        if (fwd_ != nullptr && !conn.tunnel &&
            std::chrono::steady_clock::now() - since_ >= upstream::long_transfer_after) {
            fwd_->move_to_long_transfers(upstream_index_, conn);
        }
    }

private:
    upstream::forwarder* fwd_;
    std::size_t upstream_index_;
    std::chrono::steady_clock::time_point since_;
};

/// The upstream side of a body relay: the lent connection and its read deadline.
struct body_source {
    upstream::connection& conn;
    std::chrono::steady_clock::duration timeout; ///< for each read (an idle limit)
    /// The forwarder that lent `conn` and its upstream: a body relayed for over
    /// upstream::long_transfer_after leaves its ordinary slot (long_transfer_watch).
    upstream::forwarder* fwd = nullptr;
    std::size_t upstream_index = 0;
};

/// Where a relayed answer's body goes: the client, over HTTP/1.1 (a connection) or HTTP/2 (a
/// stream of one).
class body_sink {
public:
    virtual ~body_sink() = default;
    /// One piece of the body; false when the client could not take it (gone, or stalled).
    virtual boost::asio::awaitable<bool> write(std::string_view piece) = 0;
    /// The body ended as framed, with these trailer fields (those that may travel).
    virtual boost::asio::awaitable<bool> end(const boost::beast::http::fields& trailers) = 0;
    /// The body broke off: the client must not take what it got for a whole answer.
    virtual void cut() = 0;
};

/// An HTTP/1.1 client connection as a body_sink.
class connection_sink final : public body_sink {
public:
    /// `timeout`: for each write. `rechunk`: each piece as a chunk, then the last chunk with
    /// the trailers; else the body goes as it is (delimited by its length or the close).
    connection_sink(wire::stream& sock, wire::deadline_watch::slot& dl,
                    std::chrono::steady_clock::duration timeout, bool rechunk)
        : sock_(sock), dl_(dl), timeout_(timeout), rechunk_(rechunk) {}
    boost::asio::awaitable<bool> write(std::string_view piece) override;
    boost::asio::awaitable<bool> end(const boost::beast::http::fields& trailers) override;
    void cut() override { sock_.mark_cut(); }

private:
    wire::stream& sock_;
    wire::deadline_watch::slot& dl_;
    std::chrono::steady_clock::duration timeout_;
    bool rechunk_;
};

/// Relays the rest of the body `rp` is reading (its staging body empty, the parser in
/// streaming mode) from `from` to `to`, piece by piece, then its end (with the answer's
/// trailers). `relayed` grows by the body bytes passed on. When the
/// upstream failed, `failure` says how (timeout, reset, or an unparsable or over-limit body).
boost::asio::awaitable<body_end> relay_body(wire::response_parser& rp, body_source from,
                                            body_sink& to, std::uint64_t& relayed,
                                            upstream::forward_status& failure);

} // namespace onceproxy::http
