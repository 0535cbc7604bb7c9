#pragma once
// One egress request (docs/egress.md): the app's outbound call, sent to its route's upstream
// and sent again when an attempt fails in a way the route retries, under one idempotency key,
// with backoff and full jitter, Retry-After, the upstream's retry budget and circuit breaker.
// The decisions are egress/'s pure policy; this is the I/O around them.

#include "http/buffer_budget.hpp"
#include "onceproxy/config/config.hpp"
#include "onceproxy/egress/upstream_guards.hpp"
#include "onceproxy/http/context.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/upstream/forwarder.hpp"

#include <boost/asio/awaitable.hpp>

#include <memory>
#include <string>

namespace onceproxy::http {

/// What an egress route runs with, made once per config and worker (handler).
struct egress_route {
    std::shared_ptr<egress::upstream_guard> guard; ///< its upstream's budget and breaker
    metrics::named_series* series = nullptr;       ///< the route's egress series
    std::string authority; ///< the Host its requests get: upstream_authority of its upstream
};

/// The upstream's authority for Host: the app called the egress listener, the upstream wants
/// its own name (and its port when not the scheme's default).
std::string upstream_authority(const config::upstream_config& up);

/// What the access log says of an egress request.
struct egress_report {
    std::string key;       ///< the idempotency key sent (the app's or generated), or empty
    unsigned attempts = 0; ///< sends made
    std::int64_t upstream_ms = 0;
};

/// Sends `req` (hop-by-hop fields removed, its body whole) on `route` (an egress route:
/// `retry` set) and returns the answer to give the app: the upstream's (with
/// `Idempotency-Key` and `Onceproxy-Attempts` added), or a problem when none came or the
/// breaker is open. Each answer held is counted in `held` (limits.max_buffered_bytes, beside
/// the request's body; never refused: the upstream has acted) until the caller drops it; null:
/// not counted. Runs on the forwarder's executor. Never throws for anything the upstream does.
boost::asio::awaitable<response> async_run_egress(upstream::forwarder& fwd,
                                                  const config::route_config& route,
                                                  egress_route& state, request& req,
                                                  egress_report& report, buffer_reservation* held);

} // namespace onceproxy::http
