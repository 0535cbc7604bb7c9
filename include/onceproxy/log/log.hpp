#pragma once
// The process's own log (SPEC §6): one JSON line per event on stderr, written with one write(2)
// so lines from several threads never interleave. Requests have their own, separate access log
// on stdout (http/access_log.hpp); this one is for lifecycle, configuration, store and
// listener events, which are rare: nothing here is on a request's fast path.
//
//   {"ts":1700000000000,"level":"info","component":"app","msg":"listening","port":8080}
//
// Standard library only, so every module can link it.

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

namespace onceproxy::log {

enum class level : std::uint8_t {
    debug, ///< detail for whoever debugs the proxy; off by default
    info,  ///< lifecycle: listening, signals, reloads, a store back in service
    warn,  ///< degraded but serving: a store down, a lowered limit, a refused reload
    error, ///< something failed: a start-up step, a caught exception, a rejected config
};

/// "debug", "info", "warn", "error".
std::string_view to_string(level l) noexcept;

/// One key/value member of a line, after ts, level, component and msg. Strings are viewed, not
/// copied: a field lives only for the call it is passed to.
class field {
public:
    using value_type = std::variant<std::string_view, std::int64_t, std::uint64_t, double, bool>;

    field(std::string_view key, std::string_view value) : key_(key), value_(value) {}
    field(std::string_view key, const char* value) : key_(key), value_(std::string_view(value)) {}
    field(std::string_view key, const std::string& value)
        : key_(key), value_(std::string_view(value)) {}
    field(std::string_view key, bool value) : key_(key), value_(value) {}
    field(std::string_view key, double value) : key_(key), value_(value) {}
    template <class Int>
    requires(std::is_integral_v<Int> && !std::is_same_v<Int, bool>)
        field(std::string_view key, Int value)
        : key_(key), value_(std::is_signed_v<Int> ? value_type(static_cast<std::int64_t>(value))
                                                  : value_type(static_cast<std::uint64_t>(value))) {
    }

    std::string_view key() const noexcept { return key_; }
    const value_type& value() const noexcept { return value_; }

private:
    std::string_view key_;
    value_type value_;
};

using fields = std::initializer_list<field>;

/// Lines below `l` are dropped (default: info). Any thread; usually set once from the config
/// at start and again on a reload.
void set_min_level(level l) noexcept;
level min_level() noexcept;
/// Whether a line at `l` would be written (to skip building costly fields).
bool enabled(level l) noexcept;

/// Where lines go (default: STDERR_FILENO). For tests; not synchronised with write().
void set_fd(int fd) noexcept;

/// The line for an event, '\n' included: a JSON object with ts (milliseconds since the epoch),
/// level, component, msg, then `extra` in order. Strings are JSON-escaped; bytes that are not
/// well-formed UTF-8 become `\xNN` text, as in the access log, so the line stays valid JSON.
std::string format_line(std::chrono::system_clock::time_point ts, level l,
                        std::string_view component, std::string_view msg, fields extra = {});

/// Formats and writes one line (a single write(2), retried only for the unwritten rest) when
/// `l` is enabled. Any thread; never throws (a line that cannot be written is lost).
void write(level l, std::string_view component, std::string_view msg, fields extra = {}) noexcept;

inline void debug(std::string_view component, std::string_view msg, fields extra = {}) noexcept {
    write(level::debug, component, msg, extra);
}
inline void info(std::string_view component, std::string_view msg, fields extra = {}) noexcept {
    write(level::info, component, msg, extra);
}
inline void warn(std::string_view component, std::string_view msg, fields extra = {}) noexcept {
    write(level::warn, component, msg, extra);
}
inline void error(std::string_view component, std::string_view msg, fields extra = {}) noexcept {
    write(level::error, component, msg, extra);
}

/// `bytes` as valid UTF-8: well-formed UTF-8 sequences (RFC 3629) are kept, and each byte of an
/// ill-formed one (stray continuation, overlong form, surrogate, code point above U+10FFFF,
/// truncated sequence) becomes the four characters `\xNN` (lower-case hex), so a JSON line stays
/// valid and still shows what was sent.
std::string escape_invalid_utf8(std::string_view bytes);

/// Appends `s` to `out` as a JSON string literal (quotes included): escape_invalid_utf8, then
/// `"`, `\` and control characters escaped (RFC 8259 §7).
void append_json_string(std::string& out, std::string_view s);

} // namespace onceproxy::log
