#include "onceproxy/log/log.hpp"

#include "support/log_capture.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

namespace log = onceproxy::log;

namespace {

const auto t0 = std::chrono::system_clock::time_point(std::chrono::milliseconds(1'700'000'000'123));

std::string json(std::string_view s) {
    std::string out;
    log::append_json_string(out, s);
    return out;
}

template <class Body>
std::string captured(Body body) {
    return onceproxy::test::captured_log(body);
}

} // namespace

TEST_SUITE("log") {

    TEST_CASE("a line is ts, level, component, msg, then the fields in order") {
        CHECK(log::format_line(t0, log::level::info, "app", "listening",
                               {{"host", "127.0.0.1"}, {"port", 8080}, {"workers", 2U}}) ==
              R"({"ts":1700000000123,"level":"info","component":"app","msg":"listening",)"
              R"("host":"127.0.0.1","port":8080,"workers":2})"
              "\n");
        CHECK(log::format_line(t0, log::level::warn, "store", "lost") ==
              R"({"ts":1700000000123,"level":"warn","component":"store","msg":"lost"})"
              "\n");
    }

    TEST_CASE("field values: signed, unsigned, double, bool, and no NaN in JSON") {
        const auto line = log::format_line(t0, log::level::error, "c", "m",
                                           {{"neg", -3},
                                            {"big", std::uint64_t{18446744073709551615ULL}},
                                            {"ms", 1.5},
                                            {"ok", true},
                                            {"nan", std::numeric_limits<double>::quiet_NaN()}});
        CHECK(line.find(R"("neg":-3,"big":18446744073709551615,"ms":1.5,"ok":true,"nan":null})") !=
              std::string::npos);
    }

    TEST_CASE("strings are JSON-escaped: quotes, backslashes, control characters") {
        CHECK(json("plain") == R"("plain")");
        CHECK(json("say \"hi\"") == R"("say \"hi\"")");
        CHECK(json(R"(C:\dir)") == R"("C:\\dir")");
        CHECK(json("a\nb\rc\td") == R"("a\nb\rc\td")");
        CHECK(json(std::string_view("\x01\x1f\x7f", 3)) == R"("\u0001\u001f\u007f")");
        CHECK(json(std::string_view("nul\0x", 5)) == R"("nul\u0000x")");
        // Keys and the component are escaped the same way.
        CHECK(log::format_line(t0, log::level::debug, "a\"b", "m", {{"k\n", "v"}})
                  .find(R"("component":"a\"b","msg":"m","k\n":"v")") != std::string::npos);
    }

    TEST_CASE("well-formed UTF-8 is kept; each byte of an ill-formed sequence becomes \\xNN") {
        CHECK(json("caf\xc3\xa9 \xf0\x9f\x98\x80") == "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
        // The escape is text: its backslash is itself escaped in the JSON string.
        CHECK(json("a\xff"
                   "b") == R"("a\\xffb")");
        CHECK(json("\xed\xa0\x80") == R"("\\xed\\xa0\\x80")"); // a UTF-16 surrogate
        CHECK(log::escape_invalid_utf8("\xc3\x28") == "\\xc3(");
    }

    TEST_CASE("lines below the minimum level are dropped; one write per line") {
        const auto before = log::min_level();
        log::set_min_level(log::level::warn);
        CHECK_FALSE(log::enabled(log::level::info));
        CHECK(log::enabled(log::level::error));
        const auto out = captured([] {
            log::info("app", "dropped");
            log::warn("store", "kept", {{"attempt", 2}});
            log::error("app", "also kept");
        });
        log::set_min_level(before);
        CHECK(out.find("dropped") == std::string::npos);
        CHECK(out.find(R"("level":"warn","component":"store","msg":"kept","attempt":2})"
                       "\n") != std::string::npos);
        CHECK(out.find(R"("level":"error","component":"app","msg":"also kept"})"
                       "\n") != std::string::npos);
        CHECK(std::count(out.begin(), out.end(), '\n') == 2);
    }

    TEST_CASE("level names") {
        CHECK(log::to_string(log::level::debug) == "debug");
        CHECK(log::to_string(log::level::info) == "info");
        CHECK(log::to_string(log::level::warn) == "warn");
        CHECK(log::to_string(log::level::error) == "error");
    }
}
