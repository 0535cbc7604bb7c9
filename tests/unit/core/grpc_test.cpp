#include <onceproxy/core/grpc.hpp>
#include <onceproxy/core/problem.hpp>

#include <doctest/doctest.h>

using namespace onceproxy::core;
using namespace std::chrono_literals;

TEST_CASE("grpc: a gRPC call is application/grpc or application/grpc+format, nothing else") {
    CHECK(is_grpc_content_type("application/grpc"));
    CHECK(is_grpc_content_type("application/grpc+proto"));
    CHECK(is_grpc_content_type("Application/GRPC+json"));
    CHECK(is_grpc_content_type("application/grpc; charset=utf-8"));
    CHECK_FALSE(is_grpc_content_type("application/grpc-web"));
    CHECK_FALSE(is_grpc_content_type("application/grpc-web+proto"));
    CHECK_FALSE(is_grpc_content_type("application/json"));
    CHECK_FALSE(is_grpc_content_type("application/grp"));
    CHECK_FALSE(is_grpc_content_type(""));
}

TEST_CASE("grpc: grpc-status is decimal digits") {
    CHECK(parse_grpc_status("0") == 0U);
    CHECK(parse_grpc_status("14") == 14U);
    CHECK(parse_grpc_status("99") == 99U); // unknown codes are read, and treated as uncertain
    CHECK_FALSE(parse_grpc_status("").has_value());
    CHECK_FALSE(parse_grpc_status("1 ").has_value());
    CHECK_FALSE(parse_grpc_status("-1").has_value());
    CHECK_FALSE(parse_grpc_status("OK").has_value());
    CHECK_FALSE(parse_grpc_status("1234567890").has_value());
}

TEST_CASE("grpc: grpc-timeout in every unit, rounded up to milliseconds") {
    CHECK(parse_grpc_timeout("2H") == 2h);
    CHECK(parse_grpc_timeout("3M") == 3min);
    CHECK(parse_grpc_timeout("10S") == 10s);
    CHECK(parse_grpc_timeout("250m") == 250ms);
    CHECK(parse_grpc_timeout("1500u") == 2ms);
    CHECK(parse_grpc_timeout("1n") == 1ms);
    CHECK(parse_grpc_timeout("99999999S") == std::chrono::milliseconds(99'999'999'000));
    CHECK_FALSE(parse_grpc_timeout("S").has_value());
    CHECK_FALSE(parse_grpc_timeout("10").has_value());
    CHECK_FALSE(parse_grpc_timeout("10s").has_value()); // units are case-sensitive: s is not S
    CHECK_FALSE(parse_grpc_timeout("123456789S").has_value()); // at most 8 digits
    CHECK_FALSE(parse_grpc_timeout("1.5S").has_value());
}

TEST_CASE("grpc: the status of an answer without grpc-status follows gRPC's HTTP mapping") {
    CHECK(grpc_status_of_http(400) == grpc_status::internal);
    CHECK(grpc_status_of_http(401) == grpc_status::unauthenticated);
    CHECK(grpc_status_of_http(403) == grpc_status::permission_denied);
    CHECK(grpc_status_of_http(404) == grpc_status::unimplemented);
    CHECK(grpc_status_of_http(429) == grpc_status::unavailable);
    CHECK(grpc_status_of_http(503) == grpc_status::unavailable);
    CHECK(grpc_status_of_http(200) == grpc_status::unknown);
    CHECK(grpc_status_of_http(500) == grpc_status::unknown);
}

TEST_CASE("grpc: grpc-message is percent-encoded outside printable ASCII") {
    CHECK(encode_grpc_message("plain text, ok") == "plain text, ok");
    CHECK(encode_grpc_message("100%") == "100%25");
    CHECK(encode_grpc_message("line\nbreak") == "line%0Abreak");
    CHECK(encode_grpc_message("caf\xc3\xa9") == "caf%C3%A9");
}

TEST_CASE("grpc: the problem table gives every proxy answer its gRPC status") {
    CHECK(grpc_status_of(problem_code::missing_key) == grpc_status::invalid_argument);
    CHECK(grpc_status_of(problem_code::invalid_key) == grpc_status::invalid_argument);
    CHECK(grpc_status_of(problem_code::payload_mismatch) == grpc_status::failed_precondition);
    CHECK(grpc_status_of(problem_code::in_progress) == grpc_status::aborted);
    CHECK(grpc_status_of(problem_code::store_unavailable) == grpc_status::unavailable);
    CHECK(grpc_status_of(problem_code::upstream_timeout) == grpc_status::deadline_exceeded);
    CHECK(grpc_status_of(problem_code::upstream_outcome_unknown) == grpc_status::unknown);
    CHECK(grpc_status_of(problem_code::route_not_found) == grpc_status::unimplemented);
}
