#pragma once
// Encryption at rest of stored records: AES-256-GCM (OpenSSL EVP) around the encoded record,
// with the store key and the claim fields kept beside the record bound as additional
// authenticated data, so a record copied under another key, altered (or its fields beside it),
// or sealed with a key this process does not hold fails to open. Pure: no I/O but the random
// nonce.
//
// Sealed form (all of it stored as the record's payload):
//   marker | key id length (u8, 1..64) | key id |
//   nonce (12 bytes) | ciphertext (as long as the encoded record) | tag (16 bytes)
// The authenticated data is the sealed form's head (marker, key id, nonce) followed by the
// caller's `aad`. The marker (never a record_format_version) names what the caller bound:
//   0xE6 (sealed_record_marker, written now): the store key and the claim fields kept beside
//        the record (response_record.hpp, record_binding_aad);
//   0xE5 (sealed_record_marker_v1, written by earlier versions, still opened): the store key.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::core {

/// First byte of every record sealed now.
inline constexpr unsigned char sealed_record_marker = 0xE6;
/// First byte of a record sealed by an earlier version (its authenticated data: the store key).
inline constexpr unsigned char sealed_record_marker_v1 = 0xE5;
inline constexpr std::size_t record_key_bytes = 32;
inline constexpr std::size_t record_nonce_bytes = 12;
inline constexpr std::size_t record_tag_bytes = 16;
inline constexpr std::size_t max_record_key_id_bytes = 64;

/// Why a stored record could not be opened (the `reason` label of
/// onceproxy_record_decrypt_failures_total).
enum class record_open_failure : unsigned char {
    plaintext,      ///< not sealed, but encryption is on: never trusted
    unknown_key,    ///< sealed with a key id this process does not hold (or encryption is off)
    authentication, ///< the tag does not verify: another store key, altered bytes, another key
    malformed,      ///< sealed form truncated
};
inline constexpr std::size_t record_open_failure_count = 4;

[[nodiscard]] std::string_view to_string(record_open_failure f) noexcept;

/// True when `stored` is in the sealed form (by its first byte, either marker).
[[nodiscard]] bool is_sealed(std::string_view stored) noexcept;

/// True when `stored` is sealed with sealed_record_marker_v1 (bound to the store key only).
[[nodiscard]] bool is_sealed_v1(std::string_view stored) noexcept;

/// The key id of a sealed record; nullopt when `stored` is not a well-formed sealed head.
[[nodiscard]] std::optional<std::string_view> sealed_key_id(std::string_view stored) noexcept;

struct record_key {
    std::string id;    ///< 1..64 bytes
    std::string bytes; ///< exactly record_key_bytes
};

class record_cipher {
public:
    /// `keys`: the first seals, every one opens. Throws std::invalid_argument on an empty list,
    /// a key not 32 bytes long, an id empty or longer than 64 bytes, or a repeated id.
    explicit record_cipher(std::vector<record_key> keys);

    /// The id of the key that seals.
    [[nodiscard]] const std::string& primary_id() const noexcept { return keys_.front().id; }

    /// Seals `plain` with the first key and a fresh random nonce, bound to `aad`. Throws
    /// std::runtime_error when the random generator or the cipher fails.
    [[nodiscard]] std::string seal(std::string_view plain, std::string_view aad) const;

    /// Opens what seal produced under the same `aad`; nullopt (and the reason in `why`) for
    /// anything else.
    [[nodiscard]] std::optional<std::string> open(std::string_view sealed, std::string_view aad,
                                                  record_open_failure* why = nullptr) const;

private:
    const record_key* find(std::string_view id) const noexcept;
    std::vector<record_key> keys_;
    /// Names this key list in each thread's cache of initialised cipher contexts (a key
    /// schedule done once per key and thread, not per record).
    std::uint64_t cache_id_;
};

} // namespace onceproxy::core
