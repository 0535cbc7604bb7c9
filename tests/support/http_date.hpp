#pragma once
// Reading an HTTP date the proxy wrote, independently of the proxy's own formatter (libc's
// strptime and timegm), so a wrong format fails the test instead of agreeing with itself.

#include <chrono>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>

namespace onceproxy::test {

/// The time an IMF-fixdate (RFC 9110 §5.6.7) names; nullopt for anything else, including a
/// date not in the exact fixed-length form.
inline std::optional<std::chrono::system_clock::time_point>
parse_imf_fixdate(const std::string& s) {
    if (s.size() != 29 || s.compare(25, 4, " GMT") != 0) {
        return std::nullopt;
    }
    std::tm tm{};
    const char* end = ::strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (end == nullptr || *end != '\0') {
        return std::nullopt;
    }
    return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

} // namespace onceproxy::test
