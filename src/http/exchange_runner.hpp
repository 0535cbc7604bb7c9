#pragma once
// Carries out the idempotency exchange for one guarded request: core derives the request facts
// (key, scope, fingerprint) from a neutral view of it, then core::exchange_fsm decides and this
// runner does each action it returns against the store and the upstream, one small coroutine
// per action; the translations between engine and HTTP are the pure functions of
// exchange_translation.hpp. The decisions are all the engine's (STYLE.md §2); this is the I/O
// shell (Boost.Redis `exec_op` idea).

#include "http/buffer_budget.hpp"
#include "onceproxy/config/config.hpp"
#include "onceproxy/http/context.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/upstream/forwarder.hpp"

#include <boost/asio/awaitable.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::http {

/// The client connection an answer too large to hold is streamed to, and what its request
/// said about the answer.
struct stream_target {
    client_side client;
    unsigned client_version = 11;
    bool keep_alive = false; ///< the client asked for keep-alive
    bool head_request = false;
    /// The connection's peer address: the store holder of an anonymous request.
    std::string_view client_ip;
    /// Set when the request is still as received: the exchange readies it for the upstream
    /// (ready_for_upstream, over this protocol) when it forwards it, so a replay, which forwards
    /// nothing, never does. Empty: readied already (the route's request facts read a field
    /// that changes).
    std::string_view upstream_proto = {};
};

/// What a finished (or backgrounded) exchange reports for the access log.
struct exchange_report {
    metrics::outcome outcome = metrics::outcome::passthrough;
    /// The store key (a hash), for the access log; empty when there was none or the log is off.
    std::string key_hash;
    double upstream_ms = -1;
    double store_ms = 0;
    /// The answer went to the client from the exchange: an HTTP/1.1 client's replay or held
    /// answer, or one streamed because its body outgrew max_record_bytes. Nothing more to
    /// write: `streamed_status` is its status; `keep` whether the connection carries on.
    bool streamed = false;
    unsigned streamed_status = 0;
    bool keep = false;
    /// The answer's trailer fields (recorded or replayed with it), for an HTTP/2 client.
    boost::beast::http::fields trailers;
};

/// Runs the exchange for `req` on `route` and returns the response for the client. Background
/// work (completion retries) continues in a detached coroutine on the current executor after
/// this returns. `req` has already been rewritten for the upstream (hop-by-hop removed,
/// X-Forwarded-* added). An HTTP/1.1 client's answer is written by the exchange itself (held
/// whole, replayed, or, when its body outgrows max_record_bytes, streamed to `target`, issue
/// 8): then `report.streamed` is set and nothing is returned. `held` (the request body's share
/// of limits.max_buffered_bytes) is kept while the exchange runs and grows by the upstream
/// answer it holds.
boost::asio::awaitable<std::optional<response>>
async_run_exchange(std::shared_ptr<exchange_env> env, const config::route_config& route,
                   std::size_t route_index, request& req, exchange_report& report,
                   stream_target target, std::shared_ptr<buffer_reservation> held);

/// True when requests with this method (and path: a gRPC method declared streaming is not
/// guarded) on this route go through the exchange.
bool is_guarded(const config::route_config& route, std::string_view method,
                std::string_view path) noexcept;

/// Maps a failed forward to the problem the client sees (SPEC §3.2), counting the error.
/// `upstream_name` is named when one of its limits was the cause.
response upstream_failure(upstream::forward_status s, metrics::registry& reg,
                          std::string_view upstream_name = {});

} // namespace onceproxy::http
