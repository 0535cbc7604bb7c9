#pragma once
// 128 random bits as 32 lower-case hex characters: owner tokens (fencing) and request ids.

#include <string>

namespace onceproxy::http {

/// Per-thread generator seeded from std::random_device; no locking.
std::string random_hex_id();

} // namespace onceproxy::http
