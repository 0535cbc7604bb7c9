// The idempotency engine driven from outside (SPEC §1-§3): the real onceproxy binary with the
// embedded memory store, in front of the real test upstream, over loopback sockets. Every
// assertion is something a client or the upstream observes: statuses, problem codes, headers,
// body bytes, and how many times the upstream executed a request.
//
// Most cases share one upstream and one proxy whose config has a route per policy (starting the
// binaries under sanitizers is the slow part); cases that need a different store or a missing
// upstream start their own proxy. Every key is unique to its case.

#include "support/http_client.hpp"
#include "support/http_date.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// Two upstream entries pointing at the same test upstream: `app` for normal calls and `short`
// for the cases that need the upstream timeout to fire quickly (its routes lease for 1s, as
// config validation wants the lease to outlive the upstream timeout).
const char* const shared_config = R"(listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
workers: 2
access_log: false
upstreams:
  app:
    url: http://127.0.0.1:{UPSTREAM_PORT}
    timeout: 2s
  short:
    url: http://127.0.0.1:{UPSTREAM_PORT}
    timeout: 300ms
store:
  type: memory
defaults:
  ttl: 1h
  lease: 3s
routes:
  - name: payments
    match: { path: /v1/payments }
    upstream: app
    idempotency: { mode: required }
  - name: mismatch409
    match: { path: /v1/mismatch409 }
    upstream: app
    idempotency: { mode: required, mismatch_status: 409 }
  - name: stripe
    match: { path: /v1/stripe }
    upstream: app
    idempotency: { mode: required, stripe_compat: true }
  - name: waiters
    match: { path: /v1/wait }
    upstream: app
    idempotency: { mode: required, concurrent: wait, wait_timeout: 5s }
  - name: short_ttl
    match: { path: /v1/ttl }
    upstream: app
    idempotency: { mode: required, ttl: 1s }
  - name: small_records
    match: { path: /v1/small }
    upstream: app
    idempotency: { mode: required, max_record_bytes: 1KiB }
  - name: uncertain_fail
    match: { path: /v1/fail }
    upstream: app
    idempotency: { mode: required, on_upstream_uncertain: fail }
  - name: uncertain_release
    match: { path: /v1/release }
    upstream: app
    idempotency: { mode: required, on_upstream_uncertain: release }
  - name: uncertain_hold
    match: { path: /v1/hold }
    upstream: short
    idempotency: { mode: required, on_upstream_uncertain: hold, lease: 1s }
  - name: timeouts
    match: { path: /v1/timeout }
    upstream: short
    idempotency: { mode: required, lease: 1s }
  - name: webhooks
    match: { methods: [POST], prefix: /webhooks/ }
    upstream: app
    idempotency: { mode: required, key: { json_pointer: /id } }
  - name: optional
    match: { path: /v1/optional }
    upstream: app
    idempotency: { mode: optional }
  - name: orders
    match: { methods: [POST], template: "/v1/orders/{id}/refunds" }
    upstream: app
    idempotency: { mode: required }
  - name: metered
    match: { path: /v1/metered }
    upstream: app
    idempotency: { mode: required }
  - name: wait_short
    match: { path: /v1/wait-short }
    upstream: app
    idempotency: { mode: required, concurrent: wait, wait_timeout: 300ms }
  - name: wait_small
    match: { path: /v1/wait-small }
    upstream: app
    idempotency: { mode: required, concurrent: wait, max_record_bytes: 1KiB }
  - name: strict
    match: { path: /v1/strict }
    upstream: app
    idempotency: { mode: required, key: { syntax: strict } }
  - name: cookies
    match: { path: /v1/cookies }
    upstream: app
    idempotency: { mode: required, exclude_headers: [Set-Cookie] }
  - name: everything-else
    match: { prefix: / }
    upstream: app
)";

/// The upstream and the proxy most cases share; started on first use, killed at exit.
struct shared_setup {
    upstream_process upstream;
    proxy_process proxy;
    shared_setup() : upstream(2), proxy(shared_config, upstream.port) {}
};

shared_setup& shared() {
    static shared_setup s;
    return s;
}

/// A key no other case (or run) uses.
std::string unique_key(const std::string& name) {
    return onceproxy::test::unique_key("it", name);
}

boost::json::value parse_json(const std::string& body) {
    boost::system::error_code ec;
    auto v = boost::json::parse(body, ec);
    if (ec) {
        throw std::runtime_error("not JSON: " + body);
    }
    return v;
}

/// The string member `name` of a JSON object body ("" when absent or not a string).
std::string json_member(const std::string& body, const char* name) {
    const auto v = parse_json(body);
    if (!v.is_object()) {
        return {};
    }
    const auto* m = v.as_object().if_contains(name);
    return m && m->is_string() ? std::string(m->as_string()) : std::string();
}

/// What the test upstream put in its answer: its unique execution id.
std::string execution_id(const http_response& r) {
    return json_member(r.body, "execution_id");
}

/// A problem document (RFC 9457) with `status` and the stable `code` (SPEC §3.2).
void check_problem(const http_response& r, unsigned status, const std::string& code) {
    INFO("body: " << r.body);
    CHECK(r.status == status);
    CHECK(r.header("Content-Type") == "application/problem+json");
    const auto v = parse_json(r.body);
    REQUIRE(v.is_object());
    const auto& o = v.as_object();
    REQUIRE(o.if_contains("code"));
    CHECK(o.at("code").as_string() == code.c_str());
    REQUIRE(o.if_contains("status"));
    CHECK(o.at("status").to_number<unsigned>() == status);
    CHECK(o.if_contains("type"));
    CHECK(o.if_contains("title"));
    CHECK(o.if_contains("detail"));
}

/// A Retry-After header with a positive number of seconds.
void check_retry_after(const http_response& r) {
    const auto v = r.header("Retry-After");
    INFO("Retry-After: '" << v << "'");
    REQUIRE_FALSE(v.empty());
    CHECK(std::stoul(v) >= 1);
}

header_list with_key(const std::string& key, header_list extra = {}) {
    extra.emplace_back("Idempotency-Key", key);
    return extra;
}

const std::string order_body = R"({"amount":1000,"currency":"eur"})";

http_response post(unsigned short port, const std::string& path, const std::string& key,
                   header_list extra = {}, const std::string& body = order_body) {
    extra.emplace_back("Content-Type", "application/json");
    return fetch(port, "POST", path, with_key(key, std::move(extra)), body);
}

/// post(), once the first attempt's record has landed: an answer over max_record_bytes reaches
/// its caller before its record is written (README), so a retry sent the moment the first answer
/// ended may still get 409 in_progress. Retries while it does, bounded.
http_response post_after_record(unsigned short port, const std::string& path,
                                const std::string& key, header_list extra = {}) {
    http_response r;
    eventually(
        [&] {
            r = post(port, path, key, extra);
            return r.status != 409 ||
                   r.body.find("\"code\":\"idempotency.in_progress\"") == std::string::npos;
        },
        std::chrono::seconds(5));
    return r;
}

/// Executions counted by a test upstream on `port` for Idempotency-Key `key`.
std::uint64_t count_at(unsigned short port, const std::string& key) {
    std::string q;
    for (const char c : key) {
        const auto u = static_cast<unsigned char>(c);
        if (std::isalnum(u) || c == '-' || c == '_') {
            q += c;
        } else {
            static constexpr char hex[] = "0123456789ABCDEF";
            q += '%';
            q += hex[u >> 4];
            q += hex[u & 0xf];
        }
    }
    const auto r = fetch(port, "GET", "/__count?key=" + q);
    REQUIRE(r.status == 200);
    return parse_json(r.body).as_object().at("count").to_number<std::uint64_t>();
}

/// The counter `onceproxy_requests_total{route,outcome}` from the admin /metrics text (-1 when
/// the line is missing).
long long requests_total(const proxy_process& proxy, const std::string& route,
                         const std::string& outcome) {
    const auto r = proxy.admin("/metrics");
    REQUIRE(r.status == 200);
    const std::string needle =
        "onceproxy_requests_total{route=\"" + route + "\",outcome=\"" + outcome + "\"} ";
    const auto pos = r.body.find(needle);
    if (pos == std::string::npos) {
        return -1;
    }
    return std::stoll(r.body.substr(pos + needle.size()));
}

/// Sends `bytes` on `n` fresh connections, all written before any answer is read, then reads
/// every answer (bounded).
std::vector<std::optional<http_response>> burst(unsigned short port, const std::string& bytes,
                                                std::size_t n) {
    std::vector<std::unique_ptr<http_client>> clients;
    clients.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        clients.push_back(std::make_unique<http_client>(port));
    }
    for (auto& c : clients) {
        c->send_raw(bytes);
    }
    std::vector<std::optional<http_response>> out;
    for (auto& c : clients) {
        out.push_back(c->read_response(15s));
    }
    return out;
}

/// Headers the proxy regenerates or adds per answer; everything else must replay as recorded.
bool per_answer_header(const std::string& name) {
    static const std::set<std::string> names{"date", "idempotency-status", "connection",
                                             "keep-alive", "content-length"};
    std::string lower;
    for (const char c : name) {
        lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return names.count(lower) != 0;
}

} // namespace

TEST_SUITE("idempotency") {

    // --- SPEC §3.2: the errors the engine produces
    // ------------------------------------------------

    TEST_CASE("a required route without a key answers 400 idempotency.missing_key, nothing runs") {
        auto& s = shared();
        const auto before = s.upstream.total();
        const auto r = fetch(s.proxy.port, "POST", "/v1/payments",
                             {{"Content-Type", "application/json"}}, order_body);
        check_problem(r, 400, "idempotency.missing_key");
        CHECK_FALSE(r.has_header("Idempotency-Status"));
        CHECK(s.upstream.total() == before);
    }

    TEST_CASE("malformed keys answer 400 idempotency.invalid_key and never reach the upstream") {
        auto& s = shared();
        const auto before = s.upstream.total();
        const auto invalid = [&](const header_list& headers) {
            auto h = headers;
            h.emplace_back("Content-Type", "application/json");
            const auto r = fetch(s.proxy.port, "POST", "/v1/payments", h, order_body);
            check_problem(r, 400, "idempotency.invalid_key");
        };
        SUBCASE("a list, not a key") {
            invalid({{"Idempotency-Key", "a, b"}});
        }
        SUBCASE("an empty sf-string") {
            invalid({{"Idempotency-Key", "\"\""}});
        }
        SUBCASE("an empty value") {
            invalid({{"Idempotency-Key", ""}});
        }
        SUBCASE("longer than max_length (255)") {
            invalid({{"Idempotency-Key", std::string(256, 'k')}});
        }
        SUBCASE("a control character (TAB) inside") {
            invalid({{"Idempotency-Key", "ab\tcd"}});
        }
        SUBCASE("a non-ASCII byte") {
            invalid({{"Idempotency-Key", "caf\xc3\xa9"}});
        }
        SUBCASE("a bare token with a quote") {
            invalid({{"Idempotency-Key", "ab\"cd"}});
        }
        SUBCASE("two header lines, even with the same value") {
            const auto k = unique_key("repeated");
            invalid({{"Idempotency-Key", k}, {"Idempotency-Key", k}});
        }
        CHECK(s.upstream.total() == before);
    }

    TEST_CASE("a key at exactly max_length (255) is accepted") {
        auto& s = shared();
        std::string key = unique_key("long");
        key.resize(255, 'x');
        const auto r = post(s.proxy.port, "/v1/payments", key);
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Status") == "stored");
    }

    TEST_CASE(
        "same key, different payload: 422 idempotency.payload_mismatch, no second execution") {
        auto& s = shared();
        const auto key = unique_key("mismatch");
        const auto first = post(s.proxy.port, "/v1/payments", key);
        REQUIRE(first.status == 200);
        const auto r =
            post(s.proxy.port, "/v1/payments", key, {}, R"({"amount":1001,"currency":"eur"})");
        check_problem(r, 422, "idempotency.payload_mismatch");
        CHECK(s.upstream.count(key) == 1);
        // The record is untouched: the original request still replays.
        const auto again = post(s.proxy.port, "/v1/payments", key);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(again.body == first.body);
    }

    TEST_CASE("mismatch_status: 409 answers a payload mismatch with 409") {
        auto& s = shared();
        const auto key = unique_key("mismatch409");
        REQUIRE(post(s.proxy.port, "/v1/mismatch409", key).status == 200);
        const auto r = post(s.proxy.port, "/v1/mismatch409", key, {}, R"({"amount":1})");
        check_problem(r, 409, "idempotency.payload_mismatch");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE(
        "a duplicate while the first is in flight: 409 idempotency.in_progress + Retry-After") {
        auto& s = shared();
        const auto key = unique_key("in-progress");
        http_client slow(s.proxy.port);
        slow.send_raw(make_request(
            "POST", "/v1/payments",
            with_key(key, {{"Content-Type", "application/json"}, {"X-Test-Delay-Ms", "700"}}),
            order_body));
        wait_until([&] { return s.upstream.count(key) == 1; }, 5s, "the upstream has the first");
        const auto dup = post(s.proxy.port, "/v1/payments", key);
        check_problem(dup, 409, "idempotency.in_progress");
        check_retry_after(dup);
        // Retry-After is the remaining lease (3s on this route), rounded up.
        CHECK(std::stoul(dup.header("Retry-After")) <= 3);
        CHECK_FALSE(dup.has_header("Idempotency-Status"));

        const auto first = slow.read_response(5s);
        REQUIRE(first);
        CHECK(first->status == 200);
        CHECK(first->header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("an answer slower than lease/3: the lease is extended while it is awaited; the "
              "answer is stored once and replayed") {
        // The call pauses at the engine's wake-up (lease/3 = 1s here), the lease is extended,
        // and the same call goes on reading: the upstream runs the request once.
        auto& s = shared();
        const auto key = unique_key("slower-than-renewal");
        const std::string ops = R"(onceproxy_store_duration_seconds_count{route="payments"})";
        const auto ops_before = s.proxy.metric(ops);
        const auto start = clock_type::now();
        const auto first = post(s.proxy.port, "/v1/payments", key, {{"X-Test-Delay-Ms", "1500"}});
        CHECK(clock_type::now() - start >= 1500ms);
        CHECK(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        // Claim, one extension at 1s, completion.
        CHECK(s.proxy.metric(ops) == ops_before + 3);
        const auto retry = post(s.proxy.port, "/v1/payments", key);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(retry.body == first.body);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("a full memory store answers 503 idempotency.store_unavailable + Retry-After") {
        auto& s = shared();
        proxy_config c;
        c.upstream_port = s.upstream.port;
        c.store = {"type: memory", "memory:", "  max_bytes: 2KiB", "  max_bytes_per_holder: 2KiB"};
        c.routes = "  - name: tiny\n    match: { path: /v1/tiny }\n    upstream: app\n"
                   "    idempotency: { mode: required }\n";
        proxy_process proxy(c.yaml());

        // Each in-flight lease costs a few hundred bytes: a dozen slow requests cannot all hold
        // one.
        std::vector<std::unique_ptr<http_client>> clients;
        std::vector<std::string> keys;
        for (int i = 0; i < 12; ++i) {
            keys.push_back(unique_key("tiny"));
            clients.push_back(std::make_unique<http_client>(proxy.port));
            clients.back()->send_raw(
                make_request("POST", "/v1/tiny",
                             with_key(keys.back(), {{"Content-Type", "application/json"},
                                                    {"X-Test-Delay-Ms", "600"}}),
                             order_body));
        }
        int refused = 0;
        int executed = 0;
        std::vector<std::string> executed_keys;
        for (std::size_t i = 0; i < clients.size(); ++i) {
            const auto r = clients[i]->read_response(10s);
            INFO("request " << i << "; proxy log:\n" << proxy.log());
            REQUIRE(r);
            if (r->status == 503) {
                ++refused;
                check_problem(*r, 503, "idempotency.store_unavailable");
                check_retry_after(*r);
                // Refused before anything was sent: the upstream never saw it.
                CHECK(s.upstream.count(keys[i]) == 0);
            } else {
                CHECK(r->status == 200);
                // The store may have had no room for the record either: the effect happened
                // and the client learns it, marked unrecorded (SPEC §1.5).
                const auto st = r->header("Idempotency-Status");
                CHECK((st == "stored" || st == "unrecorded"));
                ++executed;
                executed_keys.push_back(keys[i]);
            }
        }
        CHECK(refused > 0);
        CHECK(executed > 0);
        // An executed key never runs again: its retry replays, or still meets the lease (or a
        // store with no room left), but the upstream count stays at one.
        for (const auto& k : executed_keys) {
            const auto r = post(proxy.port, "/v1/tiny", k);
            INFO("retry answered " << r.status << " " << r.header("Idempotency-Status") << " "
                                   << r.body);
            CHECK((r.header("Idempotency-Status") == "replayed" || r.status == 409 ||
                   r.status == 503));
            CHECK(s.upstream.count(k) == 1);
        }
    }

    TEST_CASE("one client answered 400 again and again cannot fill the memory store for others") {
        auto& s = shared();
        proxy_config c;
        c.upstream_port = s.upstream.port;
        // Room for about 90 records of 700 bytes; one holder may keep 1/16 of it (the default).
        c.store = {"type: memory", "memory:", "  max_bytes: 64KiB"};
        c.routes = "  - name: small\n    match: { path: /v1/small }\n    upstream: app\n"
                   "    idempotency: { mode: required }\n";
        proxy_process proxy(c.yaml());

        // 300 requests answered 400, anonymous or each by another principal (`principals`).
        const auto fill = [&](bool principals, const std::string& tag) {
            http_client client(proxy.port);
            for (int i = 0; i < 300; ++i) {
                header_list h;
                if (principals) {
                    h.emplace_back("Authorization", "Bearer filler-" + std::to_string(i));
                }
                h.emplace_back("X-Test-Status", "400");
                h.emplace_back("Content-Type", "application/json");
                const auto r = client.request("POST", "/v1/small",
                                              with_key(unique_key(tag), std::move(h)), order_body);
                INFO("request " << i << ": " << r.status << " " << r.body);
                REQUIRE(r.status == 400);
                REQUIRE(r.header("Idempotency-Status") == "stored");
            }
        };
        const auto stores_and_replays = [&](const std::string& who) {
            const auto key = unique_key("small-ok");
            const header_list auth{{"Authorization", "Bearer " + who}};
            const auto first = post(proxy.port, "/v1/small", key, auth);
            INFO("first: " << first.status << " " << first.body << "; proxy log:\n" << proxy.log());
            CHECK(first.status == 200);
            CHECK(first.header("Idempotency-Status") == "stored");
            const auto again = post(proxy.port, "/v1/small", key, auth);
            CHECK(again.status == 200);
            CHECK(again.header("Idempotency-Status") == "replayed");
            CHECK(s.upstream.count(key) == 1);
        };

        SUBCASE("an anonymous client: its own oldest 400 records make room for its next") {
            fill(false, "small-anon");
            stores_and_replays("someone-else");
        }
        SUBCASE("as many principals: the full store evicts the oldest 400 records") {
            fill(true, "small-p");
            stores_and_replays("late-comer");
        }
    }

    TEST_CASE("a holder whose 2xx records reach its bound is refused alone") {
        auto& s = shared();
        proxy_config c;
        c.upstream_port = s.upstream.port;
        c.store = {"type: memory", "memory:", "  max_bytes: 64KiB", "  max_bytes_per_holder: 4KiB"};
        c.routes = "  - name: small\n    match: { path: /v1/small }\n    upstream: app\n"
                   "    idempotency: { mode: required }\n";
        proxy_process proxy(c.yaml());
        const header_list heavy{{"Authorization", "Bearer heavy"}};
        int stored = 0;
        std::optional<http_response> refused;
        for (int i = 0; i < 50 && !refused; ++i) {
            const auto key = unique_key("small-heavy");
            auto r = post(proxy.port, "/v1/small", key, heavy);
            if (r.status == 503) {
                refused = std::move(r);
                CHECK(s.upstream.count(key) == 0);
            } else {
                REQUIRE(r.status == 200);
                CHECK(r.header("Idempotency-Status") == "stored");
                ++stored;
            }
        }
        REQUIRE(refused);
        check_problem(*refused, 503, "idempotency.store_unavailable");
        // 4KiB hold a few records of under 1KiB; none of them was evicted for the next.
        CHECK(stored >= 2);
        // Another caller is not affected.
        const auto key = unique_key("small-light");
        const header_list light{{"Authorization", "Bearer light"}};
        const auto r = post(proxy.port, "/v1/small", key, light);
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Status") == "stored");
        const auto metrics = fetch(proxy.admin_port, "GET", "/metrics");
        CHECK(metrics.body.find("onceproxy_store_errors_total{cause=\"holder_full\"} 1") !=
              std::string::npos);
    }

    TEST_CASE("upstream unreachable: 502 upstream.unavailable, and the key is not consumed") {
        // The upstream's port is chosen up front and nothing listens there yet.
        const auto port = free_port();
        proxy_config c;
        c.routes = "  - name: pay\n    match: { path: /v1/pay }\n    upstream: app\n"
                   "    idempotency: { mode: required }\n";
        proxy_process proxy(c.yaml(), port);
        const auto key = unique_key("unreachable");
        const auto r = post(proxy.port, "/v1/pay", key);
        check_problem(r, 502, "upstream.unavailable");
        CHECK_FALSE(r.has_header("Idempotency-Status"));

        temp_dir dir;
        process upstream({TEST_UPSTREAM_BIN, "--listen", "127.0.0.1:" + std::to_string(port),
                          "--port-file", dir.file("port")},
                         dir.file("upstream.log"));
        REQUIRE_FALSE(wait_for_file(dir.file("port"), 10s).empty());

        const auto retry = post(proxy.port, "/v1/pay", key);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "stored");
        CHECK(count_at(port, key) == 1);
        const auto replay = post(proxy.port, "/v1/pay", key);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == retry.body);
        CHECK(count_at(port, key) == 1);
    }

    TEST_CASE("upstream too slow: 504 upstream.timeout") {
        auto& s = shared();
        const auto key = unique_key("timeout");
        const auto r = post(s.proxy.port, "/v1/timeout", key, {{"X-Test-Delay-Ms", "1500"}});
        check_problem(r, 504, "upstream.timeout");
        CHECK_FALSE(r.has_header("Idempotency-Status"));
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("a response over max_record_bytes reaches the first caller; retries get 409 "
              "idempotency.response_not_replayable, never a second execution") {
        auto& s = shared();
        const auto key = unique_key("too-big");
        const auto first = post(s.proxy.port, "/v1/small", key, {{"X-Test-Body-Bytes", "4096"}});
        CHECK(first.status == 200);
        REQUIRE(first.body.size() == 4096);
        for (std::size_t i = 0; i < first.body.size(); ++i) {
            if (first.body[i] != static_cast<char>('a' + i % 26)) {
                FAIL("body byte " << i << " differs");
            }
        }
        const auto retry =
            post_after_record(s.proxy.port, "/v1/small", key, {{"X-Test-Body-Bytes", "4096"}});
        check_problem(retry, 409, "idempotency.response_not_replayable");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("on_upstream_uncertain: fail records 502 upstream.outcome_unknown and replays it") {
        auto& s = shared();
        const auto key = unique_key("fail");
        const auto first = post(s.proxy.port, "/v1/fail", key, {{"X-Test-Drop", "1"}});
        check_problem(first, 502, "upstream.outcome_unknown");
        CHECK(s.upstream.count(key) == 1);

        // The retry does not ask for a drop: had it been executed, it would have answered 200.
        const auto retry = post(s.proxy.port, "/v1/fail", key);
        check_problem(retry, 502, "upstream.outcome_unknown");
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(retry.body == first.body);
        CHECK(s.upstream.count(key) == 1);
    }

    // --- SPEC §3.7: what is recorded and replayed
    // -------------------------------------------------

    TEST_CASE("stored, then replayed: same status, body bytes and recorded headers, a fresh Date") {
        auto& s = shared();
        const auto key = unique_key("replay");
        const auto first = post(s.proxy.port, "/v1/payments", key,
                                {{"X-Test-Status", "201"}, {"X-Test-Header", "X-Order: ord_1"}});
        REQUIRE(first.status == 201);
        CHECK(first.header("Idempotency-Status") == "stored");
        CHECK(first.header("X-Order") == "ord_1");
        CHECK_FALSE(first.has_header("Idempotent-Replayed"));
        REQUIRE_FALSE(first.header("Date").empty());
        REQUIRE_FALSE(execution_id(first).empty());

        // Date has a one-second resolution: wait past the second of the first answer so a fresh
        // one must differ.
        wait_past_second(std::chrono::system_clock::now());
        const auto replay = post(s.proxy.port, "/v1/payments", key,
                                 {{"X-Test-Status", "201"}, {"X-Test-Header", "X-Order: ord_1"}});
        CHECK(replay.status == 201);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == first.body);
        CHECK(replay.header("Date") != first.header("Date"));
        CHECK_FALSE(replay.header("Date").empty());
        CHECK(replay.count("Idempotency-Status") == 1);
        for (const auto& [name, value] : first.headers) {
            if (per_answer_header(name)) {
                continue;
            }
            INFO("header " << name);
            CHECK(replay.count(name) == first.count(name));
            CHECK(replay.header(name) == value);
        }
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("an answer's hop-by-hop fields reach neither the client nor the record") {
        auto& s = shared();
        const auto key = unique_key("hop");
        // Keep-Alive and Proxy-* are hop-by-hop by name, X-Hop because Connection names it.
        const header_list h{{"X-Test-Status", "201"},
                            {"X-Test-Header", "Keep-Alive: timeout=99"},
                            {"X-Test-Header", "Connection: X-Hop"},
                            {"X-Test-Header", "X-Hop: secret"},
                            {"X-Test-Header", "Proxy-Note: p"},
                            {"X-Test-Header", "X-Order: ord_2"}};
        const auto first = post(s.proxy.port, "/v1/payments", key, h);
        const auto replay = post(s.proxy.port, "/v1/payments", key, h);
        for (const auto* r : {&first, &replay}) {
            CHECK(r->status == 201);
            CHECK(r->header("X-Order") == "ord_2");
            CHECK_FALSE(r->has_header("Keep-Alive"));
            CHECK_FALSE(r->has_header("X-Hop"));
            CHECK_FALSE(r->has_header("Proxy-Note"));
            CHECK(r->header("Connection").find("X-Hop") == std::string::npos);
        }
        CHECK(first.header("Idempotency-Status") == "stored");
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("Idempotency-Expires: the first answer and every replay state the record's "
              "expiry, ttl after the first request, unchanged by later replays") {
        auto& s = shared();
        const auto key = unique_key("expires");
        // The upstream's own Idempotency-Expires must not pass for the proxy's.
        const header_list extra{{"X-Test-Header", "Idempotency-Expires: Mon, 01 Jan 2001 "
                                                  "00:00:00 GMT"}};
        const auto before = std::chrono::system_clock::now();
        const auto first = post(s.proxy.port, "/v1/payments", key, extra);
        const auto after = std::chrono::system_clock::now();
        REQUIRE(first.status == 200);
        REQUIRE(first.header("Idempotency-Status") == "stored");
        CHECK(first.count("Idempotency-Expires") == 1);
        const auto expires = first.header("Idempotency-Expires");
        INFO("Idempotency-Expires: " << expires);
        const auto when = parse_imf_fixdate(expires);
        REQUIRE(when);
        // ttl (1h, the shared config's default) after the request, to the second.
        CHECK(*when >= std::chrono::floor<std::chrono::seconds>(before) + 1h);
        CHECK(*when <= after + 1h + 2s);

        const auto replay = post(s.proxy.port, "/v1/payments", key, extra);
        REQUIRE(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.header("Idempotency-Expires") == expires);
        CHECK(replay.count("Idempotency-Expires") == 1);

        // Past the next second, now + ttl would say another time: the replay keeps the record's.
        wait_past_second(std::chrono::system_clock::now());
        const auto later = post(s.proxy.port, "/v1/payments", key, extra);
        REQUIRE(later.header("Idempotency-Status") == "replayed");
        CHECK(later.header("Idempotency-Expires") == expires);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("Idempotency-Expires only where a record speaks: not on plain answers, problems "
              "or released keys; on the 409 of a record kept without its body") {
        auto& s = shared();
        // A plain (unguarded) answer, and a GET on a guarded route.
        const auto plain = fetch(s.proxy.port, "POST", "/v1/unguarded", {}, order_body);
        CHECK(plain.status == 200);
        CHECK_FALSE(plain.has_header("Idempotency-Expires"));
        const auto get = fetch(s.proxy.port, "GET", "/v1/payments");
        CHECK_FALSE(get.has_header("Idempotency-Expires"));

        // Problems: a missing key, a payload mismatch.
        const auto missing = fetch(s.proxy.port, "POST", "/v1/payments",
                                   {{"Content-Type", "application/json"}}, order_body);
        check_problem(missing, 400, "idempotency.missing_key");
        CHECK_FALSE(missing.has_header("Idempotency-Expires"));
        const auto key = unique_key("expires-mismatch");
        REQUIRE(post(s.proxy.port, "/v1/payments", key).has_header("Idempotency-Expires"));
        const auto mismatch = post(s.proxy.port, "/v1/payments", key, {}, R"({"amount":1})");
        check_problem(mismatch, 422, "idempotency.payload_mismatch");
        CHECK_FALSE(mismatch.has_header("Idempotency-Expires"));

        // A released key (upstream 503) left no record, whatever the upstream said.
        const auto released =
            post(s.proxy.port, "/v1/payments", unique_key("expires-released"),
                 {{"X-Test-Status", "503"},
                  {"X-Test-Header", "Idempotency-Expires: Mon, 01 Jan 2001 00:00:00 GMT"}});
        CHECK(released.status == 503);
        CHECK_FALSE(released.has_header("Idempotency-Expires"));

        // Too large to replay: the first answer is stored (its head says until when), and the
        // 409 tells until when the key stays consumed.
        const auto big_key = unique_key("expires-big");
        const auto big = post(s.proxy.port, "/v1/small", big_key, {{"X-Test-Body-Bytes", "4096"}});
        REQUIRE(big.status == 200);
        const auto expires = big.header("Idempotency-Expires");
        CHECK(parse_imf_fixdate(expires));
        const auto retry =
            post_after_record(s.proxy.port, "/v1/small", big_key, {{"X-Test-Body-Bytes", "4096"}});
        check_problem(retry, 409, "idempotency.response_not_replayable");
        CHECK(retry.header("Idempotency-Expires") == expires);
    }

    TEST_CASE("stripe_compat: true adds Idempotent-Replayed: true on replays only") {
        auto& s = shared();
        const auto key = unique_key("stripe");
        const auto first = post(s.proxy.port, "/v1/stripe", key);
        REQUIRE(first.status == 200);
        CHECK_FALSE(first.has_header("Idempotent-Replayed"));
        const auto replay = post(s.proxy.port, "/v1/stripe", key);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.header("Idempotent-Replayed") == "true");
        CHECK(replay.body == first.body);
    }

    TEST_CASE("the key header reaches the upstream exactly as sent") {
        auto& s = shared();
        const auto key = "\"" + unique_key("forward") + " with space\"";
        const auto r = post(s.proxy.port, "/v1/payments", key);
        REQUIRE(r.status == 200);
        CHECK(json_member(r.body, "key") == key);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("lenient syntax: a quoted sf-string key and the same bare key are one key") {
        auto& s = shared();
        const auto bare = unique_key("quoted");
        const auto first = post(s.proxy.port, "/v1/payments", "\"" + bare + "\"");
        REQUIRE(first.status == 200);
        const auto second = post(s.proxy.port, "/v1/payments", bare);
        CHECK(second.header("Idempotency-Status") == "replayed");
        CHECK(second.body == first.body);
        CHECK(s.upstream.count("\"" + bare + "\"") == 1);
        CHECK(s.upstream.count(bare) == 0);
    }

    TEST_CASE("a binary response body replays byte for byte") {
        auto& s = shared();
        const auto key = unique_key("binary");
        const header_list h{{"X-Test-Binary", "1"}, {"X-Test-Body-Bytes", "1000"}};
        const auto first = post(s.proxy.port, "/v1/payments", key, h);
        REQUIRE(first.status == 200);
        REQUIRE(first.body.size() == 1000);
        CHECK(first.body[0] == '\0');
        CHECK(first.body[255] == static_cast<char>(0xff));
        const auto replay = post(s.proxy.port, "/v1/payments", key, h);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.header("Content-Type") == "application/octet-stream");
        CHECK(replay.body == first.body);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("JSON bodies are fingerprinted canonically: reordered keys and whitespace replay") {
        auto& s = shared();
        const auto key = unique_key("canonical");
        const auto first =
            post(s.proxy.port, "/v1/payments", key, {},
                 R"({"amount":1000,"items":[1,2.0,"x"],"meta":{"a":true,"b":null}})");
        REQUIRE(first.status == 200);
        const auto second =
            post(s.proxy.port, "/v1/payments", key, {},
                 "{ \"meta\" : { \"b\" : null, \"a\" : true },\n  \"items\" : [ 1, 2.0, \"x\" ],"
                 " \"amount\" : 1000 }");
        CHECK(second.status == 200);
        CHECK(second.header("Idempotency-Status") == "replayed");
        CHECK(second.body == first.body);
        CHECK(s.upstream.count(key) == 1);
    }

    // --- SPEC §3.6: concurrent duplicates
    // ---------------------------------------------------------

    TEST_CASE("50 concurrent requests with one key (conflict): one execution, the rest 409 or "
              "identical replays") {
        auto& s = shared();
        const auto key = unique_key("burst-conflict");
        const auto answers = burst(s.proxy.port,
                                   make_request("POST", "/v1/payments",
                                                with_key(key, {{"Content-Type", "application/json"},
                                                               {"X-Test-Delay-Ms", "300"}}),
                                                order_body),
                                   50);
        std::optional<http_response> stored;
        std::vector<http_response> replays;
        int conflicts = 0;
        for (const auto& a : answers) {
            REQUIRE(a);
            if (a->header("Idempotency-Status") == "stored") {
                CHECK_FALSE(stored);
                stored = *a;
            } else if (a->header("Idempotency-Status") == "replayed") {
                replays.push_back(*a);
            } else {
                check_problem(*a, 409, "idempotency.in_progress");
                check_retry_after(*a);
                ++conflicts;
            }
        }
        REQUIRE(stored);
        CHECK(stored->status == 200);
        for (const auto& r : replays) {
            CHECK(r.status == stored->status);
            CHECK(r.body == stored->body);
        }
        CHECK(conflicts + static_cast<int>(replays.size()) == 49);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("50 concurrent requests with one key (wait): one execution, 50 identical answers") {
        auto& s = shared();
        const auto key = unique_key("burst-wait");
        const auto answers = burst(s.proxy.port,
                                   make_request("POST", "/v1/wait",
                                                with_key(key, {{"Content-Type", "application/json"},
                                                               {"X-Test-Delay-Ms", "300"}}),
                                                order_body),
                                   50);
        int stored = 0;
        int replayed = 0;
        REQUIRE(answers.front());
        const auto& reference = *answers.front();
        for (const auto& a : answers) {
            REQUIRE(a);
            CHECK(a->status == 200);
            CHECK(a->body == reference.body);
            stored += a->header("Idempotency-Status") == "stored" ? 1 : 0;
            replayed += a->header("Idempotency-Status") == "replayed" ? 1 : 0;
        }
        CHECK(stored == 1);
        CHECK(replayed == 49);
        CHECK(s.upstream.count(key) == 1);
    }

    // --- SPEC §3.3: scope
    // -------------------------------------------------------------------------

    TEST_CASE("one key under two principals: two executions, each replays its own") {
        auto& s = shared();
        const auto key = unique_key("principals");
        const auto a1 = post(s.proxy.port, "/v1/payments", key, {{"Authorization", "Bearer A"}});
        const auto b1 = post(s.proxy.port, "/v1/payments", key, {{"Authorization", "Bearer B"}});
        REQUIRE(a1.status == 200);
        REQUIRE(b1.status == 200);
        CHECK(a1.header("Idempotency-Status") == "stored");
        CHECK(b1.header("Idempotency-Status") == "stored");
        CHECK(execution_id(a1) != execution_id(b1));
        CHECK(s.upstream.count(key) == 2);

        const auto a2 = post(s.proxy.port, "/v1/payments", key, {{"Authorization", "Bearer A"}});
        const auto b2 = post(s.proxy.port, "/v1/payments", key, {{"Authorization", "Bearer B"}});
        CHECK(a2.header("Idempotency-Status") == "replayed");
        CHECK(b2.header("Idempotency-Status") == "replayed");
        CHECK(a2.body == a1.body);
        CHECK(b2.body == b1.body);
        // Without credentials it is a third scope.
        const auto anon = post(s.proxy.port, "/v1/payments", key);
        CHECK(anon.header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 3);
    }

    // --- SPEC §2: states of one key
    // ---------------------------------------------------------------

    TEST_CASE("ttl: a record replays until it expires, then the key executes again") {
        auto& s = shared();
        const auto key = unique_key("ttl");
        const auto first = post(s.proxy.port, "/v1/ttl", key);
        REQUIRE(first.status == 200);
        CHECK(post(s.proxy.port, "/v1/ttl", key).header("Idempotency-Status") == "replayed");
        // It replays until the ttl (1 s) runs out, then it executes again.
        http_response later;
        CHECK(eventually(
            [&] {
                later = post(s.proxy.port, "/v1/ttl", key);
                return later.header("Idempotency-Status") != "replayed";
            },
            5s, 50ms));
        CHECK(later.header("Idempotency-Status") == "stored");
        CHECK(execution_id(later) != execution_id(first));
        CHECK(s.upstream.count(key) == 2);
    }

    TEST_CASE("an upstream 503 releases the key: the retry executes and its answer is stored") {
        auto& s = shared();
        const auto key = unique_key("released");
        const auto first = post(s.proxy.port, "/v1/payments", key, {{"X-Test-Status", "503"}});
        CHECK(first.status == 503);
        CHECK_FALSE(first.has_header("Idempotency-Status"));
        const auto retry = post(s.proxy.port, "/v1/payments", key);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 2);
        const auto replay = post(s.proxy.port, "/v1/payments", key, {{"X-Test-Status", "503"}});
        CHECK(replay.status == 200);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == retry.body);
        CHECK(s.upstream.count(key) == 2);
    }

    TEST_CASE("hold: after an upstream drop retries get 409 until the lease lapses, then one "
              "re-execution") {
        auto& s = shared();
        const auto key = unique_key("hold");
        const auto start = clock_type::now();
        const auto first = post(s.proxy.port, "/v1/hold", key, {{"X-Test-Drop", "1"}});
        check_problem(first, 502, "upstream.unavailable");
        CHECK_FALSE(first.has_header("Idempotency-Status"));
        // The caller learns when the held key frees: the rest of the 1s lease, rounded up.
        check_retry_after(first);
        CHECK(std::stoul(first.header("Retry-After")) <= 1);
        CHECK(s.upstream.count(key) == 1);

        const auto held = post(s.proxy.port, "/v1/hold", key);
        if (clock_type::now() - start < 800ms) {
            check_problem(held, 409, "idempotency.in_progress");
            check_retry_after(held);
        }
        CHECK(s.upstream.count(key) == 1);

        std::this_thread::sleep_until(start + 1300ms); // real time is the subject: the lease lapses
        const auto retry = post(s.proxy.port, "/v1/hold", key);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 2);
        const auto replay = post(s.proxy.port, "/v1/hold", key);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == retry.body);
        CHECK(s.upstream.count(key) == 2);
    }

    TEST_CASE("on_upstream_uncertain: release frees the key at once after an upstream drop") {
        auto& s = shared();
        const auto key = unique_key("uncertain-release");
        const auto first = post(s.proxy.port, "/v1/release", key, {{"X-Test-Drop", "1"}});
        check_problem(first, 502, "upstream.unavailable");
        const auto retry = post(s.proxy.port, "/v1/release", key);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 2);
    }

    TEST_CASE(
        "a client that leaves mid-flight: the answer is still recorded and the retry replays") {
        auto& s = shared();
        const auto key = unique_key("client-gone");
        {
            http_client gone(s.proxy.port);
            gone.send_raw(make_request(
                "POST", "/v1/payments",
                with_key(key, {{"Content-Type", "application/json"}, {"X-Test-Delay-Ms", "500"}}),
                order_body));
            // The request is under way (the upstream has it) when the socket closes.
            wait_until([&] { return s.upstream.count(key) == 1; }, 5s, "the upstream has it");
        }
        const auto retry = post_after_record(s.proxy.port, "/v1/payments", key);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(key) == 1);
    }

    // --- SPEC §3.4, §3.5: natural keys and fingerprints
    // -------------------------------------------

    TEST_CASE("natural key (json_pointer /id): a redelivered event replays, a new id executes") {
        auto& s = shared();
        const auto id = unique_key("evt");
        const auto before = s.upstream.total();
        const header_list json{{"Content-Type", "application/json"}};
        const auto first = fetch(s.proxy.port, "POST", "/webhooks/stripe", json,
                                 R"({"id":")" + id + R"(","type":"charge.succeeded","n":1})");
        REQUIRE(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        const auto again =
            fetch(s.proxy.port, "POST", "/webhooks/stripe", json,
                  "{\n  \"n\": 1,\n  \"type\": \"charge.succeeded\",\n  \"id\": \"" + id + "\"\n}");
        CHECK(again.status == 200);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(again.body == first.body);
        CHECK(s.upstream.total() == before + 1);

        const auto other = fetch(s.proxy.port, "POST", "/webhooks/stripe", json,
                                 R"({"id":")" + id + R"(-2","type":"charge.succeeded","n":1})");
        CHECK(other.header("Idempotency-Status") == "stored");
        CHECK(execution_id(other) != execution_id(first));
        CHECK(s.upstream.total() == before + 2);

        const auto no_id =
            fetch(s.proxy.port, "POST", "/webhooks/stripe", json, R"({"type":"charge.succeeded"})");
        check_problem(no_id, 400, "idempotency.missing_key");
        const auto not_json = fetch(s.proxy.port, "POST", "/webhooks/stripe", json, "id=1");
        check_problem(not_json, 400, "idempotency.missing_key");
        // The same event id with other content is not a redelivery.
        const auto altered = fetch(s.proxy.port, "POST", "/webhooks/stripe", json,
                                   R"({"id":")" + id + R"(","type":"charge.refunded","n":1})");
        check_problem(altered, 422, "idempotency.payload_mismatch");
        CHECK(s.upstream.total() == before + 2);
    }

    TEST_CASE("template route: one key on /v1/orders/1/refunds and /v1/orders/2/refunds is a "
              "mismatch") {
        auto& s = shared();
        const auto key = unique_key("refund");
        const auto first = post(s.proxy.port, "/v1/orders/1/refunds", key);
        REQUIRE(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        const auto other = post(s.proxy.port, "/v1/orders/2/refunds", key);
        check_problem(other, 422, "idempotency.payload_mismatch");
        CHECK(s.upstream.count(key) == 1);
    }

    // --- SPEC §1: what is not guarded
    // -------------------------------------------------------------

    TEST_CASE("GET on a guarded route passes through untouched, every time") {
        auto& s = shared();
        const auto key = unique_key("get");
        const auto a = fetch(s.proxy.port, "GET", "/v1/payments", with_key(key));
        const auto b = fetch(s.proxy.port, "GET", "/v1/payments", with_key(key));
        CHECK(a.status == 200);
        CHECK(b.status == 200);
        CHECK_FALSE(a.has_header("Idempotency-Status"));
        CHECK_FALSE(b.has_header("Idempotency-Status"));
        CHECK(execution_id(a) != execution_id(b));
        CHECK(s.upstream.count(key) == 2);
    }

    TEST_CASE("mode: optional without a key passes through; with a key it is guarded") {
        auto& s = shared();
        const auto before = s.upstream.total();
        const header_list json{{"Content-Type", "application/json"}};
        const auto a = fetch(s.proxy.port, "POST", "/v1/optional", json, order_body);
        const auto b = fetch(s.proxy.port, "POST", "/v1/optional", json, order_body);
        CHECK(a.status == 200);
        CHECK(b.status == 200);
        CHECK_FALSE(a.has_header("Idempotency-Status"));
        CHECK_FALSE(b.has_header("Idempotency-Status"));
        CHECK(execution_id(a) != execution_id(b));
        CHECK(s.upstream.total() == before + 2);

        const auto key = unique_key("optional");
        CHECK(post(s.proxy.port, "/v1/optional", key).header("Idempotency-Status") == "stored");
        CHECK(post(s.proxy.port, "/v1/optional", key).header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("concurrent: wait gives up after wait_timeout with 409 idempotency.in_progress") {
        auto& s = shared();
        const auto key = unique_key("wait-timeout");
        http_client slow(s.proxy.port);
        slow.send_raw(make_request(
            "POST", "/v1/wait-short",
            with_key(key, {{"Content-Type", "application/json"}, {"X-Test-Delay-Ms", "1200"}}),
            order_body));
        wait_until([&] { return s.upstream.count(key) == 1; }, 5s, "the upstream has the first");
        const auto start = clock_type::now();
        const auto dup = post(s.proxy.port, "/v1/wait-short", key);
        const auto waited = clock_type::now() - start;
        check_problem(dup, 409, "idempotency.in_progress");
        check_retry_after(dup);
        CHECK(waited >= 250ms);
        CHECK(waited < 1000ms);
        const auto first = slow.read_response(5s);
        REQUIRE(first);
        CHECK(first->header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("concurrent: wait on a response too large to record: waiters get 409 "
              "idempotency.response_not_replayable") {
        auto& s = shared();
        const auto key = unique_key("wait-big");
        const auto answers = burst(s.proxy.port,
                                   make_request("POST", "/v1/wait-small",
                                                with_key(key, {{"Content-Type", "application/json"},
                                                               {"X-Test-Delay-Ms", "300"},
                                                               {"X-Test-Body-Bytes", "4096"}}),
                                                order_body),
                                   5);
        int full = 0;
        for (const auto& a : answers) {
            REQUIRE(a);
            if (a->status == 200) {
                ++full;
                CHECK(a->body.size() == 4096);
            } else {
                check_problem(*a, 409, "idempotency.response_not_replayable");
            }
        }
        CHECK(full == 1);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("key.syntax: strict takes sf-strings only") {
        auto& s = shared();
        const auto key = unique_key("strict");
        check_problem(post(s.proxy.port, "/v1/strict", key), 400, "idempotency.invalid_key");
        CHECK(s.upstream.count(key) == 0);
        const auto quoted = "\"" + key + "\"";
        CHECK(post(s.proxy.port, "/v1/strict", quoted).header("Idempotency-Status") == "stored");
        CHECK(post(s.proxy.port, "/v1/strict", quoted).header("Idempotency-Status") == "replayed");
        // An sf-string with a parameter is not a bare string (RFC 9651 §3.3.3).
        check_problem(post(s.proxy.port, "/v1/strict", quoted + ";a=1"), 400,
                      "idempotency.invalid_key");
        CHECK(s.upstream.count(quoted) == 1);
    }

    TEST_CASE("exclude_headers: Set-Cookie goes to the first caller only") {
        auto& s = shared();
        const auto key = unique_key("cookie");
        const header_list h{{"X-Test-Header", "Set-Cookie: session=secret"}};
        const auto first = post(s.proxy.port, "/v1/cookies", key, h);
        REQUIRE(first.status == 200);
        CHECK(first.header("Set-Cookie") == "session=secret");
        const auto replay = post(s.proxy.port, "/v1/cookies", key, h);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK_FALSE(replay.has_header("Set-Cookie"));
        CHECK(replay.body == first.body);
    }

    // Issue "a replay can hand one user another user's cookie": Set-Cookie stays out of the
    // record by default, and a session cookie scopes the key like Authorization does.

    TEST_CASE("default route: Set-Cookie goes to the first caller only, never into a replay") {
        auto& s = shared();
        const auto key = unique_key("default-cookie");
        const header_list h{{"X-Test-Header", "Set-Cookie: session=alice-secret"}};
        const auto first = post(s.proxy.port, "/v1/payments", key, h);
        REQUIRE(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        CHECK(first.header("Set-Cookie") == "session=alice-secret");
        const auto replay = post(s.proxy.port, "/v1/payments", key, h);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK_FALSE(replay.has_header("Set-Cookie"));
        CHECK(replay.body == first.body);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("record_set_cookie: true records and replays Set-Cookie") {
        auto& s = shared();
        proxy_config c;
        c.upstream_port = s.upstream.port;
        c.routes = "  - name: sessions\n    match: { path: /v1/sessions }\n    upstream: app\n"
                   "    idempotency: { mode: required, record_set_cookie: true }\n";
        proxy_process proxy(c.yaml());
        const auto key = unique_key("recorded-cookie");
        const header_list h{{"X-Test-Header", "Set-Cookie: session=opted-in"}};
        const auto first = post(proxy.port, "/v1/sessions", key, h);
        REQUIRE(first.status == 200);
        CHECK(first.header("Set-Cookie") == "session=opted-in");
        const auto replay = post(proxy.port, "/v1/sessions", key, h);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.header("Set-Cookie") == "session=opted-in");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("two users authenticated by cookies, one key and body: each executes once and "
              "never sees the other's answer") {
        auto& s = shared();
        const auto key = unique_key("cookie-users");
        const header_list alice{{"Cookie", "session=alice"},
                                {"X-Test-Header", "Set-Cookie: session=alice-renewed"}};
        const header_list bob{{"Cookie", "session=bob"},
                              {"X-Test-Header", "Set-Cookie: session=bob-renewed"}};
        const auto a1 = post(s.proxy.port, "/v1/payments", key, alice);
        REQUIRE(a1.status == 200);
        CHECK(a1.header("Idempotency-Status") == "stored");
        const auto b1 = post(s.proxy.port, "/v1/payments", key, bob);
        REQUIRE(b1.status == 200);
        CHECK(b1.header("Idempotency-Status") == "stored");
        CHECK(execution_id(b1) != execution_id(a1));
        CHECK(b1.header("Set-Cookie") == "session=bob-renewed");
        CHECK(s.upstream.count(key) == 2);

        const auto a2 = post(s.proxy.port, "/v1/payments", key, alice);
        const auto b2 = post(s.proxy.port, "/v1/payments", key, bob);
        CHECK(a2.header("Idempotency-Status") == "replayed");
        CHECK(b2.header("Idempotency-Status") == "replayed");
        CHECK(a2.body == a1.body);
        CHECK(b2.body == b1.body);
        CHECK(b2.body != a1.body);
        CHECK_FALSE(b2.has_header("Set-Cookie"));
        CHECK(s.upstream.count(key) == 2);
    }

    // Issue "headers nominated by Connection": a client cannot make the proxy drop the key or
    // the principal by naming them in Connection (RFC 9110 §7.6.1 lets a proxy keep them).

    TEST_CASE("Connection: Idempotency-Key, Authorization keeps the key and the scope") {
        auto& s = shared();
        const auto key = unique_key("conn-nominated");
        const auto as = [](const char* who) {
            return header_list{{"Connection", "Idempotency-Key, Authorization"},
                               {"Authorization", std::string("Bearer ") + who}};
        };
        const auto first = post(s.proxy.port, "/v1/payments", key, as("conn-a"));
        REQUIRE(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        const auto retry = post(s.proxy.port, "/v1/payments", key, as("conn-a"));
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(retry.body == first.body);
        CHECK(s.upstream.count(key) == 1);

        // Another principal with the same key is another scope: it executes on its own.
        const auto other = post(s.proxy.port, "/v1/payments", key, as("conn-b"));
        CHECK(other.header("Idempotency-Status") == "stored");
        CHECK(execution_id(other) != execution_id(first));
        CHECK(s.upstream.count(key) == 2);

        // On an optional route a dropped key would have meant an unprotected execution.
        const auto okey = unique_key("conn-optional");
        const auto o1 = post(s.proxy.port, "/v1/optional", okey, as("conn-a"));
        const auto o2 = post(s.proxy.port, "/v1/optional", okey, as("conn-a"));
        CHECK(o1.header("Idempotency-Status") == "stored");
        CHECK(o2.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(okey) == 1);
    }

    TEST_CASE("a chunked upstream response replays with the same bytes, framed anew") {
        auto& s = shared();
        const auto key = unique_key("chunked");
        const header_list h{{"X-Test-Chunked", "1"}};
        const auto first = post(s.proxy.port, "/v1/payments", key, h);
        REQUIRE(first.status == 200);
        REQUIRE_FALSE(execution_id(first).empty());
        const auto replay = post(s.proxy.port, "/v1/payments", key, h);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == first.body);
        CHECK_FALSE(replay.has_header("Transfer-Encoding"));
        CHECK(replay.header("Content-Length") == std::to_string(first.body.size()));
    }

    TEST_CASE("a 4xx answer is recorded and replayed; 429 releases the key") {
        auto& s = shared();
        const auto k404 = unique_key("404");
        const auto nf = post(s.proxy.port, "/v1/payments", k404, {{"X-Test-Status", "404"}});
        CHECK(nf.status == 404);
        CHECK(nf.header("Idempotency-Status") == "stored");
        const auto nf2 = post(s.proxy.port, "/v1/payments", k404);
        CHECK(nf2.status == 404);
        CHECK(nf2.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(k404) == 1);

        const auto k429 = unique_key("429");
        const auto busy = post(s.proxy.port, "/v1/payments", k429, {{"X-Test-Status", "429"}});
        CHECK(busy.status == 429);
        CHECK_FALSE(busy.has_header("Idempotency-Status"));
        const auto ok = post(s.proxy.port, "/v1/payments", k429);
        CHECK(ok.status == 200);
        CHECK(ok.header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(k429) == 2);
    }

    TEST_CASE("PATCH is guarded by default, PUT is not") {
        auto& s = shared();
        const auto kp = unique_key("patch");
        const header_list json{{"Content-Type", "application/json"}};
        const auto p1 = fetch(s.proxy.port, "PATCH", "/v1/payments", with_key(kp, json), "{}");
        const auto p2 = fetch(s.proxy.port, "PATCH", "/v1/payments", with_key(kp, json), "{}");
        CHECK(p1.header("Idempotency-Status") == "stored");
        CHECK(p2.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(kp) == 1);
        check_problem(fetch(s.proxy.port, "PATCH", "/v1/payments", json, "{}"), 400,
                      "idempotency.missing_key");

        const auto ku = unique_key("put");
        const auto u1 = fetch(s.proxy.port, "PUT", "/v1/payments", with_key(ku, json), "{}");
        const auto u2 = fetch(s.proxy.port, "PUT", "/v1/payments", with_key(ku, json), "{}");
        CHECK_FALSE(u1.has_header("Idempotency-Status"));
        CHECK_FALSE(u2.has_header("Idempotency-Status"));
        CHECK(s.upstream.count(ku) == 2);
    }

    TEST_CASE("a different payload while the first is still in flight is a mismatch") {
        auto& s = shared();
        const auto key = unique_key("mismatch-in-flight");
        http_client slow(s.proxy.port);
        slow.send_raw(make_request(
            "POST", "/v1/payments",
            with_key(key, {{"Content-Type", "application/json"}, {"X-Test-Delay-Ms", "500"}}),
            order_body));
        wait_until([&] { return s.upstream.count(key) == 1; }, 5s, "the upstream has the first");
        check_problem(post(s.proxy.port, "/v1/payments", key, {}, R"({"amount":5})"), 422,
                      "idempotency.payload_mismatch");
        // Content-Type is part of the fingerprint too.
        check_problem(fetch(s.proxy.port, "POST", "/v1/payments",
                            with_key(key, {{"Content-Type", "text/plain"}}), order_body),
                      422, "idempotency.payload_mismatch");
        const auto first = slow.read_response(5s);
        REQUIRE(first);
        CHECK(first->header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("stored, replayed and rejected answers on one keep-alive connection") {
        auto& s = shared();
        const auto key = unique_key("keep-alive");
        http_client c(s.proxy.port);
        const header_list h = with_key(key, {{"Content-Type", "application/json"}});
        const auto a = c.request("POST", "/v1/payments", h, order_body);
        const auto b = c.request("POST", "/v1/payments", h, order_body);
        const auto m = c.request("POST", "/v1/payments", h, R"({"other":true})");
        const auto d = c.request("POST", "/v1/payments", h, order_body);
        CHECK(a.header("Idempotency-Status") == "stored");
        CHECK(b.header("Idempotency-Status") == "replayed");
        check_problem(m, 422, "idempotency.payload_mismatch");
        CHECK(d.header("Idempotency-Status") == "replayed");
        CHECK(b.body == a.body);
        CHECK(d.body == a.body);
        CHECK(s.upstream.count(key) == 1);
    }

    // --- SPEC §6: metrics
    // -------------------------------------------------------------------------

    TEST_CASE("/metrics counts stored and replayed answers per route") {
        auto& s = shared();
        const auto key = unique_key("metered");
        CHECK(requests_total(s.proxy, "metered", "stored") == 0);
        CHECK(requests_total(s.proxy, "metered", "replayed") == 0);
        REQUIRE(post(s.proxy.port, "/v1/metered", key).header("Idempotency-Status") == "stored");
        REQUIRE(post(s.proxy.port, "/v1/metered", key).header("Idempotency-Status") == "replayed");
        REQUIRE(post(s.proxy.port, "/v1/metered", key).header("Idempotency-Status") == "replayed");
        REQUIRE(fetch(s.proxy.port, "POST", "/v1/metered", {}, order_body).status == 400);
        CHECK(requests_total(s.proxy, "metered", "stored") == 1);
        CHECK(requests_total(s.proxy, "metered", "replayed") == 2);
        CHECK(requests_total(s.proxy, "metered", "missing_key") == 1);
    }

    // Last (doctest runs a file's cases in order): the shared proxy took everything above without
    // crashing or a sanitizer report.
    TEST_CASE("the shared proxy is still running and its log has no sanitizer report") {
        auto& s = shared();
        CHECK(s.proxy.proc.running());
        const auto log = s.proxy.log();
        CHECK(log.find("AddressSanitizer") == std::string::npos);
        CHECK(log.find("runtime error:") == std::string::npos);
        const auto r = fetch(s.proxy.port, "GET", "/__health");
        CHECK(r.status == 200);
    }

} // TEST_SUITE
