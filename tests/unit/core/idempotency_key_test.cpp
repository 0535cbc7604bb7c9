#include <onceproxy/core/idempotency_key.hpp>

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace core = onceproxy::core;
using core::key_error;
using core::key_syntax;

namespace {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open ", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

core::key_parse_result parse(std::vector<std::string_view> lines,
                             key_syntax syntax = key_syntax::lenient, std::size_t max = 255) {
    return core::parse_idempotency_key(lines, syntax, max);
}

std::optional<key_error> error_of(std::string_view line, key_syntax syntax, std::size_t max = 255) {
    const auto r = parse({line}, syntax, max);
    CHECK(r.key.has_value() != r.error.has_value());
    return r.error;
}

/// Runs every case of an RFC 9651 string test file in strict mode; returns the case count.
std::size_t run_sf_string_vectors(const std::string& file, key_syntax syntax) {
    const auto doc = boost::json::parse(
        read_file(std::string(ONCEPROXY_TEST_DATA) + "/vectors/structured-field-tests/" + file));
    std::size_t count = 0;
    for (const auto& item : doc.as_array()) {
        const auto& c = item.as_object();
        const std::string name(c.at("name").as_string());
        std::vector<std::string> raw;
        for (const auto& r : c.at("raw").as_array()) {
            raw.emplace_back(r.as_string());
        }
        const std::vector<std::string_view> lines(raw.begin(), raw.end());
        if (syntax == key_syntax::lenient && (raw.size() != 1 || !raw[0].starts_with('"'))) {
            continue; // a bare value is a lenient key by design ('foo' is one)
        }
        const auto result = core::parse_idempotency_key(lines, syntax, 1024);
        const bool must_fail = c.contains("must_fail") && c.at("must_fail").as_bool();
        const bool can_fail = c.contains("can_fail") && c.at("can_fail").as_bool();
        ++count;
        if (must_fail) {
            CHECK_MESSAGE(!result.key, file, ": ", name, " must be rejected");
            continue;
        }
        const std::string expected(c.at("expected").as_array().at(0).as_string());
        if (expected.empty()) {
            // A valid sf-string, but an empty key is never valid (SPEC §3.2).
            CHECK_MESSAGE(result.error == key_error::empty, file, ": ", name);
        } else if (can_fail && !result.key) {
            // The vectors allow this (two lines joined into one string); onceproxy refuses
            // any repeated key header line.
            CHECK_MESSAGE(result.error == key_error::repeated, file, ": ", name);
        } else {
            REQUIRE_MESSAGE(result.key, file, ": ", name, " must be accepted");
            CHECK_MESSAGE(*result.key == expected, file, ": ", name);
        }
    }
    return count;
}

} // namespace

TEST_CASE("strict syntax accepts and rejects exactly as the RFC 9651 string vectors say") {
    CHECK(run_sf_string_vectors("string.json", key_syntax::strict) > 10);
    CHECK(run_sf_string_vectors("string-generated.json", key_syntax::strict) > 200);
}

TEST_CASE("lenient syntax agrees with the RFC 9651 string vectors on quoted values") {
    // A value starting with DQUOTE is parsed as an sf-string in both syntaxes; only cases
    // whose raw value does not start with DQUOTE may differ ("'foo'" is a valid bare key).
    CHECK(run_sf_string_vectors("string.json", key_syntax::lenient) > 5);
    CHECK(run_sf_string_vectors("string-generated.json", key_syntax::lenient) > 200);
}

TEST_CASE("strict syntax: only a single sf-string, nothing around it") {
    const auto s = key_syntax::strict;
    CHECK(parse({"\"abc\""}, s).key == "abc");
    CHECK(parse({"  \"abc\" "}, s).key == "abc");               // surrounding SP is not the key
    CHECK(parse({"\"a b\""}, s).key == "a b");                  // an sf-string may hold spaces
    CHECK(error_of("abc", s) == key_error::malformed);          // bare token
    CHECK(error_of("\"abc\";a=1", s) == key_error::malformed);  // parameters
    CHECK(error_of("\"a\", \"b\"", s) == key_error::malformed); // list
    CHECK(error_of("\"a\\nb\"", s) == key_error::malformed);    // unknown escape
    CHECK(error_of("\"\"", s) == key_error::empty);
    CHECK(error_of("", s) == key_error::empty);
}

TEST_CASE("lenient syntax: bare tokens and sf-strings are the same key") {
    const auto l = key_syntax::lenient;
    const std::string uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    CHECK(parse({uuid}, l).key == uuid);
    CHECK(parse({"\"" + uuid + "\""}, l).key == uuid);
    CHECK(parse({" " + uuid + "\t"}, l).key == uuid);
    CHECK(parse({"key_1:2/3;x=y"}, l).key == "key_1:2/3;x=y");
    CHECK(parse({"\"a b\""}, l).key == "a b");

    CHECK(error_of("a, b", l) == key_error::malformed); // a list, not a key
    CHECK(error_of("a,b", l) == key_error::malformed);
    CHECK(error_of("a b", l) == key_error::malformed); // whitespace inside a bare token
    CHECK(error_of("a\\b", l) == key_error::malformed);
    CHECK(error_of("a\"b", l) == key_error::malformed);
    CHECK(error_of("\"abc\";a=1", l) == key_error::malformed);
    CHECK(error_of("\"unterminated", l) == key_error::malformed);
    CHECK(error_of("ab\x01"
                   "c",
                   l) == key_error::malformed);                      // control character
    CHECK(error_of("ab\x7f", l) == key_error::malformed);            // DEL
    CHECK(error_of("f\xc3\xbc\xc3\xbc", l) == key_error::malformed); // non-ASCII
    CHECK(error_of("\"f\xc3\xbc\xc3\xbc\"", l) == key_error::malformed);
    CHECK(error_of("   ", l) == key_error::empty);
    CHECK(error_of("\"\"", l) == key_error::empty);
}

TEST_CASE("missing, repeated and too long keys") {
    for (const auto syntax : {key_syntax::lenient, key_syntax::strict}) {
        CHECK(parse({}, syntax).error == key_error::missing);
        CHECK(parse({"\"a\"", "\"a\""}, syntax).error == key_error::repeated);
        CHECK(parse({"\"a\"", "\"b\""}, syntax).error == key_error::repeated);
        CHECK(parse({"\"abcd\""}, syntax, 4).key == "abcd");
        CHECK(parse({"\"abcde\""}, syntax, 4).error == key_error::too_long);
        // The limit applies after unquoting: 4 characters, 6 on the wire.
        CHECK(parse({"\"a\\\"\\\\b\""}, syntax, 4).key == "a\"\\b");
    }
    CHECK(parse({"abcd"}, key_syntax::lenient, 4).key == "abcd");
    CHECK(parse({"abcde"}, key_syntax::lenient, 4).error == key_error::too_long);
    const std::string max(255, 'k');
    CHECK(parse({max}).key == max);
    CHECK(parse({max + "k"}).error == key_error::too_long);
}

TEST_CASE("natural key from a JSON Pointer") {
    const std::string body =
        R"({"id":"evt_123","n":42,"big":18446744073709551615,"neg":-7,"f":1.5,"t":true,)"
        R"("data":{"object":{"id":"ch_9"}},"a/b":"slash","m~n":"tilde","arr":["x","y"],)"
        R"("nil":null,"obj":{}})";
    CHECK(core::extract_json_pointer(body, "/id") == "evt_123");
    CHECK(core::extract_json_pointer(body, "/data/object/id") == "ch_9");
    CHECK(core::extract_json_pointer(body, "/n") == "42");
    CHECK(core::extract_json_pointer(body, "/neg") == "-7");
    CHECK(core::extract_json_pointer(body, "/big") == "18446744073709551615");
    CHECK(core::extract_json_pointer(body, "/a~1b") == "slash");
    CHECK(core::extract_json_pointer(body, "/m~0n") == "tilde");
    CHECK(core::extract_json_pointer(body, "/arr/1") == "y");

    CHECK_FALSE(core::extract_json_pointer(body, "/f")); // not an integer
    CHECK_FALSE(core::extract_json_pointer(body, "/t"));
    CHECK_FALSE(core::extract_json_pointer(body, "/nil"));
    CHECK_FALSE(core::extract_json_pointer(body, "/obj"));
    CHECK_FALSE(core::extract_json_pointer(body, "/missing"));
    CHECK_FALSE(core::extract_json_pointer(body, "/arr/7"));
    CHECK_FALSE(core::extract_json_pointer(body, "id"));            // not a pointer
    CHECK_FALSE(core::extract_json_pointer(body, "/m~2n"));         // bad escape
    CHECK_FALSE(core::extract_json_pointer(R"({"id":"x")", "/id")); // invalid JSON
    CHECK_FALSE(core::extract_json_pointer("", "/id"));
    // Ambiguous documents: which id would the upstream read?
    CHECK_FALSE(core::extract_json_pointer(R"({"id":"a","id":"b"})", "/id"));
    CHECK_FALSE(core::extract_json_pointer(R"({"id":"a","x":{"k":1,"k":2}})", "/id"));
    CHECK(core::extract_json_pointer(R"({"":"empty name"})", "/") == "empty name");
    CHECK(core::extract_json_pointer(R"("top")", "") == "top"); // "" is the whole document
}
