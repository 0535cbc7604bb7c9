#pragma once
// The proxy's own answers to gRPC calls (docs/grpc.md): a problem becomes a gRPC status in a
// trailers-only answer (HTTP 200, one HEADERS frame), never a problem+json body a gRPC client
// cannot read.

#include "onceproxy/http/context.hpp"

namespace onceproxy::http {

/// The field naming the stable problem code on a gRPC answer of the proxy's own.
inline constexpr std::string_view grpc_problem_field = "onceproxy-problem";

/// True when `req` is a gRPC call: content-type application/grpc or application/grpc+...
[[nodiscard]] bool is_grpc_call(const request& req) noexcept;

/// A problem answer (application/problem+json, as make_problem writes it, also replayed from a
/// record) as a gRPC call gets it: HTTP 200, content-type application/grpc, grpc-status from
/// the problem table, grpc-message (the detail, percent-encoded), onceproxy-problem (the code)
/// and grpc-retry-pushback-ms for a Retry-After; no body. Idempotency-Status and
/// Idempotency-Expires stay. Any other answer is left as it is.
void to_grpc_answer(response& res);

} // namespace onceproxy::http
