#include "onceproxy/http/problem.hpp"

#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;

namespace {

struct problem_row {
    std::string_view code;
    unsigned status;
    std::string_view title;
};

problem_row row(problem_code c) noexcept {
    switch (c) {
    case problem_code::missing_key:
        return {"idempotency.missing_key", 400, "Idempotency key missing"};
    case problem_code::invalid_key:
        return {"idempotency.invalid_key", 400, "Idempotency key invalid"};
    case problem_code::payload_mismatch:
        return {"idempotency.payload_mismatch", 422,
                "Idempotency key reused with a different request"};
    case problem_code::in_progress:
        return {"idempotency.in_progress", 409, "A request with this key is in progress"};
    case problem_code::response_not_replayable:
        return {"idempotency.response_not_replayable", 409,
                "The recorded response cannot be replayed"};
    case problem_code::store_unavailable:
        return {"idempotency.store_unavailable", 503, "Idempotency store unavailable"};
    case problem_code::request_too_large:
        return {"request.too_large", 413, "Request body too large"};
    case problem_code::header_too_large:
        return {"request.header_too_large", 431, "Request header fields too large"};
    case problem_code::bad_request:
        return {"request.malformed", 400, "Malformed request"};
    case problem_code::route_not_found:
        return {"route.not_found", 404, "No route matches the request"};
    case problem_code::upstream_unavailable:
        return {"upstream.unavailable", 502, "Upstream unavailable"};
    case problem_code::upstream_timeout:
        return {"upstream.timeout", 504, "Upstream timed out"};
    case problem_code::upstream_outcome_unknown:
        return {"upstream.outcome_unknown", 502, "Upstream outcome unknown"};
    case problem_code::upstream_bad_response:
        return {"upstream.bad_response", 502, "Upstream sent an unusable response"};
    case problem_code::connection_limit:
        return {"proxy.connection_limit", 503, "Too many connections"};
    }
    return {"internal", 500, "Internal error"};
}

} // namespace

std::optional<response> read_failure_problem(const boost::system::error_code& ec,
                                             std::string_view what) {
    namespace net = boost::asio;
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
        ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted || ec == net::error::broken_pipe) {
        return std::nullopt;
    }
    if (ec == bhttp::error::body_limit) {
        return make_problem(problem_code::request_too_large,
                            "request body exceeds max_request_bytes");
    }
    if (ec == bhttp::error::header_limit) {
        return make_problem(problem_code::header_too_large,
                            "request header or trailer fields exceed max_header_bytes");
    }
    if (ec == bhttp::error::buffer_overflow) {
        return make_problem(problem_code::header_too_large,
                            "a header line, chunk-size line or trailer section is longer than "
                            "max_header_bytes allows");
    }
    return make_problem(problem_code::bad_request,
                        "malformed " + std::string(what) + ": " + ec.message());
}

std::string_view code_name(problem_code c) noexcept {
    return row(c).code;
}

unsigned default_status(problem_code c) noexcept {
    return row(c).status;
}

response make_problem(problem_code c, std::string_view detail, unsigned http_version,
                      std::optional<unsigned> status, std::optional<unsigned> retry_after_s) {
    const auto r = row(c);
    const unsigned st = status.value_or(r.status);
    boost::json::object o;
    o["type"] = "https://onceproxy.dev/problems/" + std::string(r.code);
    o["title"] = r.title;
    o["status"] = st;
    o["detail"] = detail;
    o["code"] = r.code;
    response res{static_cast<bhttp::status>(st), http_version};
    res.set(bhttp::field::content_type, "application/problem+json");
    res.set(bhttp::field::cache_control, "no-store");
    if (retry_after_s) {
        res.set(bhttp::field::retry_after, std::to_string(*retry_after_s));
    }
    res.body() = boost::json::serialize(o);
    res.prepare_payload();
    return res;
}

} // namespace onceproxy::http
