#include "http/random_id.hpp"

#include "onceproxy/core/fingerprint.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <random>

namespace onceproxy::http {

std::string random_hex_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const std::array<std::uint64_t, 2> words{rng(), rng()};
    std::array<char, sizeof words> bytes{};
    std::memcpy(bytes.data(), words.data(), bytes.size());
    return core::to_hex({bytes.data(), bytes.size()});
}

} // namespace onceproxy::http
