#pragma once
// Optional white space (RFC 9110 §5.6.3: spaces and horizontal tabs) around a field value or a
// list member. Standard library only and header-only, so the lowest modules (core, wire) share
// it without a dependency between them.

#include <string_view>

namespace onceproxy::text {

[[nodiscard]] constexpr bool is_ows(char c) noexcept {
    return c == ' ' || c == '\t';
}

/// `s` without the OWS at both ends (what Beast's `fields` strips from a value).
[[nodiscard]] constexpr std::string_view trim_ows(std::string_view s) noexcept {
    while (!s.empty() && is_ows(s.front())) {
        s.remove_prefix(1);
    }
    while (!s.empty() && is_ows(s.back())) {
        s.remove_suffix(1);
    }
    return s;
}

} // namespace onceproxy::text
