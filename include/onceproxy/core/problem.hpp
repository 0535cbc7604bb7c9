#pragma once
// Every error the proxy itself produces carries a stable problem code (SPEC §3.2). This is the
// one table of them: each code's `code` string, default HTTP status, title and default detail.
// The engine names codes in its reject actions; http renders them as problem+json (RFC 9457).

#include "onceproxy/core/grpc.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace onceproxy::core {

/// Stable problem codes (the `code` member of a problem; `type` is derived from it).
enum class problem_code : std::uint8_t {
    missing_key,              ///< 400 idempotency.missing_key
    invalid_key,              ///< 400 idempotency.invalid_key
    payload_mismatch,         ///< 422 (or 409 by config) idempotency.payload_mismatch
    in_progress,              ///< 409 idempotency.in_progress + Retry-After
    response_not_replayable,  ///< 409 idempotency.response_not_replayable
    store_unavailable,        ///< 503 idempotency.store_unavailable + Retry-After
    request_too_large,        ///< 413 request.too_large
    header_too_large,         ///< 431 request.header_too_large
    bad_request,              ///< 400 request.malformed (417 for an unsupported Expect)
    route_not_found,          ///< 404 route.not_found (no route matches)
    upstream_unavailable,     ///< 502 upstream.unavailable
    upstream_timeout,         ///< 504 upstream.timeout
    upstream_outcome_unknown, ///< 502 upstream.outcome_unknown (recorded on `fail` routes)
    upstream_bad_response,    ///< 502 upstream.bad_response (sent, but the answer was unusable)
    upstream_tls_error,       ///< 502 upstream.tls_error (TLS handshake failed: nothing was sent)
    connection_limit,         ///< 503 proxy.connection_limit (limits.max_connections reached)
    request_timeout,          ///< 408 request.timeout (a request body too slow)
    admin_too_many_attempts,  ///< 429 admin.too_many_attempts + Retry-After (wrong admin tokens)
    upstream_tunnel_limit,    ///< 503 upstream.tunnel_limit (the upstream's max_tunnels in use)
    memory_limit, ///< 503 proxy.memory_limit + Retry-After (limits.max_buffered_bytes spent)
    // The key administration API's (README "Key administration").
    admin_unauthorized,       ///< 401 admin.unauthorized (no bearer token, or a wrong one)
    admin_method_not_allowed, ///< 405 admin.method_not_allowed (neither GET nor DELETE)
    admin_bad_request,        ///< 400 admin.bad_request (a parameter missing, unknown or wrong)
    admin_store_unavailable,  ///< 503 admin.store_unavailable (the store did not answer)
    admin_key_in_flight,      ///< 409 admin.key_in_flight (a purge without force of a leased key)
    // Egress routes' (docs/egress.md).
    egress_circuit_open, ///< 503 egress.circuit_open + Retry-After (the upstream's breaker is open)
};

/// Number of problem codes (the last one is egress_circuit_open).
inline constexpr std::size_t problem_code_count =
    static_cast<std::size_t>(problem_code::egress_circuit_open) + 1;

/// One row of the problem table.
struct problem_info {
    problem_code code;
    std::string_view name;   ///< the stable `code` string, e.g. "idempotency.missing_key"
    unsigned status;         ///< default HTTP status (a route may override payload_mismatch)
    grpc_status grpc;        ///< the status a gRPC call gets instead (docs/grpc.md)
    std::string_view title;  ///< short, fixed summary (RFC 9457 `title`)
    std::string_view detail; ///< the default `detail` when the caller has nothing more precise
};

/// THE table, in enum order (checked below and in problem_test.cpp).
inline constexpr std::array<problem_info, problem_code_count> problem_table{{
    {problem_code::missing_key, "idempotency.missing_key", 400, grpc_status::invalid_argument,
     "Idempotency key missing", "this route requires an idempotency key"},
    {problem_code::invalid_key, "idempotency.invalid_key", 400, grpc_status::invalid_argument,
     "Idempotency key invalid", "the idempotency key is malformed, too long, empty or repeated"},
    {problem_code::payload_mismatch, "idempotency.payload_mismatch", 422,
     grpc_status::failed_precondition, "Idempotency key reused with a different request",
     "this idempotency key was used with a different request"},
    {problem_code::in_progress, "idempotency.in_progress", 409, grpc_status::aborted,
     "A request with this key is in progress",
     "a request with this idempotency key is still being processed; retry later"},
    {problem_code::response_not_replayable, "idempotency.response_not_replayable", 409,
     grpc_status::failed_precondition, "The recorded response cannot be replayed",
     "the response recorded for this key is too large to replay"},
    {problem_code::store_unavailable, "idempotency.store_unavailable", 503,
     grpc_status::unavailable, "Idempotency store unavailable",
     "the idempotency store cannot be reached; retry later"},
    {problem_code::request_too_large, "request.too_large", 413, grpc_status::resource_exhausted,
     "Request body too large", "request body exceeds max_request_bytes"},
    {problem_code::header_too_large, "request.header_too_large", 431,
     grpc_status::resource_exhausted, "Request header fields too large",
     "request header fields exceed max_header_bytes"},
    {problem_code::bad_request, "request.malformed", 400, grpc_status::invalid_argument,
     "Malformed request", "the request could not be understood"},
    {problem_code::route_not_found, "route.not_found", 404, grpc_status::unimplemented,
     "No route matches the request", "no route matches this path"},
    {problem_code::upstream_unavailable, "upstream.unavailable", 502, grpc_status::unavailable,
     "Upstream unavailable", "could not reach the upstream"},
    {problem_code::upstream_timeout, "upstream.timeout", 504, grpc_status::deadline_exceeded,
     "Upstream timed out", "the upstream did not answer in time"},
    {problem_code::upstream_outcome_unknown, "upstream.outcome_unknown", 502, grpc_status::unknown,
     "Upstream outcome unknown",
     "the upstream may or may not have processed this request; it will not be executed again "
     "under this key"},
    {problem_code::upstream_bad_response, "upstream.bad_response", 502, grpc_status::internal,
     "Upstream sent an unusable response",
     "the request was sent to the upstream, but its answer was malformed or too large; the "
     "upstream may have processed it"},
    {problem_code::upstream_tls_error, "upstream.tls_error", 502, grpc_status::unavailable,
     "Upstream TLS handshake failed",
     "the TLS handshake with the upstream failed (certificate not trusted, wrong host name, "
     "expired, or a client certificate refused); the request was not sent"},
    {problem_code::connection_limit, "proxy.connection_limit", 503, grpc_status::unavailable,
     "Too many connections", "the proxy is at its connection limit; retry later"},
    {problem_code::request_timeout, "request.timeout", 408, grpc_status::deadline_exceeded,
     "Request body too slow",
     "the request body did not arrive within limits.body_timeout, within "
     "limits.max_body_time or at limits.min_body_rate"},
    {problem_code::admin_too_many_attempts, "admin.too_many_attempts", 429,
     grpc_status::resource_exhausted, "Too many failed authentication attempts",
     "this address sent too many wrong admin tokens; retry after the time Retry-After gives"},
    {problem_code::upstream_tunnel_limit, "upstream.tunnel_limit", 503, grpc_status::unavailable,
     "Upstream tunnel limit reached",
     "the upstream's limit of open tunnels (max_tunnels) is reached; retry later"},
    {problem_code::memory_limit, "proxy.memory_limit", 503, grpc_status::resource_exhausted,
     "Buffered bodies at their limit",
     "the proxy's budget for buffered bodies (limits.max_buffered_bytes) is spent; retry later"},
    {problem_code::admin_unauthorized, "admin.unauthorized", 401, grpc_status::unauthenticated,
     "Authentication required",
     "send Authorization: Bearer TOKEN (the content of admin.keys_api.token_file)"},
    {problem_code::admin_method_not_allowed, "admin.method_not_allowed", 405,
     grpc_status::unimplemented, "Method not allowed",
     "use GET to inspect a key or DELETE to purge it"},
    {problem_code::admin_bad_request, "admin.bad_request", 400, grpc_status::invalid_argument,
     "Bad key administration request", "the key administration request could not be understood"},
    // The same title as idempotency.store_unavailable: the same condition, seen by the admin API.
    {problem_code::admin_store_unavailable, "admin.store_unavailable", 503,
     grpc_status::unavailable, "Idempotency store unavailable", "the store did not answer"},
    {problem_code::admin_key_in_flight, "admin.key_in_flight", 409, grpc_status::aborted,
     "The key is in flight",
     "a request with this key is being processed; purge with force=true to delete its lease and "
     "fence its owner (its answer will not be recorded, and a retry executes again)"},
    {problem_code::egress_circuit_open, "egress.circuit_open", 503, grpc_status::unavailable,
     "Upstream circuit open",
     "recent attempts to this upstream failed, so requests are not sent until the time "
     "Retry-After gives; nothing was sent"},
}};

namespace detail {
constexpr bool problem_table_in_order() {
    for (std::size_t i = 0; i < problem_table.size(); ++i) {
        if (static_cast<std::size_t>(problem_table[i].code) != i) {
            return false;
        }
    }
    return true;
}
} // namespace detail
static_assert(detail::problem_table_in_order(), "problem_table rows must follow the enum order");

/// The row of `c`. Precondition: `c` is a declared enumerator.
constexpr const problem_info& info(problem_code c) noexcept {
    return problem_table[static_cast<std::size_t>(c)];
}

/// "idempotency.missing_key" etc.
constexpr std::string_view to_string(problem_code c) noexcept {
    return info(c).name;
}

/// The gRPC status a gRPC call gets for `c`.
constexpr grpc_status grpc_status_of(problem_code c) noexcept {
    return info(c).grpc;
}

/// The default HTTP status of `c` (payload_mismatch: 422).
constexpr unsigned default_status(problem_code c) noexcept {
    return info(c).status;
}

} // namespace onceproxy::core
