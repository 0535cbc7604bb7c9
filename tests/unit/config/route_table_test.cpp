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

/// `m` read byte for byte: ;params, a trailing slash and case all count.
cfg::route_match literal(cfg::route_match m) {
    m.path_params = cfg::path_params_match::literal;
    m.trailing_slash = cfg::trailing_slash_match::exact;
    m.letter_case = cfg::case_match::exact;
    return m;
}

TEST_CASE("exact path") {
    const auto m = literal(match(cfg::path_match_kind::exact, "/v1/payments"));
    CHECK(cfg::matches(m, "POST", "/v1/payments"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payments/"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payment"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payments/1"));
    CHECK_FALSE(cfg::matches(m, "POST", "/V1/payments"));
    CHECK_FALSE(cfg::matches(m, "POST", "/v1/payments;x=1"));
}

TEST_CASE("by default a route reads /pay;x=1, /pay%3B, /pay/ and /PAY as /pay") {
    const auto m = match(cfg::path_match_kind::exact, "/pay");
    for (const char* path : {"/pay", "/pay;x=1", "/pay%3B", "/pay;", "/pay/", "/PAY", "/Pay/",
                             "/PAY;jsessionid=1", "/pay;a/"}) {
        CAPTURE(path);
        CHECK(cfg::matches(m, "POST", path));
    }
    for (const char* path : {"/pay/x", "/payx", "/pa", "/pay//", "/x;/pay"}) {
        CAPTURE(path);
        CHECK_FALSE(cfg::matches(m, "POST", path));
    }
    const auto refund = match(cfg::path_match_kind::pattern, "/orders/{id}/refund");
    for (const char* path : {"/orders/1/refund;jsessionid=1", "/orders/1;v=2/refund",
                             "/ORDERS/1/Refund/", "/orders/1/refund%3Bx"}) {
        CAPTURE(path);
        CHECK(cfg::matches(refund, "POST", path));
    }
    CHECK_FALSE(cfg::matches(refund, "POST", "/orders/;x/refund")); // an empty {id}
    const auto prefix = match(cfg::path_match_kind::prefix, "/v1/payments/");
    for (const char* path :
         {"/v1/payments", "/V1/Payments/7", "/v1;x/payments/7", "/v1/payments;x"}) {
        CAPTURE(path);
        CHECK(cfg::matches(prefix, "POST", path));
    }
    CHECK_FALSE(cfg::matches(prefix, "POST", "/v1/paymentsx"));
}

TEST_CASE("each switch gives back the literal reading of its part") {
    auto m = match(cfg::path_match_kind::exact, "/pay");
    m.path_params = cfg::path_params_match::literal;
    CHECK_FALSE(cfg::matches(m, "POST", "/pay;x=1"));
    CHECK_FALSE(cfg::matches(m, "POST", "/pay%3B"));
    CHECK(cfg::matches(m, "POST", "/PAY/"));
    m = match(cfg::path_match_kind::exact, "/pay");
    m.trailing_slash = cfg::trailing_slash_match::exact;
    CHECK_FALSE(cfg::matches(m, "POST", "/pay/"));
    CHECK(cfg::matches(m, "POST", "/PAY;x"));
    m = match(cfg::path_match_kind::exact, "/pay");
    m.letter_case = cfg::case_match::exact;
    CHECK_FALSE(cfg::matches(m, "POST", "/PAY"));
    CHECK(cfg::matches(m, "POST", "/pay;x/"));

    // refuse: matched as `guard` does; a path with parameters is then refused.
    auto r = route("r", match(cfg::path_match_kind::exact, "/pay"));
    r.match.path_params = cfg::path_params_match::refuse;
    CHECK(cfg::matches(r.match, "POST", "/pay;x=1"));
    CHECK(cfg::refuses_path(r, "/pay;x=1"));
    CHECK(cfg::refuses_path(r, "/pay%3B"));
    CHECK_FALSE(cfg::refuses_path(r, "/pay"));
    r.match.path_params = cfg::path_params_match::guard;
    CHECK_FALSE(cfg::refuses_path(r, "/pay;x=1"));
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
    CHECK_FALSE(cfg::matches(literal(m), "POST", "/v1/orders/1/refunds/"));
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
