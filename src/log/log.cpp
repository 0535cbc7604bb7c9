#include "onceproxy/log/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>

namespace onceproxy::log {

namespace {

std::atomic<level> min_level_{level::info};
std::atomic<int> fd_{STDERR_FILENO};

/// Length of the well-formed UTF-8 sequence at the start of `s`, 0 when it is ill-formed
/// (Unicode 15 Table 3-7, which excludes overlongs, surrogates and values above U+10FFFF).
std::size_t utf8_sequence_length(std::string_view s) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    const auto in = [&](std::size_t i, unsigned lo, unsigned hi) {
        return i < s.size() && byte(i) >= lo && byte(i) <= hi;
    };
    const unsigned b0 = byte(0);
    if (b0 < 0x80) {
        return 1;
    }
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        return in(1, 0x80, 0xbf) ? 2 : 0;
    }
    if (b0 >= 0xe0 && b0 <= 0xef) {
        const unsigned lo = b0 == 0xe0 ? 0xa0 : 0x80; // E0 80..9F: overlong
        const unsigned hi = b0 == 0xed ? 0x9f : 0xbf; // ED A0..BF: UTF-16 surrogates
        return in(1, lo, hi) && in(2, 0x80, 0xbf) ? 3 : 0;
    }
    if (b0 >= 0xf0 && b0 <= 0xf4) {
        const unsigned lo = b0 == 0xf0 ? 0x90 : 0x80; // F0 80..8F: overlong
        const unsigned hi = b0 == 0xf4 ? 0x8f : 0xbf; // F4 90..: above U+10FFFF
        return in(1, lo, hi) && in(2, 0x80, 0xbf) && in(3, 0x80, 0xbf) ? 4 : 0;
    }
    return 0; // 80..C1 (continuation or overlong lead), F5..FF
}

constexpr char hex_digits[] = "0123456789abcdef";

template <class Number>
void append_number(std::string& out, Number n) {
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, n);
    if (ec != std::errc{}) {
        out += '0';
        return;
    }
    out.append(buf, end);
}

void append_value(std::string& out, const field::value_type& v) {
    if (const auto* s = std::get_if<std::string_view>(&v)) {
        append_json_string(out, *s);
    } else if (const auto* i = std::get_if<std::int64_t>(&v)) {
        append_number(out, *i);
    } else if (const auto* u = std::get_if<std::uint64_t>(&v)) {
        append_number(out, *u);
    } else if (const auto* d = std::get_if<double>(&v)) {
        // JSON has no NaN or infinity.
        if (*d != *d || *d > 1e308 || *d < -1e308) {
            out += "null";
        } else {
            append_number(out, *d);
        }
    } else {
        out += std::get<bool>(v) ? "true" : "false";
    }
}

} // namespace

std::string_view to_string(level l) noexcept {
    switch (l) {
    case level::debug:
        return "debug";
    case level::info:
        return "info";
    case level::warn:
        return "warn";
    case level::error:
        return "error";
    }
    return "error";
}

void set_min_level(level l) noexcept {
    min_level_.store(l, std::memory_order_relaxed);
}

level min_level() noexcept {
    return min_level_.load(std::memory_order_relaxed);
}

bool enabled(level l) noexcept {
    return l >= min_level_.load(std::memory_order_relaxed);
}

void set_fd(int fd) noexcept {
    fd_.store(fd, std::memory_order_relaxed);
}

std::string escape_invalid_utf8(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    while (!bytes.empty()) {
        const auto n = utf8_sequence_length(bytes);
        if (n == 0) {
            // One byte at a time: the next byte may start a well-formed sequence (resync).
            const auto u = static_cast<unsigned char>(bytes.front());
            out += "\\x";
            out += hex_digits[u >> 4];
            out += hex_digits[u & 0xf];
            bytes.remove_prefix(1);
        } else {
            out.append(bytes.substr(0, n));
            bytes.remove_prefix(n);
        }
    }
    return out;
}

void append_json_string(std::string& out, std::string_view s) {
    const auto valid = escape_invalid_utf8(s);
    out += '"';
    for (const char c : valid) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\r':
            out += "\\r";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            if (u < 0x20 || u == 0x7f) {
                out += "\\u00";
                out += hex_digits[u >> 4];
                out += hex_digits[u & 0xf];
            } else {
                out += c;
            }
        }
    }
    out += '"';
}

std::string format_line(std::chrono::system_clock::time_point ts, level l,
                        std::string_view component, std::string_view msg, fields extra) {
    std::string line;
    line.reserve(96 + msg.size());
    line += "{\"ts\":";
    append_number(
        line, std::chrono::duration_cast<std::chrono::milliseconds>(ts.time_since_epoch()).count());
    line += ",\"level\":";
    append_json_string(line, to_string(l));
    line += ",\"component\":";
    append_json_string(line, component);
    line += ",\"msg\":";
    append_json_string(line, msg);
    for (const auto& f : extra) {
        line += ',';
        append_json_string(line, f.key());
        line += ':';
        append_value(line, f.value());
    }
    line += "}\n";
    return line;
}

void write(level l, std::string_view component, std::string_view msg, fields extra) noexcept {
    if (!enabled(l)) {
        return;
    }
    try {
        const auto line = format_line(std::chrono::system_clock::now(), l, component, msg, extra);
        const int fd = fd_.load(std::memory_order_relaxed);
        std::string_view rest = line;
        while (!rest.empty()) {
            const auto n = ::write(fd, rest.data(), rest.size());
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return; // stderr closed or full: the line is lost, the proxy goes on
            }
            rest.remove_prefix(static_cast<std::size_t>(n));
        }
    } catch (...) {
        // Out of memory while formatting: nothing sensible to log it to.
    }
}

} // namespace onceproxy::log
