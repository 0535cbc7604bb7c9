#include <onceproxy/core/fingerprint.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

namespace core = onceproxy::core;
using core::fingerprint_input;
using core::header_view;

namespace {

fingerprint_input json_post(std::string_view body) {
    fingerprint_input in;
    in.method = "POST";
    in.target = "/v1/payments?x=1";
    in.headers = {{"content-type", "application/json"}};
    in.content_type = "application/json";
    in.body = body;
    in.json_canonical = true;
    return in;
}

std::string fp(const fingerprint_input& in) {
    return core::compute_fingerprint(in);
}

} // namespace

TEST_CASE("sha256 and hex against FIPS 180-2 values") {
    CHECK(core::to_hex(core::sha256("abc")) ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(core::to_hex(core::sha256("")) ==
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(core::sha256("abc").size() == 32);
    CHECK(core::to_hex(std::string("\x00\xff\x10", 3)) == "00ff10");
}

TEST_CASE("JSON media types") {
    CHECK(core::is_json_media_type("application/json"));
    CHECK(core::is_json_media_type("Application/JSON; charset=utf-8"));
    CHECK(core::is_json_media_type(" application/problem+json"));
    CHECK(core::is_json_media_type("application/vnd.api+json;v=2"));
    CHECK_FALSE(core::is_json_media_type("text/plain"));
    CHECK_FALSE(core::is_json_media_type("application/jsonx"));
    CHECK_FALSE(core::is_json_media_type("application/+json"));
    CHECK_FALSE(core::is_json_media_type("text/json"));
    CHECK_FALSE(core::is_json_media_type(""));
}

TEST_CASE("the same JSON serialised differently has the same fingerprint") {
    const auto a = fp(json_post(R"({"amount":1000,"currency":"eur","meta":{"b":1.0,"a":[1e2]}})"));
    const auto b =
        fp(json_post("{\n  \"meta\": {\"a\": [100], \"b\": 1},\n  \"currency\": \"\\u0065ur\",\n  "
                     "\"amount\": 1000.0\n}\n"));
    CHECK(a.size() == 32);
    CHECK(a == b);
    CHECK(a == fp(json_post(R"({"amount":1000,"currency":"eur","meta":{"b":1.0,"a":[1e2]}})")));

    auto plus_json = json_post(R"({"a": 1})");
    plus_json.content_type = "application/merge-patch+json";
    auto compact = json_post(R"({"a":1})");
    compact.content_type = "application/merge-patch+json";
    CHECK(fp(plus_json) == fp(compact));
}

TEST_CASE("different requests have different fingerprints") {
    const auto base_in = json_post(R"({"amount":1000})");
    const auto base = fp(base_in);
    std::set<std::string> seen{base};
    const auto add_distinct = [&](const fingerprint_input& in, const char* what) {
        CHECK_MESSAGE(seen.insert(fp(in)).second, what);
    };

    add_distinct(json_post(R"({"amount":1001})"), "body");
    add_distinct(json_post(R"({"amount":9007199254740993})"), "body beyond 2^53");
    add_distinct(json_post(R"({"amount":9007199254740992})"), "body at 2^53");
    add_distinct(json_post(R"({"amount":0.30000000000000001})"), "17 digits");
    add_distinct(json_post(R"({"amount":0.3})"), "the 17-digit value rounded");
    auto in = base_in;
    in.method = "PATCH";
    add_distinct(in, "method");
    in = base_in;
    in.target = "/v1/payments?x=2";
    add_distinct(in, "query");
    in = base_in;
    in.target = "/v1/orders/2/refunds";
    add_distinct(in, "path");
    in = base_in;
    in.headers = {{"content-type", "application/json; charset=utf-8"}};
    add_distinct(in, "header value");
    in = base_in;
    in.headers = {};
    add_distinct(in, "header absent");
    in = base_in;
    in.headers = {{"content-type", ""}};
    add_distinct(in, "header empty");
    in = base_in;
    in.headers = {{"content-type", "application/json"}, {"x-tenant", "a"}};
    add_distinct(in, "extra header");
    in = base_in;
    in.headers = {{"content-type", "application/json"}, {"x-tenant", "b"}};
    add_distinct(in, "extra header value");
    in = base_in;
    in.json_canonical = false;
    add_distinct(in, "raw body bytes instead of the canonical form");

    // Header names are case-insensitive.
    in = base_in;
    in.headers = {{"Content-Type", "application/json"}};
    CHECK(fp(in) == base);
}

TEST_CASE("no collision by concatenation of fields") {
    fingerprint_input a;
    a.method = "POST";
    a.target = "/ab";
    a.content_type = "text/plain";
    a.body = "c";
    fingerprint_input b = a;
    b.target = "/a";
    b.body = "bc";
    CHECK(fp(a) != fp(b));

    fingerprint_input h1 = a;
    h1.headers = {{"x-a", "bc"}};
    fingerprint_input h2 = a;
    h2.headers = {{"x-ab", "c"}};
    CHECK(fp(h1) != fp(h2));
    CHECK(core::principal_hash(std::vector<header_view>{{"x-a", "bc"}}) !=
          core::principal_hash(std::vector<header_view>{{"x-ab", "c"}}));
}

TEST_CASE("an empty field hashes the same whether its view has bytes behind it or none") {
    // A client_cert route without a subject (the keys API asked without a principal) hashes a
    // default-constructed view: no data pointer at all.
    const std::string empty;
    CHECK(core::principal_hash(
              std::vector<header_view>{{":client-certificate", std::string_view()}}) ==
          core::principal_hash(std::vector<header_view>{{":client-certificate", empty}}));
    fingerprint_input none = json_post(std::string_view());
    fingerprint_input some = json_post(empty);
    CHECK(fp(none) == fp(some));
}

TEST_CASE("invalid or non-JSON bodies are hashed raw, never an error") {
    for (const std::string_view body : {"{not json", "", "\xff\xfe", "{\"a\":1,\"a\":2}"}) {
        auto in = json_post(body);
        const auto f = fp(in);
        CHECK(f.size() == 32);
        in.json_canonical = false;
        CHECK_MESSAGE(f == fp(in), "raw hashing of: ", body);
    }
    // Whitespace matters for raw bodies.
    auto text = json_post(R"({"a":1})");
    text.content_type = "text/plain";
    auto spaced = json_post(R"({"a": 1})");
    spaced.content_type = "text/plain";
    CHECK(fp(text) != fp(spaced));
}

TEST_CASE("principal hash and store key") {
    const std::vector<header_view> alice{{"authorization", "Bearer alice"}};
    const std::vector<header_view> bob{{"authorization", "Bearer bob"}};
    const auto p_alice = core::principal_hash(alice);
    const auto p_bob = core::principal_hash(bob);
    CHECK(p_alice.size() == 32);
    CHECK(p_alice != p_bob);
    CHECK(p_alice ==
          core::principal_hash(std::vector<header_view>{{"Authorization", "Bearer alice"}}));
    CHECK(core::principal_hash({}) != p_alice);
    CHECK(core::principal_hash({}) == core::principal_hash({}));

    const std::string key = "order-8e03978e-secret";
    const auto k = core::store_key("onceproxy:", "payments", p_alice, key);
    CHECK(k.starts_with("onceproxy:"));
    CHECK(k.size() == std::string("onceproxy:").size() + 64);
    CHECK(k.find(key) == std::string::npos);
    CHECK(k.find("alice") == std::string::npos);
    CHECK(k.find("payments") == std::string::npos);
    CHECK(k == core::store_key("onceproxy:", "payments", p_alice, key));

    std::set<std::string> keys{k};
    CHECK(keys.insert(core::store_key("onceproxy:", "orders", p_alice, key)).second);
    CHECK(keys.insert(core::store_key("onceproxy:", "payments", p_bob, key)).second);
    CHECK(keys.insert(core::store_key("onceproxy:", "payments", p_alice, key + "x")).second);
    CHECK(keys.insert(core::store_key("other:", "payments", p_alice, key)).second);
    // Field boundaries are part of the hash.
    CHECK(core::store_key("", "ab", "c", "d") != core::store_key("", "a", "bc", "d"));
}

TEST_CASE("hashes stay the same from one version to the next (stored keys and fingerprints)") {
    // Store keys and fingerprints are kept in the store: a replica of another version must
    // derive the same ones, or a retry during a rolling upgrade would miss its record.
    const std::string big(3000, 'b');
    const std::vector<header_view> scope{{"Authorization", "Bearer alice"}, {"X-Tenant", "t1"}};
    const std::string principal = core::principal_hash(scope);
    CHECK(core::to_hex(principal) ==
          "c0c8adbdbe0b38d0cd9cd68dcfac8c22168fa5f5d1a48e6f9a722c00dd018b91");
    CHECK(core::to_hex(core::principal_hash({})) ==
          "17efeaa5de39700f723c187f98ec9cc546a0760b7e25ff5256e81885c1c41f39");
    CHECK(core::store_key("op:", "payments", principal, "key-1") ==
          "op:faee93a5235f73e6e7e1a95b0d9695aef57a5829892e3f443fc843c4441e0238");
    core::fingerprint_input small;
    small.method = "POST";
    small.target = "/pay?x=1";
    small.headers = {{"Content-Type", "application/json"}, {"X-Tenant", "t1"}};
    small.content_type = "application/json";
    small.body = R"({"b":1,"a":[true,null]})";
    CHECK(core::to_hex(core::compute_fingerprint(small)) ==
          "7df0977e78ec2be79163447882cbeb85c5591295f25968d4beff6c8ed11e5e5e");
    core::fingerprint_input large = small;
    large.content_type = "text/plain";
    large.body = big;
    CHECK(core::to_hex(core::compute_fingerprint(large)) ==
          "bdded4880ae8c35aacd5339faf86cac6c98ff074ded6cb94d171523d13376012");
}

TEST_CASE("fields longer than the hashing buffer hash as the encoding says") {
    // sha256 of: field("onceproxy fingerprint v1"), field(method), field(target), the header
    // count as 8 bytes, each header as field(lower-case name) and field(value), field("raw"),
    // field(body); field = 8-byte big-endian length and the bytes.
    std::string long_name = "X-";
    for (int i = 0; i < 300; ++i) {
        long_name += "Abc";
    }
    const std::string long_value(700, 'v');
    const std::string body(511, 'x');
    fingerprint_input in;
    in.method = "PUT";
    in.target = "/t";
    in.headers = {{"X-Short", "s"}, {long_name, long_value}, {"Content-Type", "text/plain"}};
    in.content_type = "text/plain";
    in.body = body;
    CHECK(core::to_hex(fp(in)) ==
          "c01f0bb46ddbe2648c37d4cee69fdb6f18c0bc71a93e638c4333d54df8f553e6");
}
