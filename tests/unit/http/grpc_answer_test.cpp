#include "http/exchange_translation.hpp"
#include "http/grpc_answer.hpp"
#include "onceproxy/http/problem.hpp"

#include <doctest/doctest.h>

#include <boost/beast/http/field.hpp>

#include <string>

namespace core = onceproxy::core;
namespace config = onceproxy::config;
using namespace onceproxy::http;
namespace bhttp = boost::beast::http;

TEST_CASE("grpc answer: a problem becomes a trailers-only gRPC status with its code") {
    auto res = make_problem(problem_code::in_progress, {.retry_after_s = 3});
    res.set("Idempotency-Status", "replayed");
    to_grpc_answer(res);
    CHECK(res.result_int() == 200);
    CHECK(res[bhttp::field::content_type] == "application/grpc");
    CHECK(res["grpc-status"] == "10"); // ABORTED
    CHECK(res["grpc-message"] ==
          "a request with this idempotency key is still being processed; retry later");
    CHECK(res[grpc_problem_field] == "idempotency.in_progress");
    CHECK(res["grpc-retry-pushback-ms"] == "3000");
    CHECK(res["Idempotency-Status"] == "replayed");
    CHECK(res[bhttp::field::retry_after].empty());
    CHECK(res[bhttp::field::content_length].empty());
    CHECK(res.body().empty());

    auto mismatch = make_problem(problem_code::payload_mismatch, "100% different\n");
    to_grpc_answer(mismatch);
    CHECK(mismatch["grpc-status"] == "9"); // FAILED_PRECONDITION
    CHECK(mismatch["grpc-message"] == "100%25 different%0A");
    CHECK(mismatch["grpc-retry-pushback-ms"].empty());
}

TEST_CASE("grpc answer: an upstream answer is left as it is") {
    response res{bhttp::status::ok, 11};
    res.set(bhttp::field::content_type, "application/grpc");
    res.body() = std::string("\0\0\0\0\x02hi", 7);
    const auto before = res;
    to_grpc_answer(res);
    CHECK(res.body() == before.body());
    CHECK(res["grpc-status"].empty());
}

TEST_CASE("grpc answer: is_grpc_call reads the request's content-type") {
    request req{bhttp::verb::post, "/pkg.Svc/M", 11};
    CHECK_FALSE(is_grpc_call(req));
    req.set(bhttp::field::content_type, "application/grpc+proto");
    CHECK(is_grpc_call(req));
    req.set(bhttp::field::content_type, "application/grpc-web");
    CHECK_FALSE(is_grpc_call(req));
}

TEST_CASE("grpc status of an answer: trailers first, then a trailers-only head, then HTTP") {
    response res{bhttp::status::ok, 11};
    bhttp::fields trailers;
    CHECK(grpc_status_of(res, trailers) == 2); // 200 without a status: UNKNOWN
    res.set("grpc-status", "5");
    CHECK(grpc_status_of(res, trailers) == 5); // trailers-only
    trailers.set("grpc-status", "0");
    CHECK(grpc_status_of(res, trailers) == 0);
    trailers.set("grpc-status", "zero");
    CHECK(grpc_status_of(res, trailers) == 2);
    response unavailable{bhttp::status::service_unavailable, 11};
    CHECK(grpc_status_of(unavailable, {}) == 14);

    onceproxy::upstream::forward_result r;
    r.res = res;
    r.trailers.set("grpc-status", "14");
    CHECK(to_upstream_event(r, true).grpc_status == 14U);
    CHECK_FALSE(to_upstream_event(r, false).grpc_status.has_value());
}

TEST_CASE("grpc record: the trailers are recorded and replayed after the message") {
    response up{bhttp::status::ok, 11};
    up.set(bhttp::field::content_type, "application/grpc");
    up.body() = std::string("\0\0\0\0\x03"
                            "abc",
                            8);
    bhttp::fields trailers;
    trailers.set("grpc-status", "0");
    trailers.set("grpc-status-details-bin", "CAASAk9L");
    core::action a;
    a.kind = core::action_kind::complete;
    const config::idempotency_config p;
    const auto encoded = record_payload(a, &up, p, "", nullptr, {}, &trailers);
    bhttp::fields replayed;
    const auto res = replay_response(encoded, false, "Thu, 02 May 2024 00:00:00 GMT", &replayed);
    CHECK(res.body() == up.body());
    CHECK(res["Idempotency-Status"] == "replayed");
    CHECK(replayed["grpc-status"] == "0");
    CHECK(replayed["grpc-status-details-bin"] == "CAASAk9L");
    // A record without trailers replays none.
    bhttp::fields none;
    const auto plain = replay_response(record_payload(a, &up, p, ""), false, "x", &none);
    CHECK(none.begin() == none.end());
    CHECK(plain.body() == up.body());
}
