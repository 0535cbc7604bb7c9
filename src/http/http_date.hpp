#pragma once
// HTTP dates (RFC 9110 §5.6.7): the one format a sender may generate, IMF-fixdate. Pure: the
// caller passes the time, so tests pin any date.

#include <chrono>
#include <string>

namespace onceproxy::http {

/// `t` as an IMF-fixdate, e.g. "Sun, 06 Nov 1994 08:49:37 GMT" (UTC, whole seconds, sub-second
/// part dropped; years 0 to 9999, as the format has four digits). English day and month names
/// whatever the process locale is: the format is fixed by RFC 9110, not a display for people.
[[nodiscard]] std::string imf_fixdate(std::chrono::system_clock::time_point t);

} // namespace onceproxy::http
