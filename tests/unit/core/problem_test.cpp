#include <onceproxy/core/problem.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>

namespace core = onceproxy::core;
using core::problem_code;

namespace {

struct expected_row {
    problem_code code;
    const char* name;
    unsigned status;
};

// SPEC §3.2: the codes and statuses clients depend on; never change one silently.
constexpr expected_row spec[] = {
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
    {problem_code::upstream_tls_error, "upstream.tls_error", 502},
    {problem_code::connection_limit, "proxy.connection_limit", 503},
    {problem_code::request_timeout, "request.timeout", 408},
    {problem_code::admin_too_many_attempts, "admin.too_many_attempts", 429},
    {problem_code::upstream_tunnel_limit, "upstream.tunnel_limit", 503},
    {problem_code::memory_limit, "proxy.memory_limit", 503},
    {problem_code::admin_unauthorized, "admin.unauthorized", 401},
    {problem_code::admin_method_not_allowed, "admin.method_not_allowed", 405},
    {problem_code::admin_bad_request, "admin.bad_request", 400},
    {problem_code::admin_store_unavailable, "admin.store_unavailable", 503},
    {problem_code::admin_key_in_flight, "admin.key_in_flight", 409},
    {problem_code::egress_circuit_open, "egress.circuit_open", 503},
};

} // namespace

TEST_SUITE("problem table") {

    TEST_CASE("complete: every code has one row, in enum order, with all texts") {
        REQUIRE(core::problem_table.size() == core::problem_code_count);
        std::set<std::string> names;
        std::set<std::string> titles;
        for (std::size_t i = 0; i < core::problem_code_count; ++i) {
            const auto c = static_cast<problem_code>(i);
            const auto& row = core::info(c);
            CAPTURE(row.name);
            CHECK(row.code == c);
            CHECK_FALSE(row.name.empty());
            CHECK_FALSE(row.title.empty());
            CHECK_FALSE(row.detail.empty());
            CHECK(row.status >= 400);
            CHECK(row.status <= 599);
            names.emplace(row.name);
            if (c != problem_code::admin_store_unavailable) {
                titles.emplace(row.title);
            }
        }
        CHECK(names.size() == core::problem_code_count); // codes are unique
        // Titles too, but for the store's unavailability seen by the admin API, which keeps
        // the title of idempotency.store_unavailable.
        CHECK(titles.size() == core::problem_code_count - 1);
        CHECK(core::info(problem_code::admin_store_unavailable).title ==
              core::info(problem_code::store_unavailable).title);
    }

    TEST_CASE("the stable codes and default statuses of SPEC §3.2") {
        REQUIRE(std::size(spec) == core::problem_code_count);
        for (const auto& row : spec) {
            CAPTURE(row.name);
            CHECK(core::to_string(row.code) == row.name);
            CHECK(core::default_status(row.code) == row.status);
        }
    }
}
