#include <onceproxy/core/request_facts.hpp>

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

    core::request_view view() const { return {method, target, headers, body, subject}; }
};

core::derived_request derive(const config::idempotency_config& p, const test_request& r,
                             std::string_view route = "payments") {
    return core::derive_request_facts(p, route, r.view());
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
}
