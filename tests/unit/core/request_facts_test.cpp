#include <onceproxy/core/request_facts.hpp>

#include <onceproxy/core/canonical_json.hpp>
#include <onceproxy/core/fingerprint.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace core = onceproxy::core;
namespace config = onceproxy::config;
using core::header_view;
using core::key_presence;

namespace {

config::idempotency_config policy() {
    config::idempotency_config p;
    p.mode = config::idempotency_mode::required;
    return p;
}

/// A POST with `headers` and a JSON body; keeps the header vector alive for the view.
struct test_request {
    std::vector<header_view> headers;
    std::string body = R"({"amount":10,"id":"order-7"})";
    std::string target = "/v1/payments?x=1";
    std::string method = "POST";
    std::string subject; ///< the verified client certificate's subject
    std::string address = "192.0.2.7";

    core::request_view view() const { return {method, target, headers, body, subject, address}; }
};

core::derived_request derive(const config::idempotency_config& p, const test_request& r,
                             std::string_view route = "payments") {
    return core::derive_request_facts(p, route, r.view());
}

/// Store key, fingerprint and holder of `r`, hex where they are raw bytes, '|' between.
std::string pinned_facts(const config::idempotency_config& p, const test_request& r) {
    const auto d = derive(p, r);
    REQUIRE(d.facts.key == key_presence::present);
    return d.store_key + "|" + core::to_hex(d.fingerprint) + "|" + core::to_hex(d.holder);
}

} // namespace

TEST_SUITE("request facts") {

    TEST_CASE("request_view: header lookup ignores case, keeps arrival order") {
        test_request r;
        r.headers = {{"X-A", "1"}, {"content-type", "application/json"}, {"x-a", "2"}};
        const auto v = r.view();
        CHECK(v.values("x-A") == std::vector<std::string_view>{"1", "2"});
        CHECK(v.value("Content-Type") == "application/json");
        CHECK(v.value("missing").empty());
        CHECK(v.values("missing").empty());
        CHECK(core::ascii_iequals("Idempotency-Key", "idempotency-key"));
        CHECK_FALSE(core::ascii_iequals("Idempotency-Key", "idempotency-kex"));
        CHECK_FALSE(core::ascii_iequals("a", "ab"));
    }

    TEST_CASE("header key: present, missing, invalid, repeated") {
        const auto p = policy();
        test_request r;
        r.headers = {{"Content-Type", "application/json"}, {"idempotency-key", "\"k-1\""}};
        auto d = derive(p, r);
        CHECK(d.facts.guarded);
        CHECK(d.facts.key == key_presence::present);
        CHECK(d.store_key.size() == 64);
        CHECK(d.fingerprint.size() == 32);

        r.headers = {{"Content-Type", "application/json"}};
        d = derive(p, r);
        CHECK(d.facts.key == key_presence::missing);
        CHECK(d.store_key.empty());
        CHECK(d.fingerprint.empty());

        r.headers = {{"Idempotency-Key", "a, b"}};
        CHECK(derive(p, r).facts.key == key_presence::invalid);
        r.headers = {{"Idempotency-Key", ""}};
        CHECK(derive(p, r).facts.key == key_presence::invalid);
        r.headers = {{"Idempotency-Key", "a"}, {"Idempotency-Key", "a"}};
        CHECK(derive(p, r).facts.key == key_presence::invalid);
        const std::string too_long(256, 'a'); // the views must outlive the request
        r.headers = {{"Idempotency-Key", too_long}};
        CHECK(derive(p, r).facts.key == key_presence::invalid);
    }

    TEST_CASE("guarded follows the route's methods") {
        const auto p = policy();
        test_request r;
        r.headers = {{"Idempotency-Key", "k"}};
        r.method = "PUT";
        CHECK_FALSE(derive(p, r).facts.guarded);
        r.method = "PATCH";
        CHECK(derive(p, r).facts.guarded);
    }

    TEST_CASE("the store key is scoped by route, principal (Authorization, Cookie) and key") {
        const auto p = policy();
        test_request a;
        a.headers = {{"Idempotency-Key", "k"}, {"Authorization", "Bearer alice"}};
        test_request b = a;
        b.headers[1].second = "Bearer bob";
        test_request c = a;
        c.headers = {{"Idempotency-Key", "k"}, {"Cookie", "session=alice"}};
        test_request anon = a;
        anon.headers = {{"Idempotency-Key", "k"}};
        const auto ka = derive(p, a).store_key;
        CHECK(ka == derive(p, a).store_key);
        CHECK(ka != derive(p, b).store_key);
        CHECK(ka != derive(p, c).store_key);
        CHECK(ka != derive(p, anon).store_key);
        CHECK(ka != derive(p, a, "orders").store_key);
        const std::vector<header_view> scope{{"Authorization", "Bearer alice"}};
        CHECK(ka == core::store_key("", "payments", core::principal_hash(scope), "k"));
        // The principal does not change what the request is.
        CHECK(derive(p, a).fingerprint == derive(p, b).fingerprint);
    }

    TEST_CASE("principal client_cert: the certificate subject scopes the key, headers too") {
        auto p = policy();
        test_request alice;
        alice.headers = {{"Idempotency-Key", "k"}};
        alice.subject = "CN=alice";
        test_request bob = alice;
        bob.subject = "CN=bob";
        // Without principal: client_cert the subject plays no part.
        CHECK(derive(p, alice).store_key == derive(p, bob).store_key);
        p.principal = config::principal_source::client_cert;
        CHECK(derive(p, alice).store_key != derive(p, bob).store_key);
        CHECK(derive(p, alice).store_key == derive(p, alice).store_key);
        test_request alice_token = alice;
        alice_token.headers.emplace_back("Authorization", "Bearer t");
        CHECK(derive(p, alice).store_key != derive(p, alice_token).store_key);
        // A header cannot pose as the certificate.
        test_request forged = alice;
        forged.subject.clear();
        forged.headers.emplace_back(":client-certificate", "CN=alice");
        CHECK(derive(p, alice).store_key != derive(p, forged).store_key);
        CHECK(derive(p, alice).fingerprint == derive(p, bob).fingerprint);
    }

    TEST_CASE("the fingerprint covers method, target, fingerprint headers and body") {
        const auto p = policy();
        test_request r;
        r.headers = {{"Idempotency-Key", "k"}, {"Content-Type", "application/json"}};
        const auto base = derive(p, r).fingerprint;
        core::fingerprint_input fi;
        fi.method = "POST";
        fi.target = r.target;
        fi.headers = {{"Content-Type", "application/json"}};
        fi.content_type = "application/json";
        fi.body = r.body;
        CHECK(base == core::compute_fingerprint(fi));

        test_request other = r;
        other.target = "/v1/payments?x=2";
        CHECK(derive(p, other).fingerprint != base);
        other = r;
        other.body = R"({"amount":11,"id":"order-7"})";
        CHECK(derive(p, other).fingerprint != base);
        other = r;
        other.body = R"({ "id":"order-7", "amount":10 })"; // same JSON, canonical form
        CHECK(derive(p, other).fingerprint == base);
        other = r;
        other.headers[1].second = "application/json; charset=utf-8";
        CHECK(derive(p, other).fingerprint != base);
    }

    TEST_CASE("natural key from a JSON pointer") {
        auto p = policy();
        p.key.json_pointer = "/id";
        test_request r;
        r.headers = {{"Content-Type", "application/json"}};
        auto d = derive(p, r);
        CHECK(d.facts.key == key_presence::present);
        CHECK(d.store_key == core::store_key("", "payments", core::principal_hash({}), "order-7"));

        r.body = R"({"amount":10})";
        CHECK(derive(p, r).facts.key == key_presence::missing);
        r.body = R"({"id":""})";
        CHECK(derive(p, r).facts.key == key_presence::invalid);
        p.key.max_length = 3;
        r.body = R"({"id":"abcd"})";
        CHECK(derive(p, r).facts.key == key_presence::invalid);
        r.body = "not json";
        CHECK(derive(p, r).facts.key == key_presence::missing);
    }

    TEST_CASE("a key header that is not forwarded is not part of scope or fingerprint") {
        auto p = policy();
        p.fingerprint_headers = {"Content-Type", "Idempotency-Key"};
        test_request r;
        r.headers = {{"Idempotency-Key", "k"}, {"Content-Type", "application/json"}};
        const auto forwarded = derive(p, r).fingerprint;
        p.key.forward = false;
        const auto dropped = derive(p, r).fingerprint;
        CHECK(forwarded != dropped);
        core::fingerprint_input fi;
        fi.method = "POST";
        fi.target = r.target;
        fi.headers = {{"Content-Type", "application/json"}};
        fi.content_type = "application/json";
        fi.body = r.body;
        CHECK(dropped == core::compute_fingerprint(fi));
    }

    TEST_CASE("derived facts stay the same from one version to the next (stored keys)") {
        // Store keys, fingerprints and holders are kept in the store: a replica of another
        // version must derive the same ones, or a retry during a rolling upgrade would miss
        // its record (or be refused as a different request).
        auto p = policy();
        test_request r;
        r.headers = {{"Idempotency-Key", "\"k-1\""},
                     {"content-type", "application/json; charset=utf-8"},
                     {"Authorization", "Bearer alice"},
                     {"X-Other", "o"},
                     {"Cookie", "s=1"}};
        r.body = R"({"z":{"b":[1,2.50,-0,1e21,"\u00e9\n\u001f/"],"a":null},"a\"q":true,)"
                 R"("amount":1000,"big":9007199254740993,"neg":-12,"f":0.30000000000000001,)"
                 R"("e":1E-7,"\ud83d\ude02":[],"\ufb33":{}})";
        CHECK(pinned_facts(p, r) ==
              "f48e315cafabef55b18dde26b3e181429efa7c7b66c3800d1d80071fda173817|"
              "2bf0ec1444fcf6a067c80ae78175a593709cb6109250dd60af9d4dd189353d98|"
              "700d279ba04709f666999a957fe378713f085c904bc190c83305d7b8a4dece8f98");

        test_request anonymous;
        anonymous.headers = {{"Idempotency-Key", "k"}, {"Content-Type", "text/plain"}};
        anonymous.body = "hello";
        CHECK(pinned_facts(p, anonymous) ==
              "4e68e03a21cfce987049ecdeb16546caf53ec6d8ef4ff56eecde931cbc5347b6|"
              "838f586a409f63e2b3d1f08cc1d777583b62f30f9ee2fd8efc8293fed5995c57|"
              "613139322e302e322e37");

        test_request invalid = anonymous; // JSON type, not JSON (a duplicate name): hashed raw
        invalid.headers[1].second = "application/problem+json";
        invalid.body = R"({"a":1,"a":2})";
        CHECK(pinned_facts(p, invalid) ==
              "4e68e03a21cfce987049ecdeb16546caf53ec6d8ef4ff56eecde931cbc5347b6|"
              "b4b3339fc8426620f3c7594c04a3784106d4b08218f76d8104b1c6a4c70dbc0d|"
              "613139322e302e322e37");

        test_request large = anonymous; // canonical form beyond the hasher's buffer
        large.headers[1].second = "application/json";
        large.body = "[";
        for (int i = 0; i < 60; ++i) {
            large.body += (i > 0 ? ", " : "") + std::string(R"({ "n" : )") + std::to_string(i) +
                          R"(, "id" : "item" })";
        }
        large.body += "]";
        REQUIRE(core::canonicalize_json(large.body).value_or("").size() > 512);
        CHECK(pinned_facts(p, large) ==
              "4e68e03a21cfce987049ecdeb16546caf53ec6d8ef4ff56eecde931cbc5347b6|"
              "23ec329aeff0ea52a721189f8a8769221c26b1557c1d8ac224fbcc5bdee98a9d|"
              "613139322e302e322e37");

        auto raw = p;
        raw.json_canonical = false;
        CHECK(pinned_facts(raw, r) ==
              "f48e315cafabef55b18dde26b3e181429efa7c7b66c3800d1d80071fda173817|"
              "01db92151a6e6ebb1d2a0cd5c56ba60e18238b9a4c2b833f5ae10f908a9ef05a|"
              "700d279ba04709f666999a957fe378713f085c904bc190c83305d7b8a4dece8f98");

        auto cert = p;
        cert.principal = config::principal_source::client_cert;
        test_request alice = r;
        alice.subject = "CN=alice";
        CHECK(pinned_facts(cert, alice) ==
              "7ed397bd5dd6ae6bf71c6426846de4d47b7e688f2980bb21c0281010730efaea|"
              "2bf0ec1444fcf6a067c80ae78175a593709cb6109250dd60af9d4dd189353d98|"
              "70912f71900cc9a5aa86c60bf30db6b1af526023e0777e93c4b6223881517d6714");
        alice.headers = {{"Idempotency-Key", "k"}};
        CHECK(pinned_facts(cert, alice) ==
              "cffdb588683165204080f9519e72f2c54accbd88ce9849ae54db443b0e29824f|"
              "7e3dc103a9b8a042e5ce9781db9e6a37c09ac8529069cf69a490c854308efb40|"
              "70aad0180f9c0ac4bd007ce33d445364473c65dcfcdb2b32d1cd3daef4dcf42e44");
        alice.subject.clear(); // no certificate and no scope header: anonymous
        CHECK(pinned_facts(cert, alice) ==
              "e9984b72ac5deaacf69079ef9cbe86d5e2dad18a164980890a7c0d1ace6eece4|"
              "7e3dc103a9b8a042e5ce9781db9e6a37c09ac8529069cf69a490c854308efb40|"
              "613139322e302e322e37");

        auto hidden = p;
        hidden.key.forward = false;
        hidden.scope_headers = {"Idempotency-Key", "X-Tenant", "Authorization"};
        hidden.fingerprint_headers = {"Content-Type", "Idempotency-Key", "X-Tenant"};
        test_request tenant = r;
        tenant.headers.emplace_back("x-tenant", "t1");
        tenant.headers.emplace_back("X-TENANT", "t2");
        CHECK(pinned_facts(hidden, tenant) ==
              "c4b58932f005297a527be0de154bf28890510521f4bdcd427a08c9739956ed1d|"
              "f09220a63d145e05c3493de7c22feeb464bc7a15505a6b5d28a81829a80d38d8|"
              "706c4ca2efb4c566939f1f974ace3c81ae952c85b8826a47b70ba074af083366e5");

        auto natural = p;
        natural.key.json_pointer = "/id";
        test_request order;
        order.headers = {{"Content-Type", "application/json"}, {"Idempotency-Key", "ignored"}};
        CHECK(pinned_facts(natural, order) ==
              "cfcaea016d8af489f1a3a273262586f30b4ef211feb6acd4fd72e32c0c832ad4|"
              "65fe1a22a399ea4c663a6787de653a72e9266a02c28d3c7c2a5f63bc3992a913|"
              "613139322e302e322e37");
    }
}
