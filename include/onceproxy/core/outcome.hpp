#pragma once
// The one final outcome every request records (SPEC §6): the exchange engine decides it for
// guarded requests, the proxy for plain and refused ones. Metrics and the access log key on this
// enum; its names are the `outcome` label values.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace onceproxy::core {

enum class outcome : std::uint8_t {
    stored,          ///< executed once, response recorded
    replayed,        ///< answered from a record
    in_progress,     ///< duplicate of an attempt still in flight (409, or waiting gave up)
    mismatch,        ///< same key, different fingerprint
    missing_key,     ///< required key absent (400)
    invalid_key,     ///< key malformed, too long, empty or repeated (400)
    released,        ///< executed or failed, key freed for a retry (not recordable, connect
                     ///< failure, uncertain outcome with `release`)
    held,            ///< uncertain outcome, lease kept until it lapses (`hold`)
    outcome_unknown, ///< uncertain outcome recorded as the 502 problem (`fail`)
    not_replayable,  ///< response too large to record, or such a record was found (409)
    lease_lost,      ///< the lease was taken over: the answer could not be recorded
    record_failed,   ///< the store refused every completion until the lease ended
    store_error,     ///< the store failed at claim or release (503, or fail-open passthrough)
    passthrough,     ///< not guarded, or optional route without a key: plain proxying
    rejected,        ///< refused before the exchange (malformed, too large, no route, Expect)
};

/// Number of outcome values (the last one is `rejected`).
inline constexpr std::size_t outcome_count = static_cast<std::size_t>(outcome::rejected) + 1;

/// The label value: "stored", "replayed", ... ("?" for a value outside the enum).
std::string_view to_string(outcome o) noexcept;

/// On a route in `mode: observe`, what enforcement (`mode: required`) would have done with a
/// request that observe mode sent to the upstream instead. Its names are the `would` label
/// values of onceproxy_observed_total.
enum class observation : std::uint8_t {
    replay,         ///< a completed record with the same fingerprint: would have replayed it
    conflict,       ///< the same key still in flight: would have answered 409 in_progress
    mismatch,       ///< a lease or record with another fingerprint: would have answered 422/409
    missing_key,    ///< no key: would have answered 400 missing_key
    invalid_key,    ///< a malformed key: would have answered 400 invalid_key
    not_replayable, ///< a record kept without its body: would have answered 409
};

/// Number of observation values (the last one is `not_replayable`).
inline constexpr std::size_t observation_count =
    static_cast<std::size_t>(observation::not_replayable) + 1;

/// The label value: "replay", "conflict", ... ("?" for a value outside the enum).
std::string_view to_string(observation o) noexcept;

/// What became of a guarded request whose upstream did not answer within its `timeout` and
/// whose answer was read on, up to `late_answer_timeout` (issue 26): the client got its 504
/// meanwhile. Its names are the `outcome` label values of onceproxy_late_answers_total.
enum class late_answer : std::uint8_t {
    recorded,   ///< the late answer was recorded: retries replay it
    released,   ///< the late answer was not recordable (release list), or nothing was sent
    unrecorded, ///< the late answer came but could not be recorded (lease lost, store error)
    unanswered, ///< no answer by late_answer_timeout: on_upstream_uncertain applied
};

/// Number of late_answer values (the last one is `unanswered`).
inline constexpr std::size_t late_answer_count =
    static_cast<std::size_t>(late_answer::unanswered) + 1;

/// The label value: "recorded", "released", ... ("?" for a value outside the enum).
std::string_view to_string(late_answer a) noexcept;

} // namespace onceproxy::core
