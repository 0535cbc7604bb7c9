#include "onceproxy/config/route_table.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace cfg = onceproxy::config;

namespace {

cfg::route_match match(cfg::path_match_kind kind, std::string path,
                       std::vector<std::string> methods = {}) {
    cfg::route_match m;
    m.kind = kind;
    m.path = std::move(path);
    m.methods = std::move(methods);
    return m;
}

cfg::route_config route(std::string name, cfg::route_match m) {
    cfg::route_config r;
    r.name = std::move(name);
    r.match = std::move(m);
    return r;
}

} // namespace

TEST_CASE("exact path") {
    const auto m = match(cfg::path_match_kind::exact, "/v1/payments");
    CHECK(cfg::matches(m, "POST", "/v1/payments"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payments/"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payment"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payments/1"));
    CHECK_FALSE(cfg::matches(m, "POST", "/V1/payments"));
}

TEST_CASE("prefix is a string prefix") {
    const auto m = match(cfg::path_match_kind::prefix, "/webhooks/stripe");
    CHECK(cfg::matches(m, "POST", "/webhooks/stripe"));
    CHECK(cfg::matches(m, "POST", "/webhooks/stripe/evt"));
    CHECK(cfg::matches(m, "POST", "/webhooks/stripe-v2"));
    CHECK_FALSE(cfg::matches(m, "POST", "/webhooks/strip"));
    CHECK(cfg::matches(match(cfg::path_match_kind::prefix, "/"), "GET", "/anything"));
}

TEST_CASE("template parameters match exactly one non-empty segment") {
    const auto m = match(cfg::path_match_kind::pattern, "/v1/orders/{id}/refunds");
    CHECK(cfg::matches(m, "POST", "/v1/orders/42/refunds"));
    CHECK(cfg::matches(m, "POST", "/v1/orders/ord_abc-1/refunds"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/orders//refunds"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/orders/1/2/refunds"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/orders/1/refunds/"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/orders/1/refund"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/orders/1"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v2/orders/1/refunds"));

    const auto tail = match(cfg::path_match_kind::pattern, "/users/{user}/items/{item}");
    CHECK(cfg::matches(tail, "PUT", "/users/u1/items/i2"));
    CHECK_FALSE(cfg::matches(tail, "PUT", "/users/u1/items/"));
    CHECK_FALSE(cfg::matches(tail, "PUT", "/users/u1/items"));
    CHECK_FALSE(cfg::matches(tail, "PUT", ""));
}

TEST_CASE("method filter: empty means any") {
    const auto any = match(cfg::path_match_kind::prefix, "/");
    CHECK(cfg::matches(any, "DELETE", "/x"));
    const auto post = match(cfg::path_match_kind::prefix, "/", {"POST", "PATCH"});
    CHECK(cfg::matches(post, "POST", "/x"));
    CHECK(cfg::matches(post, "PATCH", "/x"));
    CHECK_FALSE(cfg::matches(post, "GET", "/x"));
    CHECK_FALSE(cfg::matches(post, "post", "/x")); // methods are case-sensitive (RFC 9110 §9.1)
}

TEST_CASE("find_route: first match wins") {
    cfg::config c;
    c.routes.push_back(
        route("payments", match(cfg::path_match_kind::exact, "/v1/payments", {"POST"})));
    c.routes.push_back(
        route("refunds", match(cfg::path_match_kind::pattern, "/v1/orders/{id}/refunds")));
    c.routes.push_back(route("v1", match(cfg::path_match_kind::prefix, "/v1/")));
    c.routes.push_back(route("all", match(cfg::path_match_kind::prefix, "/")));

    const auto name_of = [&](std::string_view method, std::string_view path) {
        const auto* r = cfg::find_route(c, method, path);
        return r == nullptr ? std::string{"(none)"} : r->name;
    };
    CHECK(name_of("POST", "/v1/payments") == "payments");
    CHECK(name_of("GET", "/v1/payments") == "v1"); // method filter falls through
    CHECK(name_of("POST", "/v1/orders/7/refunds") == "refunds");
    CHECK(name_of("POST", "/v1/other") == "v1");
    CHECK(name_of("GET", "/health") == "all");

    cfg::config narrow;
    narrow.routes.push_back(route("only", match(cfg::path_match_kind::exact, "/a")));
    CHECK(cfg::find_route(narrow, "GET", "/b") == nullptr);
}
