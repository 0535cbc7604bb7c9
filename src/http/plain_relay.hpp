#pragma once
// The plain path (SPEC §1: no route guard, or a method the route does not guard): the request
// and the response stream through bounded buffers, with back-pressure both ways, instead of
// being read whole. An upgrade (WebSocket) becomes a byte tunnel after 101.

#include "http/body_relay.hpp"
#include "http/h2_stream.hpp"
#include "onceproxy/config/config.hpp"
#include "onceproxy/http/context.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/upstream/forwarder.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::http {

/// One worker's plain-path relay. Used only from that worker's executor.
class plain_relay {
public:
    /// `fields_in_use[i]`: the request fields route i depends on (request_fields_in_use), which
    /// Connection may not nominate away; `route_series[i]`: the metrics of route i. Both outlive
    /// the relay.
    plain_relay(std::shared_ptr<const config::config> cfg, upstream::forwarder& fwd,
                metrics::registry& reg,
                const std::vector<std::vector<std::string_view>>& fields_in_use,
                const std::vector<metrics::route_metrics*>& route_series);

    /// Relays the request whose header `parser` has read (its body not yet) to the route's
    /// upstream and the answer back. Returns true when the client connection may carry the
    /// next request (the request was read whole and the response framed).
    boost::asio::awaitable<bool> async_relay(client_side client, wire::request_parser& parser,
                                             const config::route_config& route,
                                             std::size_t route_index, const request_context& ctx);

    /// The same for a request that came over HTTP/2 (`client`, one stream; its head `req`, the
    /// body still to come when `has_body`), answered on that stream (h2_relay.cpp).
    boost::asio::awaitable<void> async_relay_h2(h2_stream& client, request& req, bool has_body,
                                                const config::route_config& route,
                                                std::size_t route_index,
                                                const request_context& ctx);

private:
    struct exchange;
    struct h2_exchange;
    std::shared_ptr<const config::config> cfg_;
    upstream::forwarder& fwd_;
    metrics::registry& reg_;
    const std::vector<std::vector<std::string_view>>& fields_in_use_;
    const std::vector<metrics::route_metrics*>& route_series_;
};

} // namespace onceproxy::http
