#include "http/http_date.hpp"

#include <array>
#include <cstdio>

namespace onceproxy::http {

std::string imf_fixdate(std::chrono::system_clock::time_point t) {
    using namespace std::chrono;
    static constexpr std::array<const char*, 7> day_names{"Sun", "Mon", "Tue", "Wed",
                                                          "Thu", "Fri", "Sat"};
    static constexpr std::array<const char*, 12> month_names{
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    // floor, not duration_cast: a time before 1970 must not round towards the epoch into the
    // next day.
    const auto secs = floor<seconds>(t);
    const auto day = floor<days>(secs);
    const year_month_day ymd{day};
    const hh_mm_ss hms{secs - day};
    const weekday wd{day};
    char buf[40];
    const int n = std::snprintf(
        buf, sizeof buf, "%s, %02u %s %04d %02ld:%02ld:%02lld GMT", day_names[wd.c_encoding()],
        static_cast<unsigned>(ymd.day()), month_names[static_cast<unsigned>(ymd.month()) - 1],
        static_cast<int>(ymd.year()), static_cast<long>(hms.hours().count()),
        static_cast<long>(hms.minutes().count()), static_cast<long long>(hms.seconds().count()));
    return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

} // namespace onceproxy::http
