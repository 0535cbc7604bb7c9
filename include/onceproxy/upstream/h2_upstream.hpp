#pragma once
// HTTP/2 upstreams (`protocol: h2` over TLS with ALPN, `h2c` over plain TCP): one worker's
// multiplexed connections to one upstream, and the requests on them. A request takes a stream
// on a connection with room for one (the upstream's SETTINGS_MAX_CONCURRENT_STREAMS), else on
// a new connection (up to max_connections), else waits up to connect_timeout. Flow control is
// the back-pressure both ways: a request body is pushed only as the upstream's window takes it,
// and the answer's window opens only as the caller reads it. A stream the upstream did not
// process (REFUSED_STREAM, or above a GOAWAY's last stream id) reports nothing_sent, so the
// caller may send it again; any other failure after the head left is an unknown outcome.
// Connections idle for idle_timeout close; a connection that stays silent while streams wait
// is PINGed, and cut when the PING is not answered.

#include "onceproxy/config/config.hpp"
#include "onceproxy/h2/common.hpp"
#include "onceproxy/upstream/forwarder.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/fields.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::upstream {

/// Sends of a request the upstream refused unprocessed (REFUSED_STREAM, GOAWAY), at most.
inline constexpr int max_refused_attempts = 5;

class h2_pool;

/// `f` as HTTP/2 fields, as they are: the h2 sessions lower-case the names and leave out the
/// fields HTTP/2 forbids (RFC 9113 §8.2.2). `drop_host`: without Host (a request's
/// `:authority` carries it).
std::vector<h2::field> h2_fields(const boost::beast::http::fields& f, bool drop_host = false);

/// One request on an HTTP/2 upstream connection. Destroyed unfinished: the stream is reset.
class h2_request {
public:
    struct state;
    explicit h2_request(std::shared_ptr<state> s);
    ~h2_request();
    h2_request(const h2_request&) = delete;
    h2_request& operator=(const h2_request&) = delete;

    /// A piece of the request body; waits while the upstream's window is full (up to
    /// `timeout`). False: the stream failed (see failure()).
    boost::asio::awaitable<bool> send_body(std::string_view piece,
                                           std::chrono::steady_clock::duration timeout);
    /// The request body ends, with these trailer fields.
    void end_body(const boost::beast::http::fields& trailers = {});
    /// Waits for the answer's head until `deadline`: ok with its status and fields in `head`
    /// (version 11, no body), or why not.
    boost::asio::awaitable<forward_status>
    read_head(response& head, std::chrono::steady_clock::time_point deadline);
    /// The next piece of the answer's body into `out`, each within `timeout`. False at its end
    /// (trailers()) or on a failure (failure() != ok).
    boost::asio::awaitable<bool> read_body(std::string& out,
                                           std::chrono::steady_clock::duration timeout);
    /// Waits (until `deadline`) for the answer's head or the stream's end, and says whether the
    /// upstream refused the stream unprocessed (REFUSED_STREAM, above a GOAWAY's last stream
    /// id): then it never ran and may go again. The head, if any, stays for read_head.
    boost::asio::awaitable<bool>
    refused_unprocessed(std::chrono::steady_clock::time_point deadline);
    forward_status failure() const;
    const boost::beast::http::fields& trailers() const;
    /// Ends the stream (RST_STREAM CANCEL) unless it ended already.
    void reset();

private:
    std::shared_ptr<state> s_;
};

/// What h2_pool::async_open gives: a request whose head was submitted, or why not (nothing
/// was sent).
struct h2_opened {
    std::unique_ptr<h2_request> req;
    forward_status failure = forward_status::ok;
};

class h2_pool {
public:
    /// Makes a new connection (TCP, then TLS with ALPN h2 for `h2`) by `deadline`; null with
    /// `failure` set when it cannot.
    using connector = std::function<boost::asio::awaitable<std::unique_ptr<connection>>(
        std::chrono::steady_clock::time_point deadline, forward_status& failure)>;

    h2_pool(boost::asio::any_io_executor ex, const config::upstream_config& cfg, connector c);
    ~h2_pool();
    h2_pool(const h2_pool&) = delete;
    h2_pool& operator=(const h2_pool&) = delete;

    /// Opens a stream and submits `head` (its Host becomes :authority; connection-specific
    /// fields are left out); `end_stream`: no body follows.
    boost::asio::awaitable<h2_opened> async_open(const request& head, bool end_stream);

    /// Sends the whole of `req` and reads the whole answer (up to `max_response` body bytes)
    /// by `deadline`. A stream the upstream refused unprocessed is sent once more on another
    /// connection.
    boost::asio::awaitable<forward_result>
    async_forward(request& req, std::optional<std::size_t> max_response,
                  std::chrono::steady_clock::time_point deadline);

    /// GOAWAY to idle connections (a drain); busy ones close when their streams end.
    void close_idle();

    struct impl; ///< the pool's state, shared with its connections (h2_pool.cpp)

private:
    std::shared_ptr<impl> impl_;
};

} // namespace onceproxy::upstream
