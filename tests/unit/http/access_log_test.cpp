#include "http/access_log.hpp"

#include <doctest/doctest.h>

#include <string>

using onceproxy::http::escape_invalid_utf8;

TEST_SUITE("access_log") {

    TEST_CASE("escape_invalid_utf8 keeps ASCII and well-formed multi-byte UTF-8 as it is") {
        CHECK(escape_invalid_utf8("") == "");
        CHECK(escape_invalid_utf8("/v1/payments?x=1") == "/v1/payments?x=1");
        // 2, 3 and 4 bytes, and the boundaries of Table 3-7: U+0080, U+07FF, U+0800, U+D7FF,
        // U+E000, U+FFFF, U+10000, U+10FFFF.
        const std::string valid = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\x80\xdf\xbf"
                                  "\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf"
                                  "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
        CHECK(escape_invalid_utf8(valid) == valid);
    }

    TEST_CASE("escape_invalid_utf8 escapes each byte of an ill-formed sequence as \\xNN") {
        SUBCASE("bytes that never occur in UTF-8") {
            CHECK(escape_invalid_utf8("a\xff"
                                      "b") == "a\\xffb");
            CHECK(escape_invalid_utf8("\xc0\xc1\xf5\xfe") == "\\xc0\\xc1\\xf5\\xfe");
        }
        SUBCASE("a stray continuation byte") {
            CHECK(escape_invalid_utf8("\x80x\xbf") == "\\x80x\\xbf");
        }
        SUBCASE("a lead byte not followed by a continuation: the next byte is kept") {
            CHECK(escape_invalid_utf8("\xc3\x28") == "\\xc3(");
            CHECK(escape_invalid_utf8("\xc3\xc3\xa9") == "\\xc3\xc3\xa9");
        }
        SUBCASE("truncated sequences, also at the end of the input") {
            CHECK(escape_invalid_utf8("\xe2\x82") == "\\xe2\\x82");
            CHECK(escape_invalid_utf8("\xf0\x9f\x98") == "\\xf0\\x9f\\x98");
            CHECK(escape_invalid_utf8("\xe2\x82-") == "\\xe2\\x82-");
        }
        SUBCASE("overlong forms") {
            CHECK(escape_invalid_utf8("\xc0\xaf") == "\\xc0\\xaf");          // '/' in 2 bytes
            CHECK(escape_invalid_utf8("\xe0\x80\xaf") == "\\xe0\\x80\\xaf"); // '/' in 3 bytes
            CHECK(escape_invalid_utf8("\xf0\x8f\xbf\xbf") == "\\xf0\\x8f\\xbf\\xbf");
        }
        SUBCASE("UTF-16 surrogates and code points above U+10FFFF") {
            CHECK(escape_invalid_utf8("\xed\xa0\x80") == "\\xed\\xa0\\x80"); // U+D800
            CHECK(escape_invalid_utf8("\xed\xbf\xbf") == "\\xed\\xbf\\xbf"); // U+DFFF
            CHECK(escape_invalid_utf8("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");
        }
    }
}
