#include "http/random_id.hpp"

#include <random>

namespace onceproxy::http {

std::string random_hex_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static constexpr char hex[] = "0123456789abcdef";
    std::string id(32, '0');
    const auto a = rng();
    const auto b = rng();
    for (std::size_t i = 0; i < 16; ++i) {
        id[i] = hex[(a >> (i * 4)) & 0xF];
        id[16 + i] = hex[(b >> (i * 4)) & 0xF];
    }
    return id;
}

} // namespace onceproxy::http
