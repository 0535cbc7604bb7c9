#pragma once
// Deriving the idempotency key of a request (SPEC §3.1, §3.4): parsing the key header
// and extracting a natural key from a JSON body. Pure functions, no I/O.

#include <onceproxy/config/config.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace onceproxy::core {

/// Accepted key header syntax; the config enum is reused so routes pass it straight through.
using key_syntax = onceproxy::config::key_syntax;

/// Why a key header was refused. Every value maps to HTTP 400 (SPEC §3.2):
/// `missing` → idempotency.missing_key, all others → idempotency.invalid_key.
enum class key_error {
    missing,   ///< no key header line at all
    empty,     ///< the key is the empty string (or the field value is empty)
    too_long,  ///< more than max_length characters after unquoting
    malformed, ///< not an sf-string (strict) nor a bare token (lenient)
    repeated,  ///< more than one key header line (a list, not a key)
};

/// Outcome of parse_idempotency_key: exactly one of `key` and `error` is set.
struct key_parse_result {
    std::optional<std::string> key; ///< the key after unquoting
    std::optional<key_error> error;

    [[nodiscard]] bool ok() const noexcept { return key.has_value(); }
};

/// Parses the values of every header line carrying the key, in order of arrival.
///
/// strict: the value must be exactly one RFC 9651 sf-string (surrounding SP/HTAB, which
/// HTTP strips from field values anyway, is ignored): DQUOTE, characters 0x20-0x7E with
/// `"` and `\` only as the escapes `\"` and `\\`, DQUOTE, then nothing (no parameters, no
/// list member). lenient: a strict sf-string or a bare token of 0x21-0x7E without `,`, `"`
/// and `\`; `"abc"` and `abc` yield the same key.
/// The key after unquoting must have 1..max_length characters.
[[nodiscard]] key_parse_result parse_idempotency_key(std::span<const std::string_view> header_lines,
                                                     key_syntax syntax, std::size_t max_length);

/// Natural key (SPEC §3.4): the value at RFC 6901 JSON Pointer `pointer` (with `~0`/`~1`
/// escapes) in the JSON document `body`. A string value is returned as is, an integer as its
/// decimal text; any other value, a missing member, a bad pointer or an invalid body
/// (including duplicate member names anywhere, which make the document ambiguous) give
/// nullopt. The caller still applies its own length limits to the result.
[[nodiscard]] std::optional<std::string> extract_json_pointer(std::string_view body,
                                                              std::string_view pointer);

} // namespace onceproxy::core
