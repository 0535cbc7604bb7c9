#pragma once
// gRPC's wire vocabulary as the proxy reads it (docs/grpc.md): which requests are gRPC calls,
// their status codes, grpc-timeout and grpc-message. Pure: no I/O.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::core {

/// gRPC status codes (grpc/doc/statuscodes.md).
enum class grpc_status : std::uint8_t {
    ok = 0,
    cancelled = 1,
    unknown = 2,
    invalid_argument = 3,
    deadline_exceeded = 4,
    not_found = 5,
    already_exists = 6,
    permission_denied = 7,
    resource_exhausted = 8,
    failed_precondition = 9,
    aborted = 10,
    out_of_range = 11,
    unimplemented = 12,
    internal = 13,
    unavailable = 14,
    data_loss = 15,
    unauthenticated = 16,
};

/// True for application/grpc and application/grpc+<format> (with parameters or not); false
/// for grpc-web and everything else.
[[nodiscard]] bool is_grpc_content_type(std::string_view content_type) noexcept;

/// The value of a grpc-status field: decimal digits, nothing else.
[[nodiscard]] std::optional<unsigned> parse_grpc_status(std::string_view value) noexcept;

/// A grpc-timeout value (1 to 8 digits and a unit H, M, S, m, u or n), rounded up to whole
/// milliseconds; nullopt when malformed.
[[nodiscard]] std::optional<std::chrono::milliseconds>
parse_grpc_timeout(std::string_view value) noexcept;

/// The status a gRPC client reports for an answer without grpc-status, by its HTTP status
/// (grpc/doc/http-grpc-status-mapping.md); unknown for 200.
[[nodiscard]] grpc_status grpc_status_of_http(unsigned http_status) noexcept;

/// grpc-message's percent-encoding: bytes outside printable ASCII and '%' become %XX.
[[nodiscard]] std::string encode_grpc_message(std::string_view text);

} // namespace onceproxy::core
