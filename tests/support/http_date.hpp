#pragma once
// Reading an HTTP date the proxy wrote, independently of the proxy's own formatter (libc's
// strptime and timegm), so a wrong format fails the test instead of agreeing with itself.

#include "support/wait.hpp"

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

/// Waits until the wall clock has left the second that `t` falls in, so that a date formatted
/// from now on (Date, now + ttl) names a later second than one formatted at `t`. A little past
/// the turn: time(2) may read a coarse clock that lags by a tick.
inline void wait_past_second(std::chrono::system_clock::time_point t) {
    const auto turn = std::chrono::floor<std::chrono::seconds>(t) + std::chrono::seconds(1) +
                      std::chrono::milliseconds(50);
    wait_until([&] { return std::chrono::system_clock::now() >= turn; }, std::chrono::seconds(3),
               "the next second of the wall clock");
}

} // namespace onceproxy::test
