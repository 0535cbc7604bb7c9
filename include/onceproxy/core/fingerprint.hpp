#pragma once
// Request fingerprints, principal hashes and store keys (SPEC §3.3, §3.5). SHA-256 through
// OpenSSL EVP. Every hashed tuple is encoded with a domain tag and a length prefix per field,
// so no two different tuples share an encoding (no collision by concatenation).

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onceproxy::core {

/// A header as given to the hashing functions: name (compared case-insensitively, hashed in
/// lower case) and value (hashed as is).
using header_view = std::pair<std::string_view, std::string_view>;

/// SHA-256 of `data`: 32 raw bytes. Like every hashing function here, throws
/// std::runtime_error only if OpenSSL cannot provide SHA-256 at all (allocation failure).
[[nodiscard]] std::string sha256(std::string_view data);

/// Lower-case hexadecimal of arbitrary bytes (64 characters for a SHA-256).
[[nodiscard]] std::string to_hex(std::string_view bytes);
/// The same, written to `out`, which has room for 2 * bytes.size() characters.
void write_hex(std::string_view bytes, char* out) noexcept;

/// What identifies "the same request" under one key (SPEC §3.5).
struct fingerprint_input {
    std::string_view method;
    std::string_view target; ///< path with query, as received
    /// The configured fingerprint headers that are present, in configured order (repeated
    /// lines in arrival order). Names are lower-cased before hashing.
    std::vector<header_view> headers;
    std::string_view content_type; ///< decides whether the body is JSON
    std::string_view body;
    bool json_canonical = true; ///< hash JSON bodies in RFC 8785 canonical form
};

/// True for application/json and application/<anything>+json (parameters ignored).
[[nodiscard]] bool is_json_media_type(std::string_view content_type) noexcept;

/// SHA-256 (32 raw bytes) over method, target, headers and body. With json_canonical and a
/// JSON content type, a body that is valid JSON is hashed in canonical form
/// (number_form::distinct, so numerically different literals never merge); any other body,
/// including invalid JSON, is hashed as its raw bytes. Never fails.
[[nodiscard]] std::string compute_fingerprint(const fingerprint_input& input);

/// SHA-256 (32 raw bytes) identifying the caller from the configured scope headers that are
/// present (SPEC §3.3). No header present gives one fixed "anonymous" value. The credential
/// itself is never kept.
[[nodiscard]] std::string principal_hash(std::span<const header_view> headers);

/// The store key of an idempotency key: `prefix` followed by the lower-case hex SHA-256 of
/// (route, principal hash, key). Neither the raw key nor a credential appears in it, and keys
/// of different routes or principals never meet.
[[nodiscard]] std::string store_key(std::string_view prefix, std::string_view route,
                                    std::string_view principal_hash, std::string_view key);

} // namespace onceproxy::core
