#pragma once
// Reading what a test upstream or the proxy put in a JSON body, and checking problem documents
// (RFC 9457, SPEC §3.2), with doctest assertions.

#include "support/http_client.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <string>

namespace onceproxy::test {

/// A top-level member of a JSON object body as text: a string's value, any other value
/// serialised; "" when the body is not an object or has no such member.
inline std::string json_member(const std::string& body, const std::string& name) {
    boost::system::error_code ec;
    const auto v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) {
        return {};
    }
    const auto* m = v.as_object().if_contains(name);
    if (m == nullptr) {
        return {};
    }
    if (m->is_string()) {
        return std::string(m->as_string());
    }
    return boost::json::serialize(*m);
}

/// A problem document with `status` and the stable `code`.
inline void check_problem(const http_response& r, unsigned status, const std::string& code) {
    INFO("status " << r.status << ", body: " << r.body);
    CHECK(r.status == status);
    CHECK(r.header("Content-Type") == "application/problem+json");
    CHECK(json_member(r.body, "code") == code);
    CHECK(json_member(r.body, "status") == std::to_string(status));
}

} // namespace onceproxy::test
