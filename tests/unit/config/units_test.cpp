#include "onceproxy/config/load.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <string>

namespace cfg = onceproxy::config;
using namespace std::chrono_literals;

TEST_CASE("parse_duration accepts an integer and a unit") {
    CHECK(cfg::parse_duration("500ms") == cfg::duration{500});
    CHECK(cfg::parse_duration("0ms") == cfg::duration{0});
    CHECK(cfg::parse_duration("30s") == 30s);
    CHECK(cfg::parse_duration("5m") == 5min);
    CHECK(cfg::parse_duration("24h") == 24h);
    CHECK(cfg::parse_duration("7d") == 7 * 24h);
    // The largest day count that still fits in int64 milliseconds.
    const auto max_days = std::numeric_limits<cfg::duration::rep>::max() / 86'400'000;
    CHECK(cfg::parse_duration(std::to_string(max_days) + "d").has_value());
}

TEST_CASE("parse_duration rejects missing units, garbage and overflow") {
    for (const char* bad :
         {"", "30", "s", "1.5s", "-1s", "+1s", " 1s", "1s ", "1 s", "1S", "1sec", "1us", "1ms1",
          "10x", "99999999999999999999ms", "106751991167301d", "9223372036854775808ms"}) {
        CAPTURE(bad);
        CHECK_FALSE(cfg::parse_duration(bad).has_value());
    }
}

TEST_CASE("parse_size accepts bytes, IEC and SI units") {
    CHECK(cfg::parse_size("512") == 512U);
    CHECK(cfg::parse_size("512B") == 512U);
    CHECK(cfg::parse_size("64KiB") == 64U * 1024);
    CHECK(cfg::parse_size("1MiB") == 1024U * 1024);
    CHECK(cfg::parse_size("1GiB") == 1024U * 1024 * 1024);
    CHECK(cfg::parse_size("1KB") == 1000U);
    CHECK(cfg::parse_size("1MB") == 1'000'000U);
    CHECK(cfg::parse_size("1GB") == 1'000'000'000U);
    CHECK(cfg::parse_size("0") == 0U);
}

TEST_CASE("parse_size rejects garbage and overflow") {
    for (const char* bad : {"", "KiB", "1.5MiB", "-1", "1 MiB", "1kib", "1Ki", "1M", "1MB2", "0x10",
                            "18446744073709551616", "17179869184GiB", "20000000000GB"}) {
        CAPTURE(bad);
        CHECK_FALSE(cfg::parse_size(bad).has_value());
    }
}
