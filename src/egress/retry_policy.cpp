#include "onceproxy/egress/retry_policy.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <string>

namespace onceproxy::egress {

bool idempotent_method(std::string_view m) noexcept {
    return m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "TRACE" || m == "PUT" ||
           m == "DELETE";
}

bool retried_on(const config::retry_config& retry, attempt_result r) noexcept {
    switch (r) {
    case attempt_result::retryable_status:
        return true;
    case attempt_result::connect_failure:
        return retry.on_connect_failure;
    case attempt_result::reset:
        return retry.on_reset;
    case attempt_result::timeout:
        return retry.on_timeout;
    case attempt_result::answered:
    case attempt_result::other:
        return false;
    }
    return false;
}

std::chrono::milliseconds backoff_ceiling(const config::retry_config& retry,
                                          unsigned retry_number) noexcept {
    const auto base = retry.base_delay.count();
    const auto cap = retry.max_delay.count();
    // Doubling past the cap stops early, so no shift overflows.
    std::int64_t d = base;
    for (unsigned i = 1; i < retry_number && d < cap; ++i) {
        d *= 2;
    }
    return std::chrono::milliseconds(std::min<std::int64_t>(d, cap));
}

std::chrono::milliseconds full_jitter(std::chrono::milliseconds ceiling, double u) noexcept {
    u = std::clamp(u, 0.0, 1.0);
    return std::chrono::milliseconds(
        static_cast<std::int64_t>(std::floor(static_cast<double>(ceiling.count()) * u)));
}

std::optional<std::chrono::milliseconds>
parse_retry_after(std::string_view value, std::chrono::system_clock::time_point now) {
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
        value.remove_prefix(1);
    }
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
        value.remove_suffix(1);
    }
    if (value.empty()) {
        return std::nullopt;
    }
    if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        std::uint64_t s = 0;
        const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), s);
        if (ec != std::errc{} || p != value.data() + value.size()) {
            return std::chrono::milliseconds::max(); // more seconds than fit: very long
        }
        if (s > 10'000'000) {
            return std::chrono::milliseconds::max();
        }
        return std::chrono::seconds(s);
    }
    // IMF-fixdate, e.g. "Sun, 06 Nov 1994 08:49:37 GMT" (the form senders must use).
    std::tm tm{};
    const std::string text(value);
    const char* end = ::strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (end == nullptr || *end != '\0') {
        return std::nullopt;
    }
    const auto at = std::chrono::system_clock::from_time_t(::timegm(&tm));
    if (at <= now) {
        return std::chrono::milliseconds(0);
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(at - now);
}

std::optional<std::chrono::milliseconds>
next_wait(const config::retry_config& retry, std::chrono::milliseconds jittered,
          std::optional<std::chrono::milliseconds> retry_after) noexcept {
    if (!retry_after) {
        return jittered;
    }
    if (*retry_after > retry.max_retry_after) {
        return std::nullopt;
    }
    return std::max(jittered, *retry_after);
}

} // namespace onceproxy::egress
