#pragma once
// What an egress route decides between two attempts (docs/egress.md), as pure functions: which
// failures are retried, how long to wait (exponential backoff with full jitter, Retry-After),
// and which requests may be sent twice at all. No I/O, no clock: times are inputs.

#include "onceproxy/config/config.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace onceproxy::egress {

/// How one attempt ended; the `result` label of onceproxy_egress_attempts_total.
enum class attempt_result : std::uint8_t {
    answered,         ///< an answer the route does not retry (passed on)
    retryable_status, ///< an answer whose status is in retry.on
    connect_failure,  ///< no connection (or no free slot): nothing was sent
    reset,            ///< sent, and the connection failed before any answer byte
    timeout,          ///< sent, no answer within the upstream's timeout
    other,            ///< an unusable answer (malformed, too large), a failed TLS handshake
};
inline constexpr std::size_t attempt_result_count = 6;

/// Why a failed attempt was not retried; the `reason` label of
/// onceproxy_egress_retries_denied_total.
enum class denial : std::uint8_t {
    attempts,    ///< retry.attempts sends were made
    deadline,    ///< the wait would end past retry.deadline
    budget,      ///< the upstream's retry budget is spent
    breaker,     ///< the upstream's circuit breaker is open
    retry_after, ///< the upstream asked for a wait longer than retry.max_retry_after
    unsafe,      ///< a non-idempotent request without an idempotency key
    body,        ///< the request body is larger than retry.max_body_bytes (not kept)
};
inline constexpr std::size_t denial_count = 7;

/// True for the methods RFC 9110 §9.2.2 calls idempotent: a retry without a key is safe.
bool idempotent_method(std::string_view method) noexcept;

/// Whether `r` is retried on `retry` (an `answered` or `other` attempt never is).
bool retried_on(const config::retry_config& retry, attempt_result r) noexcept;

/// Whether an answer with `status` is retried on `retry`.
inline bool retried_status(const config::retry_config& retry, unsigned status) noexcept {
    return status < retry.statuses.size() && retry.statuses.test(status);
}

/// The ceiling of the wait before retry number `retry` (1 for the first retry):
/// min(max_delay, base_delay * 2^(retry-1)).
std::chrono::milliseconds backoff_ceiling(const config::retry_config& retry,
                                          unsigned retry_number) noexcept;

/// Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"): `u` in [0, 1) picks
/// the wait uniformly in [0, ceiling].
std::chrono::milliseconds full_jitter(std::chrono::milliseconds ceiling, double u) noexcept;

/// A Retry-After value (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date turned into a wait
/// from `now` (a date in the past is no wait). nullopt when it does not parse.
std::optional<std::chrono::milliseconds>
parse_retry_after(std::string_view value, std::chrono::system_clock::time_point now);

/// The wait before the next attempt: the jittered backoff, or the upstream's Retry-After when
/// longer. nullopt when Retry-After is above retry.max_retry_after (denial::retry_after).
std::optional<std::chrono::milliseconds>
next_wait(const config::retry_config& retry, std::chrono::milliseconds jittered,
          std::optional<std::chrono::milliseconds> retry_after) noexcept;

} // namespace onceproxy::egress
