#include "support/websocket_frames.hpp"

#include <algorithm>

namespace onceproxy::test {

std::string ws_client_frame(ws_opcode opcode, std::string_view payload, bool fin) {
    std::string f;
    f += static_cast<char>((fin ? 0x80 : 0x00) | static_cast<std::uint8_t>(opcode));
    const auto n = payload.size();
    if (n < 126) {
        f += static_cast<char>(0x80 | n);
    } else if (n <= 0xffff) {
        f += static_cast<char>(0x80 | 126);
        f += static_cast<char>((n >> 8) & 0xff);
        f += static_cast<char>(n & 0xff);
    } else {
        f += static_cast<char>(0x80 | 127);
        for (int shift = 56; shift >= 0; shift -= 8) {
            f += static_cast<char>((static_cast<std::uint64_t>(n) >> shift) & 0xff);
        }
    }
    // A fixed mask is fine for a test: it only has to be applied (§5.3).
    static constexpr unsigned char mask[4] = {0x37, 0xfa, 0x21, 0x3d};
    f.append(reinterpret_cast<const char*>(mask), 4);
    for (std::size_t i = 0; i < n; ++i) {
        f += static_cast<char>(static_cast<unsigned char>(payload[i]) ^ mask[i % 4]);
    }
    return f;
}

std::optional<ws_message> read_ws_message(stream_connection& c, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const auto left = [&] {
        return std::max(std::chrono::milliseconds(1),
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()));
    };
    ws_message m;
    bool started = false;
    for (;;) {
        const auto h = c.read_exact(2, left());
        if (!h) {
            return std::nullopt;
        }
        const auto b0 = static_cast<unsigned char>((*h)[0]);
        const auto b1 = static_cast<unsigned char>((*h)[1]);
        if ((b1 & 0x80) != 0) {
            return std::nullopt; // a server never masks (§5.1)
        }
        std::uint64_t n = b1 & 0x7f;
        if (n >= 126) {
            const auto ext = c.read_exact(n == 126 ? 2 : 8, left());
            if (!ext) {
                return std::nullopt;
            }
            n = 0;
            for (const char ch : *ext) {
                n = (n << 8) | static_cast<unsigned char>(ch);
            }
        }
        const auto payload = c.read_exact(static_cast<std::size_t>(n), left());
        if (!payload) {
            return std::nullopt;
        }
        const auto op = static_cast<ws_opcode>(b0 & 0x0f);
        const bool fin = (b0 & 0x80) != 0;
        if ((b0 & 0x08) != 0) { // control frame: never fragmented, may come between fragments
            return ws_message{op, *payload};
        }
        if (!started) {
            m.opcode = op;
            started = true;
        }
        m.payload += *payload;
        if (fin) {
            return m;
        }
    }
}

} // namespace onceproxy::test
