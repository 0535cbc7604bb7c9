#include "onceproxy/http/problem.hpp"

#include <doctest/doctest.h>

#include <boost/beast/http/field.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <string>

using namespace onceproxy::http;
namespace bhttp = boost::beast::http;

// The codes and statuses themselves are checked against SPEC §3.2 once, on core's table
// (tests/unit/core/problem_test.cpp); here every row is rendered.

TEST_SUITE("problem") {

    TEST_CASE("make_problem builds an RFC 9457 problem+json response") {
        for (const auto& row : onceproxy::core::problem_table) {
            CAPTURE(row.name);
            const auto res = make_problem(row.code, "some detail");
            CHECK(res.result_int() == row.status);
            CHECK(res.version() == 11);
            CHECK(res[bhttp::field::content_type] == "application/problem+json");
            CHECK(res[bhttp::field::cache_control] == "no-store");
            CHECK_FALSE(res.count(bhttp::field::retry_after));
            CHECK(res[bhttp::field::content_length] == std::to_string(res.body().size()));
            const auto v = boost::json::parse(res.body());
            REQUIRE(v.is_object());
            const auto& o = v.as_object();
            CHECK(o.size() == 5);
            CHECK(o.at("code").as_string() == row.name);
            CHECK(o.at("status").to_number<unsigned>() == row.status);
            CHECK(o.at("detail").as_string() == "some detail");
            CHECK(o.at("type").as_string() ==
                  "https://onceproxy.dev/problems/" + std::string(row.name));
            CHECK_FALSE(o.at("title").as_string().empty());
        }
    }

    TEST_CASE("make_problem: status override, Retry-After, HTTP version, escaping") {
        SUBCASE("payload mismatch configured as 409") {
            const auto res = make_problem(problem_code::payload_mismatch, "d", {.status = 409});
            CHECK(res.result_int() == 409);
            const auto v = boost::json::parse(res.body());
            CHECK(v.at("status").to_number<unsigned>() == 409);
            CHECK(v.at("code").as_string() == "idempotency.payload_mismatch");
        }
        SUBCASE("Retry-After in whole seconds") {
            const auto res = make_problem(problem_code::in_progress, "busy", {.retry_after_s = 3});
            CHECK(res.result_int() == 409);
            CHECK(res[bhttp::field::retry_after] == "3");
        }
        SUBCASE("HTTP/1.0 client") {
            const auto res = make_problem(problem_code::bad_request, "old", {.http_version = 10});
            CHECK(res.version() == 10);
        }
        SUBCASE("a detail with quotes, backslashes and control characters stays valid JSON") {
            const std::string detail = "bad \"value\" \\ here\n\t\x01 end";
            const auto res = make_problem(problem_code::bad_request, detail);
            const auto v = boost::json::parse(res.body());
            CHECK(v.at("detail").as_string() == detail);
        }
    }

} // TEST_SUITE
