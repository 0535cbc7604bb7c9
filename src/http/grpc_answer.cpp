#include "http/grpc_answer.hpp"

#include "onceproxy/core/grpc.hpp"
#include "onceproxy/core/problem.hpp"
#include "onceproxy/http/headers.hpp"

#include <boost/beast/http/field.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <string>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;

bool is_grpc_call(const request& req) noexcept {
    return core::is_grpc_content_type(first_value(req, bhttp::field::content_type));
}

namespace {

/// The problem code and detail of a problem+json body; the code is empty when unreadable.
std::pair<std::string, std::string> code_and_detail(std::string_view body) {
    boost::system::error_code ec;
    const auto v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) {
        return {};
    }
    const auto& o = v.get_object();
    const auto* code = o.if_contains("code");
    const auto* detail = o.if_contains("detail");
    return {code != nullptr && code->is_string() ? std::string(code->get_string()) : "",
            detail != nullptr && detail->is_string() ? std::string(detail->get_string()) : ""};
}

} // namespace

void to_grpc_answer(response& res) {
    if (res[bhttp::field::content_type] != "application/problem+json") {
        return;
    }
    auto [code, detail] = code_and_detail(res.body());
    auto status = core::grpc_status_of_http(res.result_int());
    for (const auto& row : core::problem_table) {
        if (row.name == code) {
            status = row.grpc;
        }
    }
    const auto retry_after = std::string(res[bhttp::field::retry_after]);
    res.result(bhttp::status::ok);
    res.erase(bhttp::field::retry_after);
    res.erase(bhttp::field::cache_control);
    res.erase(bhttp::field::content_length);
    res.set(bhttp::field::content_type, "application/grpc");
    res.set("grpc-status", std::to_string(static_cast<unsigned>(status)));
    res.set("grpc-message", core::encode_grpc_message(detail));
    if (!code.empty()) {
        res.set(grpc_problem_field, code);
    }
    if (!retry_after.empty()) {
        // gRPC's own server pushback (gRFC A6): when a retry may go, in milliseconds.
        res.set("grpc-retry-pushback-ms", retry_after + "000");
    }
    res.body().clear();
}

} // namespace onceproxy::http
