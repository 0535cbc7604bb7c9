#include "onceproxy/egress/uuidv7.hpp"

#include <openssl/rand.h>

#include <chrono>
#include <random>

namespace onceproxy::egress {

std::string uuidv7(std::uint64_t unix_ms, const std::array<std::uint8_t, 10>& random) {
    std::array<std::uint8_t, 16> b{};
    for (int i = 0; i < 6; ++i) {
        b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(unix_ms >> (8 * (5 - i)));
    }
    for (std::size_t i = 0; i < 10; ++i) {
        b[6 + i] = random[i];
    }
    b[6] = static_cast<std::uint8_t>(0x70 | (b[6] & 0x0f)); // version 7
    b[8] = static_cast<std::uint8_t>(0x80 | (b[8] & 0x3f)); // variant 10
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(36);
    for (std::size_t i = 0; i < b.size(); ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            out += '-';
        }
        out += hex[b[i] >> 4];
        out += hex[b[i] & 0x0f];
    }
    return out;
}

std::string new_uuidv7() {
    std::array<std::uint8_t, 10> random{};
    if (RAND_bytes(random.data(), static_cast<int>(random.size())) != 1) {
        // OpenSSL's generator failed (not seeded): std::random_device, which reads the kernel's.
        std::random_device rd;
        for (auto& b : random) {
            b = static_cast<std::uint8_t>(rd());
        }
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    return uuidv7(static_cast<std::uint64_t>(ms), random);
}

} // namespace onceproxy::egress
