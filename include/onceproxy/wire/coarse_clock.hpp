#pragma once
// The monotonic clock read cheaply, for deadlines that need no precision (socket deadlines
// checked on the deadline watch's 50 ms tick, Redis command timeouts).
//
// CLOCK_MONOTONIC_COARSE is the kernel's timekeeping as of its last tick: a vDSO read with no
// hardware counter read, on the same timeline as CLOCK_MONOTONIC (libstdc++'s steady_clock).
// It trails the precise clock by less than two of its resolutions (a jiffy, 1-10 ms) while the
// kernel's tick runs on time: the time since the last tick, plus the part of a tick the kernel
// had not yet accumulated then (measured on Linux 6.x: 3 to 8 ms behind at HZ=250). Two
// resolutions are added back, so coarse_now() is never earlier than steady_clock::now() read
// just before it, and at most two jiffies later. A deadline set from it can therefore fire
// late by that much, never early, unless the kernel's own tick ran late (a starved virtual
// machine), by as long as it ran late.
//
// Precise reads stay for what measures: latency histograms and access-log durations. A body's
// pace (body_timeout, min_body_rate) is checked on the coarse clock too: its bounds are seconds.
//
// coarse_wall_now() is the same for the wall clock (CLOCK_REALTIME_COARSE), read as it is: never
// later than system_clock::now(), at most two resolutions earlier. It dates what is kept in
// milliseconds or seconds (a claim's creation, a record's Idempotency-Expires): a record's
// expiry computed from it is never later than from the precise clock, so it never promises more
// than the store keeps.

#include <chrono>

namespace onceproxy::wire {

/// An upper estimate of std::chrono::steady_clock::now(): not earlier, at most
/// coarse_margin() later. Out of line so profiles count its calls.
std::chrono::steady_clock::time_point coarse_now() noexcept;

/// What coarse_now() adds to the coarse clock: two of its resolutions (clock_getres, read
/// once).
std::chrono::steady_clock::duration coarse_margin() noexcept;

/// A lower estimate of std::chrono::system_clock::now(): not later, at most coarse_margin()
/// earlier.
std::chrono::system_clock::time_point coarse_wall_now() noexcept;

} // namespace onceproxy::wire
