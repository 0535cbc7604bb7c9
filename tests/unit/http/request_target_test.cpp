#include "onceproxy/http/request_target.hpp"

#include <doctest/doctest.h>

#include <string>

using onceproxy::http::is_normal_target;
using onceproxy::http::normalize_target;

namespace {

std::string normal(std::string_view raw) {
    const auto r = normalize_target(raw);
    REQUIRE_MESSAGE(r.refused == nullptr, raw);
    return r.target;
}

bool refused(std::string_view raw) {
    return normalize_target(raw).refused != nullptr;
}

} // namespace

TEST_CASE("a plain path and its query pass unchanged") {
    CHECK(normal("/") == "/");
    CHECK(normal("/v1/payments") == "/v1/payments");
    CHECK(normal("/v1/payments/") == "/v1/payments/");
    CHECK(normal("/v1/payments?a=1&b=%2F/../x") == "/v1/payments?a=1&b=%2F/../x");
    const auto r = normalize_target("/a/b?q=1");
    CHECK(r.path() == "/a/b");
}

TEST_CASE("the spellings of one path route as that path") {
    CHECK(normal("/v1//payments") == "/v1/payments");
    CHECK(normal("//v1///payments") == "/v1/payments");
    CHECK(normal("/v1/./payments") == "/v1/payments");
    CHECK(normal("/v1/x/../payments") == "/v1/payments");
    CHECK(normal("/v1/%70ayments") == "/v1/payments");
    CHECK(normal("/v1/%2e/payments") == "/v1/payments");
    CHECK(normal("/v1/x/%2E%2E/payments") == "/v1/payments");
    CHECK(normal("/v1/payments/.") == "/v1/payments/");
    CHECK(normal("/v1/payments/..") == "/v1/");
    CHECK(normal("/a/b/../../..x") == "/..x");
}

TEST_CASE("escapes of reserved characters stay encoded, with upper-case hex") {
    CHECK(normal("/a%3fb") == "/a%3Fb");
    CHECK(normal("/caf%c3%a9") == "/caf%C3%A9");
    CHECK(normal("/%7euser") == "/~user");
}

TEST_CASE("the fast check vouches for the common targets") {
    CHECK(is_normal_target("/"));
    CHECK(is_normal_target("/v1/payments?x=%2F//.."));
    CHECK(is_normal_target("/v1/payments/"));
    CHECK(is_normal_target("/v1/.well-known/x"));
    CHECK_FALSE(is_normal_target("/v1//payments"));
    CHECK_FALSE(is_normal_target("/v1/./payments"));
    CHECK_FALSE(is_normal_target("/v1/.."));
    CHECK_FALSE(is_normal_target("/v1%2e"));
    CHECK(normal("/v1/.well-known/x") == "/v1/.well-known/x");
}

TEST_CASE("targets that cannot be routed safely are refused") {
    CHECK(refused(""));
    CHECK(refused("*"));
    CHECK(refused("http://example.com/v1/payments"));
    CHECK(refused("example.com:443"));
    CHECK(refused("/v1%2Fpayments"));
    CHECK(refused("/v1%2fpayments"));
    CHECK(refused("/v1%5Cpayments"));
    CHECK(refused("/v1\\payments"));
    CHECK(refused("/.."));
    CHECK(refused("/a/../.."));
    CHECK(refused("/%2e%2e/etc"));
    CHECK(refused("/a%"));
    CHECK(refused("/a%4"));
    CHECK(refused("/a%zz"));
    CHECK(refused("/a b"));
    CHECK(refused(std::string_view("/a\0b", 4)));
    CHECK(refused("/a#frag"));
}

TEST_CASE("an encoded NUL and dot segments with parameters are refused") {
    CHECK(refused("/pay%00"));
    CHECK(refused("/pay%00.json"));
    CHECK(refused("/public/..;/admin"));
    CHECK(refused("/public/..;x=1/admin"));
    CHECK(refused("/public/.;/admin"));
    CHECK(refused("/public/%2e%2e;/admin"));
    CHECK(refused("/public/..;"));
    CHECK_FALSE(is_normal_target("/public/..;/admin"));
    CHECK_FALSE(is_normal_target("/public/.;/admin"));
    // Parameters on an ordinary segment are routed (match.path_params decides); a segment
    // that merely starts with dots is no dot segment.
    CHECK(normal("/pay;x=1") == "/pay;x=1");
    CHECK(normal("/a/...;x/b") == "/a/...;x/b");
    CHECK(normal("/pay%3b") == "/pay%3B");
}
