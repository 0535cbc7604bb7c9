#include "onceproxy/core/grpc.hpp"

#include <array>

namespace onceproxy::core {

bool is_grpc_content_type(std::string_view ct) noexcept {
    constexpr std::string_view base = "application/grpc";
    if (ct.size() < base.size()) {
        return false;
    }
    for (std::size_t i = 0; i < base.size(); ++i) {
        const char c = ct[i] >= 'A' && ct[i] <= 'Z' ? static_cast<char>(ct[i] - 'A' + 'a') : ct[i];
        if (c != base[i]) {
            return false;
        }
    }
    const auto rest = ct.substr(base.size());
    return rest.empty() || rest.front() == '+' || rest.front() == ';';
}

std::optional<unsigned> parse_grpc_status(std::string_view v) noexcept {
    if (v.empty() || v.size() > 9) {
        return std::nullopt;
    }
    unsigned n = 0;
    for (const char c : v) {
        if (c < '0' || c > '9') {
            return std::nullopt;
        }
        n = n * 10 + static_cast<unsigned>(c - '0');
    }
    return n;
}

std::optional<std::chrono::milliseconds> parse_grpc_timeout(std::string_view v) noexcept {
    if (v.size() < 2 || v.size() > 9) {
        return std::nullopt;
    }
    std::uint64_t n = 0;
    for (const char c : v.substr(0, v.size() - 1)) {
        if (c < '0' || c > '9') {
            return std::nullopt;
        }
        n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    const auto up = [](std::uint64_t x, std::uint64_t per_ms) { return (x + per_ms - 1) / per_ms; };
    std::uint64_t ms = 0;
    switch (v.back()) {
    case 'H':
        ms = n * 3'600'000;
        break;
    case 'M':
        ms = n * 60'000;
        break;
    case 'S':
        ms = n * 1'000;
        break;
    case 'm':
        ms = n;
        break;
    case 'u':
        ms = up(n, 1'000);
        break;
    case 'n':
        ms = up(n, 1'000'000);
        break;
    default:
        return std::nullopt;
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

grpc_status grpc_status_of_http(unsigned http_status) noexcept {
    switch (http_status) {
    case 400:
        return grpc_status::internal;
    case 401:
        return grpc_status::unauthenticated;
    case 403:
        return grpc_status::permission_denied;
    case 404:
        return grpc_status::unimplemented;
    case 429:
    case 502:
    case 503:
    case 504:
        return grpc_status::unavailable;
    default:
        return grpc_status::unknown;
    }
}

std::string encode_grpc_message(std::string_view text) {
    constexpr std::array<char, 16> hex{'0', '1', '2', '3', '4', '5', '6', '7',
                                       '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'};
    std::string out;
    out.reserve(text.size());
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c > 0x7E || c == '%') {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 0xF];
        } else {
            out += ch;
        }
    }
    return out;
}

} // namespace onceproxy::core
