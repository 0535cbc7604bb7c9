#pragma once
// Forwarding one request to an upstream over a per-worker keep-alive pool (SPEC §1).
// Knows nothing about idempotency keys: it reports *how far* a request got, which is what the
// engine needs to tell "certainly never sent" from "outcome unknown".

#include "onceproxy/config/config.hpp"
#include "onceproxy/upstream/deadline_watch.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <memory>

namespace onceproxy::upstream {

using request = boost::beast::http::request<boost::beast::http::string_body>;
using response = boost::beast::http::response<boost::beast::http::string_body>;

/// How a forward attempt ended.
enum class forward_status {
    ok,                 ///< a complete response was read
    connect_failed,     ///< no connection: nothing of the request was sent (always safe to retry)
    pool_exhausted,     ///< no connection slot within connect_timeout: nothing was sent
    timeout_after_send, ///< request (partly) sent, no complete response in time: outcome unknown
    reset_after_send,   ///< request (partly) sent, connection failed before a complete response
    response_too_large, ///< response exceeded limits.max_response_bytes (upstream did execute)
    bad_response,       ///< unparsable response after the request was sent: outcome unknown
};

/// True when the upstream certainly never received the request.
constexpr bool nothing_sent(forward_status s) noexcept {
    return s == forward_status::connect_failed || s == forward_status::pool_exhausted;
}

struct forward_result {
    forward_status status = forward_status::ok;
    response res; ///< valid when status == ok
};

/// One worker's pools, one per configured upstream. Lives on one worker's executor; all calls
/// must come from coroutines running on that executor (no locking).
class forwarder {
public:
    /// `watch`: the worker's coarse deadline clock (connect and response deadlines).
    forwarder(boost::asio::any_io_executor ex, std::shared_ptr<const config::config> cfg,
              deadline_watch& watch);
    ~forwarder();
    forwarder(const forwarder&) = delete;
    forwarder& operator=(const forwarder&) = delete;

    /// Sends `req` (already rewritten: hop-by-hop headers removed, X-Forwarded-* added) to the
    /// upstream with index `upstream_index` and reads the whole response. A pooled connection
    /// found closed before any byte was written is replaced by a fresh one; a request is never
    /// re-sent once a byte of it was written. `head_request` tells the parser not to expect a body.
    boost::asio::awaitable<forward_result> async_forward(std::size_t upstream_index, request& req);

    /// Closes idle pooled connections (drain).
    void close_idle();

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

} // namespace onceproxy::upstream
