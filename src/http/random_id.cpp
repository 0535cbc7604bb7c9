#include "http/random_id.hpp"

#include "onceproxy/core/fingerprint.hpp"

#include <cstdint>
#include <cstring>
#include <random>

namespace onceproxy::http {

hex_id random_hex_chars() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const std::array<std::uint64_t, 2> words{rng(), rng()};
    std::array<char, sizeof words> bytes{};
    std::memcpy(bytes.data(), words.data(), bytes.size());
    static_assert(sizeof(hex_id) == 2 * sizeof bytes);
    hex_id out{};
    core::write_hex({bytes.data(), bytes.size()}, out.data());
    return out;
}

std::string random_hex_id() {
    const hex_id id = random_hex_chars();
    return {id.data(), id.size()};
}

} // namespace onceproxy::http
