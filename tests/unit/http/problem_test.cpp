#include "onceproxy/http/problem.hpp"

#include <doctest/doctest.h>

#include <boost/beast/http/field.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <set>
#include <string>

using namespace onceproxy::http;
namespace bhttp = boost::beast::http;

namespace {

struct expected_row {
    problem_code code;
    const char* name;
    unsigned status;
};

// SPEC §3.2: the codes and statuses clients depend on.
constexpr expected_row table[] = {
    {problem_code::missing_key, "idempotency.missing_key", 400},
    {problem_code::invalid_key, "idempotency.invalid_key", 400},
    {problem_code::payload_mismatch, "idempotency.payload_mismatch", 422},
    {problem_code::in_progress, "idempotency.in_progress", 409},
    {problem_code::response_not_replayable, "idempotency.response_not_replayable", 409},
    {problem_code::store_unavailable, "idempotency.store_unavailable", 503},
    {problem_code::request_too_large, "request.too_large", 413},
    {problem_code::header_too_large, "request.header_too_large", 431},
    {problem_code::bad_request, "request.malformed", 400},
    {problem_code::route_not_found, "route.not_found", 404},
    {problem_code::upstream_unavailable, "upstream.unavailable", 502},
    {problem_code::upstream_timeout, "upstream.timeout", 504},
    {problem_code::upstream_outcome_unknown, "upstream.outcome_unknown", 502},
    {problem_code::upstream_bad_response, "upstream.bad_response", 502},
    {problem_code::connection_limit, "proxy.connection_limit", 503},
};

} // namespace

TEST_SUITE("problem") {

    TEST_CASE("every code has its stable name and default status") {
        std::set<std::string> names;
        for (const auto& row : table) {
            CAPTURE(row.name);
            CHECK(code_name(row.code) == row.name);
            CHECK(default_status(row.code) == row.status);
            names.insert(std::string(code_name(row.code)));
        }
        CHECK(names.size() == std::size(table)); // no two codes share a name
    }

    TEST_CASE("make_problem builds an RFC 9457 problem+json response") {
        for (const auto& row : table) {
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
                  std::string("https://onceproxy.dev/problems/") + row.name);
            CHECK_FALSE(o.at("title").as_string().empty());
        }
    }

    TEST_CASE("make_problem: status override, Retry-After, HTTP version, escaping") {
        SUBCASE("payload mismatch configured as 409") {
            const auto res = make_problem(problem_code::payload_mismatch, "d", 11, 409u);
            CHECK(res.result_int() == 409);
            const auto v = boost::json::parse(res.body());
            CHECK(v.at("status").to_number<unsigned>() == 409);
            CHECK(v.at("code").as_string() == "idempotency.payload_mismatch");
        }
        SUBCASE("Retry-After in whole seconds") {
            const auto res = make_problem(problem_code::in_progress, "busy", 11, std::nullopt, 3u);
            CHECK(res.result_int() == 409);
            CHECK(res[bhttp::field::retry_after] == "3");
        }
        SUBCASE("HTTP/1.0 client") {
            const auto res = make_problem(problem_code::bad_request, "old", 10);
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
