#pragma once
// UUID version 7 (RFC 9562 §5.7): 48 bits of Unix time in milliseconds, then 74 random bits,
// so keys sort by creation time. Pure: the time and the random bytes are inputs.

#include <array>
#include <cstdint>
#include <string>

namespace onceproxy::egress {

/// "0192f4c5-8b1e-7a3d-9c4e-5f6a7b8c9d0e": lower-case hex, dashes at 8-4-4-4-12, version 7,
/// variant 10 (RFC 9562).
std::string uuidv7(std::uint64_t unix_ms, const std::array<std::uint8_t, 10>& random);

/// uuidv7 of the system clock and random bytes from OpenSSL's generator (a CSPRNG: keys of
/// different requests and replicas must never collide). Any thread.
std::string new_uuidv7();

} // namespace onceproxy::egress
