#pragma once
// 128 random bits as 32 lower-case hex characters: owner tokens (fencing) and request ids.

#include <array>
#include <string>

namespace onceproxy::http {

/// 32 lower-case hex characters.
using hex_id = std::array<char, 32>;

/// Per-thread generator seeded from std::random_device; no locking.
hex_id random_hex_chars();

/// The same, as a string.
std::string random_hex_id();

} // namespace onceproxy::http
