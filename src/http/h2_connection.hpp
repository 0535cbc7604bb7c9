#pragma once
// One HTTP/2 client connection (h2 after ALPN on a TLS listener, h2c after the connection
// preface on the plain one): the shell around h2::server_session on the connection's stream.
// It reads and writes the stream (one reader, one writer coroutine; every frame the session
// produces between two writes goes out in one write), keeps the connection's deadlines, and
// serves each request stream in a coroutine of its own on the same paths as HTTP/1.1:
// admission, then the plain relay or the exchange (handler), answered on the stream.

#include "onceproxy/http/context.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/stream.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <memory>
#include <string_view>

namespace onceproxy::http {

class handler;

/// How the first bytes of a plain connection compare with the HTTP/2 connection preface
/// (RFC 9113 §3.4, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").
enum class preface_match {
    no,      ///< HTTP/1.x (or garbage for it to refuse)
    partial, ///< a prefix of the preface: read more to tell
    yes,
};
preface_match match_preface(std::string_view first_bytes) noexcept;

class h2_connection {
public:
    /// `current`: the worker's newest request path (a reload replaces it; each stream keeps
    /// the one it started on). `in` holds the bytes read so far (the preface, for h2c).
    h2_connection(const std::shared_ptr<handler>& current, metrics::registry& reg,
                  const bool& draining, wire::stream& stream, wire::deadline_watch::slot& dl,
                  boost::beast::flat_buffer& in, request_context ctx);
    ~h2_connection();
    h2_connection(const h2_connection&) = delete;
    h2_connection& operator=(const h2_connection&) = delete;

    /// Serves the connection until it ends and every stream's coroutine has ended.
    boost::asio::awaitable<void> run();
    /// The worker's drain. total: GOAWAY, the open streams finish, then the connection closes;
    /// terminal: the connection is cut (the exchanges behind it go on recording).
    void on_cancel(boost::asio::cancellation_type t);

private:
    struct impl;
    std::shared_ptr<impl> impl_;
};

} // namespace onceproxy::http
