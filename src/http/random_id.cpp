#include "http/random_id.hpp"

#include <cstdint>
#include <random>

namespace onceproxy::http {

hex_id random_hex_chars() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    constexpr char digits[] = "0123456789abcdef";
    hex_id out{};
    std::size_t at = 0;
    for (int word = 0; word < 2; ++word) {
        const std::uint64_t bits = rng();
        for (int shift = 60; shift >= 0; shift -= 4) {
            out[at++] = digits[(bits >> shift) & 0xfU];
        }
    }
    return out;
}

std::string random_hex_id() {
    const hex_id id = random_hex_chars();
    return {id.data(), id.size()};
}

} // namespace onceproxy::http
