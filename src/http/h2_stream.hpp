#pragma once
// The client side of one HTTP/2 stream, as the request paths below the connection see it: the
// request body in pieces and the answer (head, body pieces with back-pressure, trailers). The
// HTTP/2 connection (h2_connection.cpp) implements it over its h2::server_session.

#include "onceproxy/http/context.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/fields.hpp>

#include <string>
#include <string_view>

namespace onceproxy::http {

class h2_stream {
public:
    virtual ~h2_stream() = default;

    /// The next request body bytes, into `out` (replacing what it held). False at the body's
    /// end (then its trailers are in request_trailers()) or when it failed (body_failed()).
    virtual boost::asio::awaitable<bool> read_body(std::string& out) = 0;
    /// The body could not be read whole: the stream was reset, or it stalled past body_timeout
    /// (`timed_out`).
    virtual bool body_failed() const = 0;
    virtual bool body_timed_out() const = 0;
    /// The request's trailer fields (after read_body returned false without a failure).
    virtual const boost::beast::http::fields& request_trailers() const = 0;

    /// The answer's head (connection-specific fields are left out, RFC 9113 §8.2.2);
    /// `end`: no body follows.
    virtual void write_head(const response& head, bool end) = 0;
    /// A piece of the answer's body; waits while too much of it is queued (the client's
    /// window). False: the client is gone or stalled past idle_timeout.
    virtual boost::asio::awaitable<bool> write_body(std::string_view piece) = 0;
    /// The body ends, with these trailer fields.
    virtual void end_body(const boost::beast::http::fields& trailers) = 0;
    /// The answer broke off: RST_STREAM, so the client does not take it for whole.
    virtual void cut() = 0;
};

} // namespace onceproxy::http
