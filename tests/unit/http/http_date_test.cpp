#include "http/http_date.hpp"

#include <doctest/doctest.h>

#include <chrono>

using onceproxy::http::imf_fixdate;
using namespace std::chrono;

namespace {

/// The time at `y`-`m`-`d` `h`:`mi`:`s` UTC.
system_clock::time_point at(int y, unsigned m, unsigned d, int h = 0, int mi = 0, int s = 0) {
    return sys_days{year{y} / month{m} / day{d}} + hours{h} + minutes{mi} + seconds{s};
}

} // namespace

TEST_SUITE("http date") {

    TEST_CASE("known dates, as RFC 9110 §5.6.7 writes them") {
        CHECK(imf_fixdate(at(1994, 11, 6, 8, 49, 37)) == "Sun, 06 Nov 1994 08:49:37 GMT");
        CHECK(imf_fixdate(system_clock::time_point{}) == "Thu, 01 Jan 1970 00:00:00 GMT");
        CHECK(imf_fixdate(system_clock::time_point{seconds{1700000000}}) ==
              "Tue, 14 Nov 2023 22:13:20 GMT");
        CHECK(imf_fixdate(at(2038, 1, 19, 3, 14, 8)) == "Tue, 19 Jan 2038 03:14:08 GMT");
    }

    TEST_CASE("every weekday and month name") {
        const char* const days[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
        for (unsigned i = 0; i < 7; ++i) { // 2024-01-01 was a Monday
            CHECK(imf_fixdate(at(2024, 1, 1 + i)).substr(0, 3) == days[i]);
        }
        const char* const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        for (unsigned m = 1; m <= 12; ++m) {
            CHECK(imf_fixdate(at(2023, m, 15)).substr(8, 3) == months[m - 1]);
        }
    }

    TEST_CASE("leap years: 29 February, and the day after it") {
        CHECK(imf_fixdate(at(2024, 2, 29, 12)) == "Thu, 29 Feb 2024 12:00:00 GMT");
        CHECK(imf_fixdate(at(2024, 2, 29, 23, 59, 59) + seconds{1}) ==
              "Fri, 01 Mar 2024 00:00:00 GMT");
        CHECK(imf_fixdate(at(2000, 2, 29)) == "Tue, 29 Feb 2000 00:00:00 GMT");
        // 2100 is not a leap year: 28 February is followed by 1 March.
        CHECK(imf_fixdate(at(2100, 2, 28) + days{1}) == "Mon, 01 Mar 2100 00:00:00 GMT");
    }

    TEST_CASE("end of year rolls into the next") {
        CHECK(imf_fixdate(at(2023, 12, 31, 23, 59, 59)) == "Sun, 31 Dec 2023 23:59:59 GMT");
        CHECK(imf_fixdate(at(2023, 12, 31, 23, 59, 59) + seconds{1}) ==
              "Mon, 01 Jan 2024 00:00:00 GMT");
    }

    TEST_CASE("single-digit day, hour, minute and second are zero-padded") {
        CHECK(imf_fixdate(at(2025, 3, 5, 4, 3, 2)) == "Wed, 05 Mar 2025 04:03:02 GMT");
        CHECK(imf_fixdate(at(2025, 3, 5)).size() == 29); // IMF-fixdate has a fixed length
    }

    TEST_CASE("sub-second parts are dropped, never rounded up") {
        CHECK(imf_fixdate(at(2025, 3, 5, 4, 3, 2) + milliseconds{999}) ==
              "Wed, 05 Mar 2025 04:03:02 GMT");
        // Before 1970 the floor still goes back in time, not towards the epoch.
        CHECK(imf_fixdate(system_clock::time_point{} - milliseconds{1}) ==
              "Wed, 31 Dec 1969 23:59:59 GMT");
    }
}
