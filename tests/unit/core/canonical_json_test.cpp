#include <onceproxy/core/canonical_json.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace core = onceproxy::core;
using core::canonicalize_json;
using core::number_form;

namespace {

std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open ", path.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

/// Canonical form of a single number literal.
std::string number(std::string_view literal, number_form form = number_form::rfc8785) {
    const auto out = canonicalize_json(literal, form);
    REQUIRE_MESSAGE(out, literal);
    return *out;
}

} // namespace

TEST_CASE("every RFC 8785 vector canonicalises to exactly its expected bytes") {
    const std::filesystem::path dir =
        std::filesystem::path(ONCEPROXY_TEST_DATA) / "vectors" / "json-canonicalization";
    std::size_t count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir / "input")) {
        const auto name = entry.path().filename();
        const auto out = canonicalize_json(read_file(entry.path()));
        REQUIRE_MESSAGE(out, name.string(), " must be valid JSON");
        CHECK_MESSAGE(*out == read_file(dir / "output" / name), name.string());
        ++count;
    }
    CHECK(count == 6);
}

TEST_CASE("ECMAScript number formatting") {
    CHECK(number("1.0") == "1");
    CHECK(number("1") == "1");
    CHECK(number("1e2") == "100");
    CHECK(number("-0") == "0");
    CHECK(number("-0.0e-5") == "0");
    CHECK(number("4.50") == "4.5");
    CHECK(number("2e-3") == "0.002");
    CHECK(number("0.000001") == "0.000001");
    CHECK(number("0.0000001") == "1e-7");
    CHECK(number("1.5e-7") == "1.5e-7");
    CHECK(number("1e20") == "100000000000000000000");
    CHECK(number("1e21") == "1e+21");
    CHECK(number("1.25e21") == "1.25e+21");
    CHECK(number("-1E30") == "-1e+30");
    CHECK(number("123456789012") == "123456789012");
    CHECK(number("0.1") == "0.1");
    CHECK(number("-12.5") == "-12.5");
    CHECK(number("5e-324") == "5e-324");
    CHECK(number("1.7976931348623157e308") == "1.7976931348623157e+308");
    CHECK(number("9007199254740992") == "9007199254740992");
    CHECK(number("-9007199254740992") == "-9007199254740992");
    CHECK(number("9007199254740994") == "9007199254740994");
    CHECK(number("[1.0,2.50,-0]") == "[1,2.5,0]");
}

TEST_CASE("distinct number literals never share a canonical form (SPEC 3.5)") {
    for (const auto form : {number_form::rfc8785, number_form::distinct}) {
        // Integers beyond 2^53 that a double would merge.
        CHECK(number("9007199254740993", form) == "9007199254740993");
        CHECK(number("9007199254740993", form) != number("9007199254740992", form));
        CHECK(number("-9007199254740993", form) == "-9007199254740993");
        CHECK(number("18446744073709551617", form) == "18446744073709551617");
        // 2^60 is exact as a double, but its ECMAScript form is 1152921504606847000.
        CHECK(number("1152921504606846976", form) == "1152921504606846976");
        CHECK(number("1152921504606847000", form) == "1152921504606847000");
        // More than 17 significant digits.
        CHECK(number("0.100000000000000000001", form) == "0.100000000000000000001");
        CHECK(number("0.100000000000000000001", form) != number("0.1", form));
        // Beyond the double range.
        CHECK(number("1e400", form) == "1e400");
        CHECK(number("-1e400", form) == "-1e400");
        CHECK(number("1e-400", form) == "1e-400");
        CHECK(number("1e-400", form) != number("0", form));
        // Trailing zeros are not significant digits: still the canonical form.
        CHECK(number("1.000000000000000000000", form) == "1");
    }
    // 17 significant digits: RFC 8785 merges (its own test vector requires it) ...
    CHECK(number("333333333.33333329") == "333333333.3333333");
    CHECK(number("0.30000000000000001") == "0.3");
    // ... the distinct form does not.
    CHECK(number("333333333.33333329", number_form::distinct) == "333333333.33333329");
    CHECK(number("333333333.3333333", number_form::distinct) == "333333333.3333333");
    CHECK(number("0.30000000000000001", number_form::distinct) == "0.30000000000000001");
    CHECK(number("0.3", number_form::distinct) == "0.3");
    CHECK(number("0.30", number_form::distinct) == "0.3");
    CHECK(number("4.50", number_form::distinct) == "4.5");
    CHECK(number("1E30", number_form::distinct) == "1e+30");
    CHECK(number("2e-3", number_form::distinct) == "0.002");
}

TEST_CASE("structure: sorting, whitespace and strings") {
    CHECK(canonicalize_json(" { \"b\" : [ 1 , { } ] , \"a\" : null } ") ==
          R"({"a":null,"b":[1,{}]})");
    CHECK(canonicalize_json(R"({"b":1,"a":{"d":2,"c":3}})") == R"({"a":{"c":3,"d":2},"b":1})");
    CHECK(canonicalize_json("\"\\u0041\\/\\u001F\\u007f\"") == "\"A/\\u001f\x7f\"");
    CHECK(canonicalize_json("\"\\b\\f\\n\\r\\t\"") == "\"\\b\\f\\n\\r\\t\"");
    CHECK(canonicalize_json("true") == "true");
    CHECK(canonicalize_json("[]") == "[]");
    // UTF-16 order: U+FB33 (0xFB33) sorts after U+1F602 (0xD83D 0xDE02), unlike code points.
    CHECK(canonicalize_json("{\"\\ufb33\":1,\"\\ud83d\\ude02\":2}") ==
          "{\"\xf0\x9f\x98\x82\":2,\"\xef\xac\xb3\":1}");
    // A long string and deep-ish nesting still work.
    const std::string big(100000, 'x');
    CHECK(canonicalize_json("[\"" + big + "\"]") == "[\"" + big + "\"]");
    const std::string deep = std::string(100, '[') + std::string(100, ']');
    CHECK(canonicalize_json(deep) == deep);
}

TEST_CASE("invalid JSON gives nullopt") {
    for (const std::string_view bad : {"",
                                       " ",
                                       "{",
                                       "[1,]",
                                       "{\"a\":1,}",
                                       "{\"a\" 1}",
                                       "01",
                                       "1.",
                                       ".5",
                                       "+1",
                                       "NaN",
                                       "Infinity",
                                       "'a'",
                                       "[1] [2]",
                                       "{\"a\":1}x",
                                       "\"\x01\"",
                                       "\"\xff\"",
                                       "\"\xc3\"",
                                       "tru",
                                       "/* c */ 1",
                                       "{\"a\":1,\"a\":2}",
                                       "{\"a\":{\"b\":1,\"b\":1}}"}) {
        CHECK_MESSAGE(!canonicalize_json(bad), "input: ", bad);
    }
    // Nesting beyond the limit is refused (then hashed raw by the fingerprint).
    const std::string too_deep = std::string(200, '[') + std::string(200, ']');
    CHECK_FALSE(canonicalize_json(too_deep));
}

TEST_CASE("canonical form is a fixed point, also for mutated inputs") {
    const std::filesystem::path dir =
        std::filesystem::path(ONCEPROXY_TEST_DATA) / "vectors" / "json-canonicalization" / "input";
    std::vector<std::string> seeds{R"([9007199254740993,1e400,0.30000000000000001,-0.0,1E21])"};
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        seeds.push_back(read_file(entry.path()));
    }
    // Deterministic byte mutations (a small linear congruential generator).
    std::uint32_t state = 12345;
    const auto next = [&state] {
        state = state * 1103515245U + 12345U;
        return state >> 8;
    };
    std::size_t valid = 0;
    std::size_t checked = 0;
    for (const auto& seed : seeds) {
        for (int round = 0; round < 400; ++round) {
            std::string input = seed;
            if (round > 0) {
                const char alphabet[] = "{}[],:\"\\0123456789.eE+-tfn \x80\xff";
                input[next() % input.size()] = alphabet[next() % (sizeof alphabet - 1)];
            }
            for (const auto form : {number_form::rfc8785, number_form::distinct}) {
                const auto once = canonicalize_json(input, form);
                ++checked;
                if (!once) {
                    continue;
                }
                ++valid;
                CHECK_MESSAGE(canonicalize_json(*once, form) == once, "input: ", input);
            }
        }
    }
    CHECK(checked == seeds.size() * 400 * 2);
    CHECK(valid > seeds.size() * 2); // at least the unmutated seeds
}
