#include "http/http_date.hpp"

#include <array>

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
    // Written digit by digit: snprintf costs about ten times as much, once per recorded answer.
    const auto two = [](std::string& out, unsigned v) {
        out += static_cast<char>('0' + v / 10 % 10);
        out += static_cast<char>('0' + v % 10);
    };
    std::string out;
    out.reserve(29);
    out += day_names[wd.c_encoding()];
    out += ", ";
    two(out, static_cast<unsigned>(ymd.day()));
    out += ' ';
    out += month_names[static_cast<unsigned>(ymd.month()) - 1];
    out += ' ';
    const auto year = static_cast<unsigned>(static_cast<int>(ymd.year()));
    two(out, year / 100);
    two(out, year % 100);
    out += ' ';
    two(out, static_cast<unsigned>(hms.hours().count()));
    out += ':';
    two(out, static_cast<unsigned>(hms.minutes().count()));
    out += ':';
    two(out, static_cast<unsigned>(hms.seconds().count()));
    out += " GMT";
    return out;
}

} // namespace onceproxy::http
