#pragma once
// One keep-alive HTTP/1.1 connection of the test upstream.

#include "attempt_log.hpp"
#include "execution_counts.hpp"
#include "stream_releases.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace onceproxy::test_upstream {

/// Serves requests on `socket` until the peer closes, a request asks to close, a request is
/// malformed (answered 400/413/431, then closed) or X-Test-Drop* says to drop it. Runs on the
/// socket's executor; `counts`, `releases` and `attempts` must outlive the session. A WebSocket
/// upgrade on a path ending in /ws turns the connection into an echo service until the peer closes.
/// Never throws for network input.
boost::asio::awaitable<void> run_session(boost::asio::ip::tcp::socket socket,
                                         execution_counts& counts, stream_releases& releases,
                                         attempt_log& attempts);

} // namespace onceproxy::test_upstream
