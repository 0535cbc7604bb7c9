#pragma once
// The value of one idempotency record in Redis: one string under the record's key, so that a
// claim is one native command (SET key value NX PX lease GET) rather than a script.
//
//   2 <state> <owner length>:<owner> <fingerprint length>:<fingerprint> <created ms>; <payload>
//
// (without the spaces). `2` is the layout's version (version 1 was a hash with the fields v, st,
// ow, fp, ct, pl; redis_store still reads it). <state> is `f` while a lease is held (the value
// then ends at `;`) and `c` once the answer is recorded (<payload> follows: the bytes given to
// complete()). Owner and fingerprint are binary-safe (length-prefixed); <created ms> is the
// claiming proxy's clock, in milliseconds since the Unix epoch. The scripts in redis_store.cpp
// match a lease by the prefix `2f<owner length>:<owner>`, so the order of the fields is part of
// the layout.
//
// Pure functions, no I/O.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::store::redis_record {

inline constexpr char version = '2';
inline constexpr char in_flight = 'f';
inline constexpr char completed = 'c';

/// The value a claim writes: state `f`, no payload.
std::string claim_value(std::string_view owner, std::string_view fingerprint,
                        std::int64_t created_ms);

/// The start of every lease `owner` writes: `2f<owner length>:<owner>`.
std::string lease_prefix(std::string_view owner);

/// The value complete() writes over `lease` (a claim value, or a lease_prefix): state `c`, the
/// rest of `lease` unchanged, then `payload`.
std::string completed_value(std::string_view lease, std::string_view payload);

struct view {
    char state = in_flight;
    std::string_view owner;
    std::string_view fingerprint;
    std::int64_t created_ms = 0;
    /// Where the payload starts in the parsed value (its size for a lease).
    std::size_t payload_offset = 0;
};

/// Parses a value of this layout; nullopt when it is not one (another version, truncated,
/// a lease with a payload).
std::optional<view> parse(std::string_view value) noexcept;

/// A claim of this layout is `SET ... NX ... GET`, which Redis accepts from version 7.0.
inline constexpr int minimum_redis_major = 7;

/// The `redis_version` of an `INFO server` reply ("redis_version:7.0.15" -> "7.0.15"); empty
/// when it has none.
std::string_view redis_version(std::string_view info) noexcept;

/// The major number of a version ("7.0.15" -> 7); nullopt when it does not start with one.
std::optional<int> major_version(std::string_view text) noexcept;

} // namespace onceproxy::store::redis_record
