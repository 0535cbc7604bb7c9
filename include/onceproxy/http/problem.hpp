#pragma once
// Every error the proxy itself produces is application/problem+json (RFC 9457) with a stable
// `code` (SPEC §3.2). The table of codes is core::problem_table; this renders it.

#include "onceproxy/core/problem.hpp"

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::http {

using response = boost::beast::http::response<boost::beast::http::string_body>;

/// Stable problem codes: core owns the enum and the one table of codes, statuses and titles.
using problem_code = core::problem_code;

/// The answer to a client request that could not be read, for every Beast read error (one
/// table: body_limit → 413, header_limit / buffer_overflow → 431, anything else → 400), or
/// nullopt when the client simply went away. `what` names the part: "request", "request body".
std::optional<response> read_failure_problem(const boost::system::error_code& ec,
                                             std::string_view what);

/// "idempotency.missing_key" etc. (core::to_string; the default status is
/// core::default_status).
std::string_view code_name(problem_code c) noexcept;

/// What one answer changes from its code's row of the table, by name:
/// `make_problem(problem_code::bad_request, "unsupported Expect value", {.status = 417})`.
struct problem_options {
    /// Overrides the row's status (payload_mismatch configured as 409; 417 for an Expect).
    std::optional<unsigned> status = std::nullopt;
    std::optional<unsigned> retry_after_s = std::nullopt; ///< adds Retry-After
    unsigned http_version = 11;                           ///< of the response
};

/// The problem with its default detail (core::problem_table).
response make_problem(problem_code c, problem_options o = {});

/// Builds the problem+json response. The body is serialised JSON with type, title, status,
/// detail and code.
response make_problem(problem_code c, std::string_view detail, problem_options o = {});

} // namespace onceproxy::http
