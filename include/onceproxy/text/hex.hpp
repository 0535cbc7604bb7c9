#pragma once
// Reading hexadecimal digits (percent-encoding, key files). Standard library only and
// header-only, like ows.hpp: config and http share it without a dependency between them.
// Writing hex is core::to_hex.

namespace onceproxy::text {

/// The value of hexadecimal digit `c` (either case), or -1 when it is not one.
[[nodiscard]] constexpr int hex_value(char c) noexcept {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

} // namespace onceproxy::text
