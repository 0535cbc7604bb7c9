#pragma once
// The client side of WebSocket framing (RFC 6455 §5), enough to talk to an echo service through
// the proxy over a `stream_connection` after a 101: masked client frames out, server frames in.

#include "support/stream_connection.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::test {

/// Frame opcodes (RFC 6455 §5.2).
enum class ws_opcode : std::uint8_t {
    continuation = 0x0,
    text = 0x1,
    binary = 0x2,
    close = 0x8,
    ping = 0x9,
    pong = 0xa,
};

/// One message as received: data frames reassembled, or a single control frame.
struct ws_message {
    ws_opcode opcode = ws_opcode::text;
    std::string payload;
};

/// The RFC 6455 §1.3 sample key and the Sec-WebSocket-Accept a server must answer to it.
inline constexpr std::string_view ws_sample_key = "dGhlIHNhbXBsZSBub25jZQ==";
inline constexpr std::string_view ws_sample_accept = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// A masked client frame (clients must mask, §5.3) carrying `payload`.
std::string ws_client_frame(ws_opcode opcode, std::string_view payload, bool fin = true);

/// Reads the next message: data frames up to the one with FIN, or one control frame. Rejects
/// (nullopt) masked server frames, timeouts and closes.
std::optional<ws_message> read_ws_message(stream_connection& c, std::chrono::milliseconds timeout);

} // namespace onceproxy::test
