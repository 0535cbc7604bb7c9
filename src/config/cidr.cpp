#include "onceproxy/config/cidr.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <string>

namespace onceproxy::config {
namespace {

/// The 16-byte form of an address: IPv6 as is, IPv4 as ::ffff:a.b.c.d. `is_v4` tells which.
std::optional<std::array<std::uint8_t, 16>> parse_address(std::string_view text, bool& is_v4) {
    std::array<std::uint8_t, 16> out{};
    const std::string s(text);
    in_addr v4{};
    if (::inet_pton(AF_INET, s.c_str(), &v4) == 1) {
        is_v4 = true;
        out[10] = 0xff;
        out[11] = 0xff;
        const auto* b = reinterpret_cast<const std::uint8_t*>(&v4.s_addr);
        std::copy(b, b + 4, out.begin() + 12);
        return out;
    }
    in6_addr v6{};
    if (::inet_pton(AF_INET6, s.c_str(), &v6) == 1) {
        is_v4 = false;
        const auto* b = reinterpret_cast<const std::uint8_t*>(&v6);
        std::copy(b, b + 16, out.begin());
        return out;
    }
    return std::nullopt;
}

bool same_prefix(const std::array<std::uint8_t, 16>& a, const std::array<std::uint8_t, 16>& b,
                 unsigned bits) {
    std::size_t i = 0;
    for (; bits >= 8; bits -= 8, ++i) {
        if (a[i] != b[i]) {
            return false;
        }
    }
    if (bits == 0) {
        return true;
    }
    const auto mask = static_cast<std::uint8_t>(0xff << (8 - bits));
    return (a[i] & mask) == (b[i] & mask);
}

} // namespace

std::optional<cidr> parse_cidr(std::string_view text) {
    const auto slash = text.find('/');
    bool is_v4 = false;
    const auto addr = parse_address(text.substr(0, slash), is_v4);
    if (!addr) {
        return std::nullopt;
    }
    const unsigned max_bits = is_v4 ? 32 : 128;
    unsigned bits = max_bits;
    if (slash != std::string_view::npos) {
        const auto p = text.substr(slash + 1);
        const auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), bits);
        if (p.empty() || p.size() > 3 || ec != std::errc{} || ptr != p.data() + p.size() ||
            bits > max_bits) {
            return std::nullopt;
        }
    }
    cidr out;
    out.address = *addr;
    out.prefix_length = is_v4 ? bits + 96 : bits;
    // Host bits must be zero: compare with the address cut to its prefix.
    std::array<std::uint8_t, 16> network{};
    for (unsigned i = 0; i < 128; ++i) {
        const auto byte = i / 8;
        const auto bit = static_cast<std::uint8_t>(0x80 >> (i % 8));
        if (i < out.prefix_length) {
            network[byte] = static_cast<std::uint8_t>(network[byte] | (out.address[byte] & bit));
        }
    }
    if (network != out.address) {
        return std::nullopt;
    }
    return out;
}

bool address_in(std::string_view ip, std::span<const cidr> blocks) {
    if (blocks.empty()) {
        return false;
    }
    if (const auto zone = ip.find('%'); zone != std::string_view::npos) {
        ip = ip.substr(0, zone);
    }
    bool is_v4 = false;
    const auto addr = parse_address(ip, is_v4);
    if (!addr) {
        return false;
    }
    for (const auto& b : blocks) {
        if (same_prefix(*addr, b.address, b.prefix_length)) {
            return true;
        }
    }
    return false;
}

} // namespace onceproxy::config
