#include "onceproxy/http/problem.hpp"

#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;

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
    return core::to_string(c);
}

response make_problem(problem_code c, problem_options o) {
    return make_problem(c, core::info(c).detail, o);
}

response make_problem(problem_code c, std::string_view detail, problem_options o) {
    const auto& r = core::info(c);
    const unsigned st = o.status.value_or(r.status);
    boost::json::object body;
    body["type"] = "https://onceproxy.dev/problems/" + std::string(r.name);
    body["title"] = r.title;
    body["status"] = st;
    body["detail"] = detail;
    body["code"] = r.name;
    response res{static_cast<bhttp::status>(st), o.http_version};
    res.set(bhttp::field::content_type, "application/problem+json");
    res.set(bhttp::field::cache_control, "no-store");
    if (o.retry_after_s) {
        res.set(bhttp::field::retry_after, std::to_string(*o.retry_after_s));
    }
    res.body() = boost::json::serialize(body);
    res.prepare_payload();
    return res;
}

} // namespace onceproxy::http
