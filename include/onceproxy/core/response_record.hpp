#pragma once
// The recorded upstream response that replays are made of (SPEC §3.7), and its storage
// encoding (SPEC §5: "a versioned, binary-safe format"). The request fingerprint is not part
// of the record: the store keeps it beside the record.

#include "onceproxy/core/record_cipher.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onceproxy::core {

struct response_record {
    unsigned status = 0; ///< HTTP status code, 100..999
    /// End-to-end headers to replay, in order (hop-by-hop and excluded headers already
    /// removed by the caller). Names and values may hold any bytes.
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body; ///< exact body bytes; always empty when !replayable
    /// False when the response exceeded max_record_bytes: the key is consumed, retries get
    /// 409 idempotency.response_not_replayable.
    bool replayable = true;
    /// Trailer fields after the body (a gRPC call's grpc-status, grpc-message, ...), in order.
    std::vector<std::pair<std::string, std::string>> trailers = {};
};

/// A decoded record whose header names, values and body point into the encoding it was decoded
/// from (valid while that buffer lives and is unchanged): reading a record costs no copy.
struct response_record_view {
    unsigned status = 0;
    std::vector<std::pair<std::string_view, std::string_view>> headers;
    std::string_view body; ///< the tail of the encoding; empty when !replayable
    bool replayable = true;
    std::vector<std::pair<std::string_view, std::string_view>> trailers = {};
};

/// Format version written as the first byte of every encoding.
inline constexpr unsigned char record_format_version = 1;

/// Encodes a record: version byte, flags byte (bit 0 = replayable, bit 1 = trailers), status
/// (u16), header count (u32), each header as u32 length + name and u32 length + value, with
/// bit 1 the trailers the same way (count, then fields), then body length (u64) + body;
/// integers big-endian. A not-replayable record is encoded without its body. A record without
/// trailers leaves bit 1 clear: it is encoded exactly as before trailers existed.
/// Precondition: every header name and value is shorter than 4 GiB.
[[nodiscard]] std::string encode_record(const response_record& record);
/// The same encoding from views (no copy of the parts before they are encoded).
[[nodiscard]] std::string encode_record(const response_record_view& record);

/// Decodes what encode_record produced. Returns nullopt for anything else: unknown version
/// or flags, status outside 100..999, truncated input, trailing bytes, a body on a
/// not-replayable record. Never reads outside `data`; allocation is bounded by its size.
[[nodiscard]] std::optional<response_record> decode_record(std::string_view data);

/// What a sealed record is bound to besides its own bytes: where it is kept and the claim
/// fields the store keeps beside it. Altering any of them makes the record fail to open.
struct record_binding {
    std::string_view store_key{};   ///< the hashed key as stored
    std::string_view fingerprint{}; ///< the request fingerprint stored beside the record
    std::int64_t created_ms = 0;    ///< the claim's creation time stored beside it
};

/// The authenticated data of a record sealed now (marker sealed_record_marker): each field of
/// `bound`, the strings with a u32 length, created_ms as a u64, big-endian. A record sealed
/// with sealed_record_marker_v1 was bound to the store key alone and still opens so.
[[nodiscard]] std::string record_binding_aad(const record_binding& bound);

/// The record as the store keeps it: encode_record's bytes, sealed by `cipher` (bound to
/// `bound`) when encryption is on (`cipher` not null).
[[nodiscard]] std::string encode_stored_record(const response_record& record,
                                               const record_cipher* cipher,
                                               const record_binding& bound);
[[nodiscard]] std::string encode_stored_record(const response_record_view& record,
                                               const record_cipher* cipher,
                                               const record_binding& bound);

/// The encoded record (encode_record's bytes) of what the store keeps as `bound` says. With
/// `cipher`, only a record it sealed bound to the same values opens; a plaintext record, an
/// unknown key id or a failed authentication gives nullopt and the reason in `why`. Without
/// `cipher`, a plaintext record is returned as it is and a sealed one fails as unknown_key.
/// The bytes are not decoded: decode_record does that.
[[nodiscard]] std::optional<std::string> open_stored_record(std::string stored,
                                                            const record_cipher* cipher,
                                                            const record_binding& bound,
                                                            record_open_failure* why = nullptr);

/// open_stored_record then decode_record. nullopt when either fails; `why` is set only when
/// opening failed (a record that opens but does not decode leaves it untouched).
[[nodiscard]] std::optional<response_record>
decode_stored_record(std::string_view stored, const record_cipher* cipher,
                     const record_binding& bound, record_open_failure* why = nullptr);

/// decode_record without copies: the same checks, the result pointing into `data`.
[[nodiscard]] std::optional<response_record_view> decode_record_view(std::string_view data);

} // namespace onceproxy::core
