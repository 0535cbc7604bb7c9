#pragma once
// The types both sides of an HTTP/2 connection share (server_session, client_session).

#include <chrono>
#include <cstdint>
#include <string>

namespace onceproxy::h2 {

using clock = std::chrono::steady_clock;

/// HTTP/2 error codes (RFC 9113 §7) the caller uses.
enum class error_code : std::uint32_t {
    no_error = 0x0,
    protocol_error = 0x1,
    internal_error = 0x2,
    flow_control_error = 0x3,
    refused_stream = 0x7,
    cancel = 0x8,
    enhance_your_calm = 0xb,
    http_1_1_required = 0xd,
};

/// Why the session ended (the connection closes once its last bytes are written).
enum class end_reason {
    none,           ///< still open
    peer_closed,    ///< the peer's GOAWAY, or all done after our GOAWAY (shutdown/terminate)
    protocol_error, ///< the peer broke the protocol (GOAWAY PROTOCOL_ERROR and the like)
    rapid_reset,    ///< too many streams reset by the peer per second (CVE-2023-44487)
    control_flood,  ///< too many SETTINGS/PING/WINDOW_UPDATE/PRIORITY/empty DATA per second
    header_flood,   ///< a header block far past max_header_bytes (CONTINUATION flood)
};

struct field {
    std::string name; ///< lower case (HTTP/2 requires it)
    std::string value;
};

} // namespace onceproxy::h2
