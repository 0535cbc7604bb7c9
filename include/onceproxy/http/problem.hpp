#pragma once
// Every error the proxy itself produces is application/problem+json (RFC 9457) with a stable
// `code` (SPEC §3.2). The table of codes lives here and nowhere else.

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::http {

using response = boost::beast::http::response<boost::beast::http::string_body>;

/// Stable problem codes (the `code` member; `type` is derived from it).
enum class problem_code {
    missing_key,              ///< 400 idempotency.missing_key
    invalid_key,              ///< 400 idempotency.invalid_key
    payload_mismatch,         ///< 422 (or 409 by config) idempotency.payload_mismatch
    in_progress,              ///< 409 idempotency.in_progress + Retry-After
    response_not_replayable,  ///< 409 idempotency.response_not_replayable
    store_unavailable,        ///< 503 idempotency.store_unavailable + Retry-After
    request_too_large,        ///< 413 request.too_large
    header_too_large,         ///< 431 request.header_too_large
    bad_request,              ///< 400 request.malformed
    route_not_found,          ///< 404 route.not_found (no route matches)
    upstream_unavailable,     ///< 502 upstream.unavailable
    upstream_timeout,         ///< 504 upstream.timeout
    upstream_outcome_unknown, ///< 502 upstream.outcome_unknown (recorded on `fail` routes)
    upstream_bad_response,    ///< 502 upstream.bad_response (response too large or unparsable)
    connection_limit,         ///< 503 proxy.connection_limit (limits.max_connections reached)
};

/// The answer to a client request that could not be read, for every Beast read error (one
/// table: body_limit → 413, header_limit / buffer_overflow → 431, anything else → 400), or
/// nullopt when the client simply went away. `what` names the part: "request", "request body".
std::optional<response> read_failure_problem(const boost::system::error_code& ec,
                                             std::string_view what);

/// "idempotency.missing_key" etc.
std::string_view code_name(problem_code c) noexcept;

/// The default HTTP status of a code (payload_mismatch: 422).
unsigned default_status(problem_code c) noexcept;

/// Builds the problem+json response. `status` overrides the default (payload_mismatch 409);
/// `retry_after_s` adds Retry-After. The body is serialised JSON with type, title, status,
/// detail and code.
response make_problem(problem_code c, std::string_view detail, unsigned http_version = 11,
                      std::optional<unsigned> status = std::nullopt,
                      std::optional<unsigned> retry_after_s = std::nullopt);

} // namespace onceproxy::http
