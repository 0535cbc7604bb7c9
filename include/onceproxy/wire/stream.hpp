#pragma once
// A connection, plain TCP or TLS over it (client or server side), as one Asio stream type
// (AsyncReadStream and AsyncWriteStream): the client side, the upstream side and Redis all read
// and write through it, and Beast's algorithms serve both kinds. On a plain connection each
// operation goes straight to the socket (one branch more, nothing else); on a TLS connection it
// goes through OpenSSL in stream.cpp (the TLS code is compiled once, behind a type-erased
// handler whose memory Asio recycles). The TCP socket stays reachable for options, deadlines
// (deadline_watch) and shutdown: closing or cancelling it ends the TLS operations too.
//
// Closing rules: the stream sends close_notify only when asked (async_shutdown, the server
// side's orderly end); close() and destruction end the TCP connection without it (how pooled
// upstream connections and Redis links end). A connection whose answer was cut (mark_cut) never
// sends it.

#include "onceproxy/asio/use_tuple.hpp"

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

namespace boost::asio::ssl {
class context;
}
namespace boost::asio::detail {
class epoll_reactor;
}

struct ssl_st; // OpenSSL's SSL

namespace onceproxy::wire {

class stream {
public:
    using executor_type = boost::asio::ip::tcp::socket::executor_type;
    using lowest_layer_type = boost::asio::ip::tcp::socket;
    using read_handler =
        boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)>;
    using write_handler = read_handler;

    /// Which end of the TLS handshake this side plays.
    enum class role {
        client, ///< connects out (an upstream, Redis): sends the ClientHello
        server, ///< accepted (a client of the proxy)
    };

    /// A plain connection (it may still become TLS: use_tls).
    explicit stream(boost::asio::ip::tcp::socket sock);
    /// A TLS connection with `ctx`, which the stream keeps alive; call async_handshake before
    /// anything else.
    stream(boost::asio::ip::tcp::socket sock, std::shared_ptr<boost::asio::ssl::context> ctx);
    ~stream();
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;

    /// Puts TLS with `ctx` (kept alive) over this plain connection, before any byte was read or
    /// written on it (after the TCP connect); then set up the session (native_handle) and call
    /// async_handshake.
    void use_tls(std::shared_ptr<boost::asio::ssl::context> ctx);

    executor_type get_executor() noexcept { return sock_.get_executor(); }
    boost::asio::ip::tcp::socket& socket() noexcept { return sock_; }
    lowest_layer_type& lowest_layer() noexcept { return sock_; }
    bool is_tls() const noexcept { return tls_ != nullptr; }
    /// TLS: OpenSSL's session object (SNI, session resumption, verification results); null on
    /// a plain connection.
    ssl_st* native_handle() noexcept;
    /// An answer was broken off part-way (the upstream failed mid-body, or a write to the
    /// client failed): the connection must end without close_notify, which would make a body
    /// delimited by the close look complete.
    void mark_cut() noexcept { cut_ = true; }
    bool cut() const noexcept { return cut_; }

    /// TLS: the handshake, as `r`. Plain: nothing to do.
    boost::asio::awaitable<boost::system::error_code> async_handshake(role r);
    /// TLS: ends the TLS session before the connection closes: sends close_notify (RFC 8446
    /// §6.1), so the peer can tell the end of the connection from a cut, without waiting for
    /// the peer's. Bounded by the caller's deadline on the socket (a peer that reads nothing).
    /// Plain, closed, or cut (mark_cut): nothing to do.
    boost::asio::awaitable<void> async_shutdown();
    /// Ends the TCP connection at once (both directions shut down, then closed; no
    /// close_notify): pending operations end with an error. Idempotent.
    void close() noexcept;
    /// TLS, client side: the peer's certificate must name `host` (RFC 6125; an IP address
    /// literal is matched as one), checked during the handshake. Call before async_handshake.
    void verify_host_name(const std::string& host);
    /// TLS: the subject of the peer certificate the handshake verified (RFC 2253 form); empty
    /// when there is none (or the connection is plain).
    std::string verified_peer_subject() const;
    /// TLS: the protocol ALPN agreed on ("h2", "http/1.1"); empty when none (or plain).
    std::string_view alpn() const;

    template <class MutableBuffers, class Token>
    auto async_read_some(const MutableBuffers& buffers, Token&& token) {
        return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
            [this](auto handler, const MutableBuffers& b) {
                if (tls_ == nullptr) {
                    plain_read(first_buffer(b), false, read_handler(std::move(handler)));
                    return;
                }
                tls_read_some(first_buffer(b), read_handler(std::move(handler)));
            },
            token, buffers);
    }

    /// async_read_some for bytes the peer has yet to send: the next request on a kept-alive
    /// connection, the answer to a request just written, anything at all on an idle pooled
    /// connection. On a plain connection whose last read drained the socket (it got fewer bytes
    /// than it asked for), it does not first try a read that can only find nothing (a system
    /// call per message, the costliest part of a small exchange): it waits for the readiness
    /// the peer's next bytes bring, as nginx does. What such a wait does not see is an end of
    /// stream that came with the bytes of the last read: it shows at the next readiness (any
    /// byte written to the connection brings one) or deadline, not at once. So it is never for
    /// a read inside a message, whose end may be the close. Cancelled, as every operation on
    /// the stream, by cancelling or closing the socket (not by a cancellation slot).
    template <class Token>
    auto async_read_next(boost::asio::mutable_buffer b, Token&& token) {
        return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
            [this](auto handler, boost::asio::mutable_buffer buf) {
                if (tls_ == nullptr) {
                    plain_read(buf, true, read_handler(std::move(handler)));
                    return;
                }
                tls_read_some(buf, read_handler(std::move(handler)));
            },
            token, b);
    }

    template <class ConstBuffers, class Token>
    auto async_write_some(const ConstBuffers& buffers, Token&& token) {
        return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
            [this](auto handler, const ConstBuffers& b) {
                if (tls_ == nullptr) {
                    sock_.async_write_some(b, std::move(handler));
                    return;
                }
                tls_write_some(gather(b), write_handler(std::move(handler)));
            },
            token, buffers);
    }

    /// Plain: writes what the socket takes at once, without waiting, and returns how many bytes
    /// that was: 0 when the socket takes nothing now, and always on TLS (whose records go
    /// through async_write_some). `ec` is set when the connection failed. A message the kernel
    /// takes whole then costs no operation and no wake-up, as nginx's writev. Only while no
    /// write is under way on the stream; what it did not take goes out by async_write.
    std::size_t try_write(std::span<const boost::asio::const_buffer> buffers,
                          boost::system::error_code& ec) noexcept;

private:
    struct tls_state;

    template <class MutableBuffers>
    static boost::asio::mutable_buffer first_buffer(const MutableBuffers& b) {
        for (auto it = boost::asio::buffer_sequence_begin(b);
             it != boost::asio::buffer_sequence_end(b); ++it) {
            boost::asio::mutable_buffer m(*it);
            if (m.size() != 0) {
                return m;
            }
        }
        return {};
    }

    /// Up to `max_gather` bytes of `b` as one buffer (one TLS record per write): copied into
    /// the stream's own buffer when `b` is made of several pieces.
    template <class ConstBuffers>
    boost::asio::const_buffer gather(const ConstBuffers& b) {
        const auto begin = boost::asio::buffer_sequence_begin(b);
        const auto end = boost::asio::buffer_sequence_end(b);
        std::size_t pieces = 0;
        boost::asio::const_buffer only;
        for (auto it = begin; it != end; ++it) {
            boost::asio::const_buffer c(*it);
            if (c.size() != 0) {
                ++pieces;
                only = c;
            }
        }
        if (pieces <= 1) {
            return only;
        }
        char* out = gather_buffer();
        std::size_t n = 0;
        for (auto it = begin; it != end && n < max_gather; ++it) {
            boost::asio::const_buffer c(*it);
            const auto take = std::min(c.size(), max_gather - n);
            std::memcpy(out + n, c.data(), take);
            n += take;
        }
        return boost::asio::const_buffer(out, n);
    }

    char* gather_buffer() noexcept; ///< max_gather bytes, TLS connections only
    /// A read on the plain socket through the reactor (stream.cpp): as the socket's own, and
    /// it notes whether the read drained the socket; with `next`, async_read_next's wait.
    void plain_read(boost::asio::mutable_buffer b, bool next, read_handler h);
    void tls_read_some(boost::asio::mutable_buffer b, read_handler h);
    void tls_write_some(boost::asio::const_buffer b, write_handler h);

    static constexpr std::size_t max_gather = 16 * 1024; ///< one TLS record's plaintext
    boost::asio::ip::tcp::socket sock_;
    std::unique_ptr<tls_state> tls_;
    bool cut_ = false;
    /// The last read on the plain socket got fewer bytes than it asked for: the socket was
    /// empty then, so any byte that came since brought a readiness of its own.
    bool drained_ = false;
    /// The event loop's reactor, which plain_read hands its operations to (looked up once).
    boost::asio::detail::epoll_reactor* reactor_ = nullptr;
};

/// Writes all of `buffers` to `s`, as boost::asio::async_write does, and completes with the
/// same (error, bytes written): what the socket takes at once goes out by stream::try_write, with
/// no operation and no wake-up; only the rest waits for the socket. Only while no other write is
/// under way on `s`. A sequence of more than 16 pieces is left to async_write whole.
template <class ConstBuffers>
boost::asio::awaitable<std::tuple<boost::system::error_code, std::size_t>>
async_write_all(stream& s, ConstBuffers buffers) {
    std::array<boost::asio::const_buffer, 16> pieces;
    std::size_t count = 0;
    std::size_t total = 0;
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers); ++it) {
        if (count == pieces.size()) {
            co_return co_await boost::asio::async_write(s, buffers, use_tuple);
        }
        pieces[count] = boost::asio::const_buffer(*it);
        total += pieces[count++].size();
    }
    const std::span<boost::asio::const_buffer> all(pieces.data(), count);
    boost::system::error_code ec;
    const auto taken = s.try_write(all, ec);
    if (ec || taken == total) {
        co_return std::tuple(ec, taken);
    }
    auto skip = taken;
    for (auto& b : all) { // what the socket did not take at once
        const auto part = std::min(skip, b.size());
        b += part;
        skip -= part;
    }
    auto [wec, n] = co_await boost::asio::async_write(s, all, use_tuple);
    co_return std::tuple(wec, taken + n);
}

} // namespace onceproxy::wire
