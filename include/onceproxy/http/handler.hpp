#pragma once
// Turns one fully read client request into the response to send: routes it, and either proxies
// it plainly or runs the idempotency exchange (SPEC §1). One handler per worker, used only from
// that worker's executor.

#include "onceproxy/config/config.hpp"
#include "onceproxy/http/context.hpp"
#include "onceproxy/http/task_tracker.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/store/store.hpp"
#include "onceproxy/upstream/forwarder.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::egress {
class upstream_guards;
}

namespace onceproxy::http {

class buffer_reservation;
class h2_stream;

/// What handler::async_handle did with a request.
struct handled {
    /// The answer to write: set unless `streamed` (async_run_exchange returns one unless it
    /// wrote the answer itself).
    std::optional<response> res;
    /// The answer already went to the client: written by the exchange (an HTTP/1.1 client's
    /// held or replayed answer) or streamed (too large to hold).
    bool streamed = false;
    bool keep = false; ///< streamed: the client connection may carry the next request
    /// Its trailer fields (a gRPC call's grpc-status ...): an HTTP/2 client gets them after
    /// the body; HTTP/1.1 answers written whole carry none.
    boost::beast::http::fields trailers = {};
};

/// What a request's head decides before any of its body is read (handler::admit).
struct admission {
    const config::route_config* route = nullptr; ///< null: no route matches
    std::size_t route_index = 0;
    std::optional<std::size_t> body_limit; ///< the route's max_request_bytes (none: no limit)
    std::optional<response> refusal;       ///< set: answer this and forward nothing
};

/// The request path of one config on one worker. A reload makes a new handler; a request holds
/// the handler it started on (std::shared_ptr) until it ends, so it finishes on its config.
class handler {
public:
    /// `st` may be shared by all workers (its own contract says so); `fwd` is this config's
    /// forwarder on this worker; `reg` outlives the handler. Registers the config's route names
    /// with `reg` (a route a reload added gets its series). `tracker`: the worker's tracked
    /// coroutines; an exchange that goes on completing its record after answering holds a
    /// token of it, so a drain waits for the record rather than abandoning it.
    /// `egress`: set for the egress listener's handler, whose `cfg` is config::egress_view of
    /// the config (its routes are the egress routes): the budget and breaker of each upstream,
    /// shared by every worker and kept across reloads.
    handler(std::shared_ptr<const config::config> cfg, std::shared_ptr<upstream::forwarder> fwd,
            std::shared_ptr<store::store> st, metrics::registry& reg, task_tracker& tracker,
            std::shared_ptr<egress::upstream_guards> egress = nullptr);
    ~handler();

    /// The config this handler serves.
    const config::config& config() const noexcept;

    /// The route of a request head (first match wins), or nullptr; `index` receives its index.
    const config::route_config* route_for(const request& head, std::size_t& index) const;

    /// The refusals decided from a request head alone, whatever protocol it came over: a
    /// malformed field, a target that does not normalise or that its route refuses (path
    /// parameters), a declared body length (`declared_length`) past the body limit. The target
    /// is normalised in place (README "Path normalisation"); then its route.
    admission admit(request& head, std::optional<std::uint64_t> declared_length) const;

    /// True when `route` guards `req` (its method, and for a gRPC route a method not declared
    /// streaming) and a store is configured: the exchange runs.
    bool guards(const config::route_config& route, const request& req) const;

    /// True when `req`'s body is read whole before anything is sent: its route guards it, or
    /// it is an egress route's (the body is kept for retries). Otherwise it is relayed as it
    /// comes.
    bool reads_whole(const config::route_config& route, const request& req) const;

    /// True when HTTP/1.1 requests with `method` on `route` take the streaming plain path: no
    /// store round trip, nothing buffered (the route does not guard the method and its upstream
    /// speaks HTTP/1.1; a plain request to an HTTP/2 upstream is forwarded whole).
    bool streams(const config::route_config& route, const request& req) const;

    /// Streams one plain request (its header read by `parser`, its body not yet) to the
    /// route's upstream and the answer back; see plain_relay. True: the client connection may
    /// carry the next request.
    boost::asio::awaitable<bool> async_relay(client_side client, wire::request_parser& parser,
                                             const config::route_config& route,
                                             std::size_t route_index, const request_context& ctx);

    /// The same for a request that came over HTTP/2: `req` is its head (admitted), its body
    /// still to come on `client` when `has_body`; answered on `client`.
    boost::asio::awaitable<void> async_relay_h2(h2_stream& client, request& req, bool has_body,
                                                const config::route_config& route,
                                                std::size_t route_index,
                                                const request_context& ctx);

    /// Produces the response for a request read whole that does not stream: no route matches
    /// (`route` null: 404), its route guards its method (the idempotency exchange), or it is an
    /// egress route's (sent with its retries); `route` and `route_index` are what route_for() found
    /// for its head. Requests for which streams() is true go to async_relay instead. `req` is
    /// consumed (moved upstream). Never throws for anything a client or an upstream does: those
    /// become problem responses. An upstream answer whose body outgrows the route's
    /// max_record_bytes is not held: it streams to `client` (its head as soon as that much has
    /// arrived) and the result says so. `held` holds the request body against
    /// limits.max_buffered_bytes; the exchange keeps it (and counts the upstream answer it holds in
    /// it) for as long as it runs.
    boost::asio::awaitable<handled> async_handle(request& req, const config::route_config* route,
                                                 std::size_t route_index,
                                                 const request_context& ctx, client_side client,
                                                 std::shared_ptr<buffer_reservation> held);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

} // namespace onceproxy::http
