// The egress listener (issue 33) driven from outside: an app calls the real onceproxy binary's
// egress port, which sends to the real test upstream and retries what is safe to retry. The test
// upstream fails on demand (X-Test-Fail-*) the first N executions of a key and logs when each
// attempt arrived (/__attempts), so every assertion is something the app or the upstream
// observes: statuses, headers, how many attempts reached the upstream under which key, the gaps
// between them, and the proxy's /metrics.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string unique_key(const std::string& name) {
    return onceproxy::test::unique_key("egress", name);
}

/// A config with the test upstream as `app` (timeout `timeout`), no ingress routes, and the
/// egress block `egress` (YAML at top level, starting with `egress:`; its listen is added).
std::string egress_config(const std::string& egress, const std::string& timeout = "2s") {
    proxy_config c;
    c.ingress_routes = false;
    c.upstream_settings = {"timeout: " + timeout};
    c.top = "egress:\n  listen: 127.0.0.1:0\n" + egress;
    return c.yaml();
}

/// One egress route `name` on path prefix `prefix` to upstream `app`, with `retry` (a YAML
/// flow mapping such as "{ attempts: 3 }").
std::string egress_route(const std::string& name, const std::string& prefix,
                         const std::string& retry) {
    return "    - name: " + name + "\n      match: { prefix: " + prefix +
           " }\n      upstream: app\n      retry: " + retry + "\n";
}

/// Routes for most cases, one per retry policy, on one proxy (starting the binary under the
/// sanitizers is the slow part). The breaker is off and the budget ample: the cases of those
/// two start their own proxy. Delays are short where the delays are not the subject.
std::string shared_egress() {
    return "  budget: { ratio: 100%, min_per_second: 1000, window: 10s }\n"
           "  breaker: { enabled: false }\n"
           "  routes:\n" +
           egress_route("basic", "/basic/", "{ attempts: 3, base_delay: 10ms, max_delay: 50ms }") +
           egress_route("jitter", "/jitter/",
                        "{ attempts: 5, base_delay: 200ms, max_delay: 500ms, deadline: 30s }") +
           egress_route("retry-after", "/retry-after/",
                        "{ attempts: 2, base_delay: 10ms, max_delay: 20ms, max_retry_after: 5s }") +
           egress_route("retry-after-short", "/retry-after-short/",
                        "{ attempts: 3, base_delay: 10ms, max_delay: 20ms, max_retry_after: 1s }") +
           egress_route("no-key", "/no-key/",
                        "{ attempts: 3, base_delay: 10ms, max_delay: 20ms, generate_key: false }");
}

struct shared_setup {
    upstream_process upstream;
    proxy_process proxy;
    shared_setup() : upstream(2), proxy(egress_config(shared_egress()), upstream.port) {
        if (proxy.egress_port == 0) {
            throw std::runtime_error("the proxy wrote no egress port; its log:\n" + proxy.log());
        }
    }
};

shared_setup& shared() {
    static shared_setup s;
    return s;
}

/// A request to the egress listener of `p` on a fresh connection.
http_response egress(const proxy_process& p, std::string_view method, std::string_view target,
                     const header_list& headers = {}, std::string_view body = {}) {
    return fetch(p.egress_port, method, target, headers, body);
}

/// A UUIDv7 as RFC 9562 writes it: 8-4-4-4-12 lower-case hex digits, version nibble 7,
/// variant bits 10.
bool is_uuidv7(const std::string& k) {
    if (k.size() != 36) {
        return false;
    }
    for (std::size_t i = 0; i < k.size(); ++i) {
        const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        const char c = k[i];
        if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return false;
        }
    }
    return k[14] == '7' && std::string_view("89ab").find(k[19]) != std::string_view::npos;
}

/// A counter of the egress families on route (or upstream) `owner`, by the value of its second
/// label, e.g. egress_metric(p, "attempts", "route", "basic", "result", "reset"); 0 when the
/// series is absent.
long long egress_metric(const proxy_process& p, const std::string& family,
                        const std::string& owner_label, const std::string& owner,
                        const std::string& label = "", const std::string& value = "") {
    std::string series = "onceproxy_egress_" + family + "{" + owner_label + "=\"" + owner + "\"";
    if (!label.empty()) {
        series += "," + label + "=\"" + value + "\"";
    }
    series += "}";
    return std::max(0LL, p.metric(series));
}

long long attempts_of(const proxy_process& p, const std::string& route, const std::string& result) {
    return egress_metric(p, "attempts_total", "route", route, "result", result);
}

long long denied_of(const proxy_process& p, const std::string& route, const std::string& reason) {
    return egress_metric(p, "retries_denied_total", "route", route, "reason", reason);
}

/// Every attempt of egress route `route`, whatever its result.
long long all_attempts_of(const proxy_process& p, const std::string& route) {
    const std::string text = p.admin("/metrics").body;
    const std::string prefix = "onceproxy_egress_attempts_total{route=\"" + route + "\",";
    long long sum = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind(prefix, 0) == 0) {
            sum += std::stoll(line.substr(line.rfind(' ') + 1));
        }
    }
    return sum;
}

/// The gaps between consecutive arrivals, in ms.
std::vector<double> gaps(const std::vector<double>& at) {
    std::vector<double> g;
    for (std::size_t i = 1; i < at.size(); ++i) {
        g.push_back(at[i] - at[i - 1]);
    }
    return g;
}

} // namespace

TEST_SUITE("egress: the test upstream itself") {

    // These talk to the test upstream directly: they show that the faults the egress cases rely
    // on behave as documented, so a failure below comes from the proxy, not the test machinery.

    TEST_CASE("X-Test-Fail-Times: the first N executions of a key fail, later ones answer 200") {
        upstream_process upstream;
        const auto key = unique_key("fail-times");
        const header_list h{{"Idempotency-Key", key},
                            {"X-Test-Fail-Times", "2"},
                            {"X-Test-Header", "Retry-After: 1"}};
        const auto first = fetch(upstream.port, "POST", "/v1/pay", h, "{}");
        const auto second = fetch(upstream.port, "POST", "/v1/pay", h, "{}");
        const auto third = fetch(upstream.port, "POST", "/v1/pay", h, "{}");
        CHECK(first.status == 503);
        CHECK(first.header("Retry-After") == "1");
        CHECK(second.status == 503);
        CHECK(second.header("Retry-After") == "1");
        CHECK(third.status == 200);
        CHECK_FALSE(third.has_header("Retry-After")); // X-Test-Header goes with the failures
        CHECK(json_member(third.body, "key") == key);
        CHECK(upstream.count(key) == 3);

        const auto at = upstream.attempts(key);
        REQUIRE(at.size() == 3);
        CHECK(at[0] <= at[1]);
        CHECK(at[1] <= at[2]);
        CHECK(upstream.attempts(unique_key("never-sent")).empty());
    }

    TEST_CASE("X-Test-Fail-Status picks the failing status; X-Test-Header without "
              "X-Test-Fail-Times stays on every answer") {
        upstream_process upstream;
        const auto key = unique_key("fail-status");
        const header_list h{
            {"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}, {"X-Test-Fail-Status", "429"}};
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 429);
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 200);

        const auto plain = fetch(upstream.port, "GET", "/x", {{"X-Test-Header", "X-Extra: 1"}});
        CHECK(plain.status == 200);
        CHECK(plain.header("X-Extra") == "1");
    }

    TEST_CASE("without a key, X-Test-Fault-Id counts the executions; with neither: 400") {
        upstream_process upstream;
        const auto a = unique_key("fault-a");
        const auto b = unique_key("fault-b");
        const auto with_id = [](const std::string& id) {
            return header_list{{"X-Test-Fault-Id", id}, {"X-Test-Fail-Times", "1"}};
        };
        CHECK(fetch(upstream.port, "GET", "/x", with_id(a)).status == 503);
        CHECK(fetch(upstream.port, "GET", "/x", with_id(b)).status == 503); // its own count
        CHECK(fetch(upstream.port, "GET", "/x", with_id(a)).status == 200);
        CHECK(fetch(upstream.port, "GET", "/x", with_id(b)).status == 200);
        CHECK(upstream.attempts(a).size() == 2);
        CHECK(upstream.count(a) == 0); // /__count counts Idempotency-Keys only

        CHECK(fetch(upstream.port, "GET", "/x", {{"X-Test-Fail-Times", "1"}}).status == 400);
    }

    TEST_CASE("X-Test-Fail-With: reset closes without an answer, then the key answers 200") {
        upstream_process upstream;
        const auto key = unique_key("reset");
        const header_list h{
            {"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}, {"X-Test-Fail-With", "reset"}};
        {
            http_client c(upstream.port);
            c.send_raw(make_request("POST", "/x", h, "{}"));
            CHECK_FALSE(c.read_response(5s));
        }
        CHECK(fetch(upstream.port, "POST", "/x", h, "{}").status == 200);
        CHECK(upstream.count(key) == 2);
        CHECK(upstream.attempts(key).size() == 2);
    }

    TEST_CASE("X-Test-Fail-With: hang holds the connection X-Test-Fail-Hang-Ms, then closes") {
        upstream_process upstream;
        const auto key = unique_key("hang");
        const header_list h{{"Idempotency-Key", key},
                            {"X-Test-Fail-Times", "1"},
                            {"X-Test-Fail-With", "hang"},
                            {"X-Test-Fail-Hang-Ms", "300"}};
        http_client c(upstream.port);
        const auto start = clock_type::now();
        c.send_raw(make_request("POST", "/x", h, "{}"));
        CHECK(c.wait_closed(5s));
        CHECK(clock_type::now() - start >= 300ms);
        CHECK(fetch(upstream.port, "POST", "/x", h, "{}").status == 200);
    }

    TEST_CASE("POST /__reset clears the attempt log and restarts the fault counts") {
        upstream_process upstream;
        const auto key = unique_key("reset-log");
        const header_list h{{"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}};
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 503);
        CHECK(upstream.attempts(key).size() == 1);
        upstream.reset();
        CHECK(upstream.attempts(key).empty());
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 503);
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 200);
    }
}

TEST_SUITE("egress") {

    // --- keys and attempts
    // ---------------------------------------------------------------------------

    TEST_CASE("a POST without a key gets a UUIDv7 key, the same on each attempt: 503, 503, 200") {
        auto& s = shared();
        const auto retries_before = egress_metric(s.proxy, "retries_total", "route", "basic");
        const auto statuses_before = attempts_of(s.proxy, "basic", "retryable_status");
        const auto answered_before = attempts_of(s.proxy, "basic", "answered");

        const auto r = egress(s.proxy, "POST", "/basic/pay",
                              {{"Content-Type", "application/json"}, {"X-Test-Fail-Times", "2"}},
                              R"({"amount":1})");
        INFO("answer: " << r.status << " " << r.body);
        CHECK(r.status == 200);
        CHECK(r.header("Onceproxy-Attempts") == "3");
        const auto key = r.header("Idempotency-Key");
        CHECK(is_uuidv7(key));
        CHECK(json_member(r.body, "key") == key); // the answering attempt carried it
        // Every attempt reached the upstream under that one key: a different key per attempt
        // would have failed each time (the first execution of each key fails).
        CHECK(s.upstream.attempts(key).size() == 3);
        CHECK(s.upstream.count(key) == 3);

        CHECK(egress_metric(s.proxy, "retries_total", "route", "basic") - retries_before == 2);
        CHECK(attempts_of(s.proxy, "basic", "retryable_status") - statuses_before == 2);
        CHECK(attempts_of(s.proxy, "basic", "answered") - answered_before == 1);
    }

    TEST_CASE("the access log line of an egress request has its key and its attempts") {
        upstream_process upstream;
        proxy_config c;
        c.ingress_routes = false;
        c.access_log = true;
        c.workers = 1;
        c.top = "egress:\n  listen: 127.0.0.1:0\n  routes:\n" +
                egress_route("logged", "/", "{ base_delay: 10ms, max_delay: 20ms }");
        proxy_process proxy(c.yaml(), upstream.port);
        const auto r = egress(proxy, "POST", "/v1/charges", {{"X-Test-Fail-Times", "1"}}, "{}");
        REQUIRE(r.status == 200);
        const auto key = r.header("Idempotency-Key");
        REQUIRE(is_uuidv7(key));
        // The key as the upstream saw it (egress keys are not hashed), and the two sends.
        const auto logged = [&] {
            std::istringstream lines(proxy.log());
            for (std::string line; std::getline(lines, line);) {
                if (line.find("\"route\":\"logged\"") != std::string::npos &&
                    line.find("\"idempotency_key\":\"" + key + "\"") != std::string::npos &&
                    line.find("\"attempts\":2") != std::string::npos &&
                    line.find("\"status\":200") != std::string::npos) {
                    return true;
                }
            }
            return false;
        };
        CHECK(eventually(logged));
        INFO(proxy.log());
    }

    TEST_CASE("a key the app sent is kept as it is") {
        auto& s = shared();
        const auto key = unique_key("app-key");
        const auto r = egress(s.proxy, "POST", "/basic/pay",
                              {{"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}}, "{}");
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Key") == key);
        CHECK(r.header("Onceproxy-Attempts") == "2");
        CHECK(json_member(r.body, "key") == key);
        CHECK(s.upstream.attempts(key).size() == 2);
    }

    TEST_CASE("a plain success is sent once; a GET gets no key; no route: 404") {
        auto& s = shared();
        const auto r = egress(s.proxy, "GET", "/basic/items");
        CHECK(r.status == 200);
        CHECK(r.header("Onceproxy-Attempts") == "1");
        CHECK_FALSE(r.has_header("Idempotency-Key"));
        CHECK(json_member(r.body, "key") == "null");

        check_problem(egress(s.proxy, "GET", "/elsewhere"), 404, "route.not_found");
    }

    TEST_CASE("an answer held for the app counts in limits.max_buffered_bytes until the app "
              "has it") {
        // An answer far larger than the sockets between them hold: while the app does not read,
        // the proxy holds most of it.
        constexpr long long answer = 48LL << 20;
        upstream_process upstream;
        proxy_process proxy(
            egress_config("  routes:\n    - name: big\n      match: { prefix: /big/ }\n"
                          "      upstream: app\n      limits: { max_response_bytes: 64MiB }\n"
                          "      retry: { attempts: 2 }\n",
                          "30s"), // 48 MiB through two sanitized processes on a busy machine
            upstream.port);
        const auto buffered = [&] { return proxy.metric("onceproxy_buffered_bytes"); };
        {
            http_client app(proxy.egress_port);
            app.send_raw("GET /big/report HTTP/1.1\r\nHost: x\r\nX-Test-Body-Bytes: " +
                         std::to_string(answer) + "\r\n\r\n");
            CHECK(eventually([&] { return buffered() >= answer; }, 20s));
            CHECK(buffered() <= answer + (1 << 20));
            const auto r = app.read_response(60s);
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(static_cast<long long>(r->body.size()) == answer);
        }
        CHECK(eventually([&] { return buffered() == 0; }, 10s));
    }

    TEST_CASE("attempts used up: the last answer is passed on") {
        auto& s = shared();
        const auto key = unique_key("used-up");
        const auto denied_before = denied_of(s.proxy, "basic", "attempts");
        const auto r = egress(s.proxy, "POST", "/basic/pay",
                              {{"Idempotency-Key", key}, {"X-Test-Fail-Times", "5"}}, "{}");
        CHECK(r.status == 503);
        CHECK(r.header("Onceproxy-Attempts") == "3");
        CHECK(json_member(r.body, "key") == key); // the upstream's own answer, not a problem
        CHECK(s.upstream.attempts(key).size() == 3);
        CHECK(denied_of(s.proxy, "basic", "attempts") - denied_before == 1);
    }

    // --- backoff and Retry-After
    // ---------------------------------------------------------------------

    TEST_CASE("the waits between attempts stay within the full-jitter bounds") {
        // Real time is the subject: the gaps between the attempts, as the upstream saw them.
        // Route jitter: base_delay 200ms, max_delay 500ms, so wait n (n = 1..4) is uniform in
        // [0, min(500, 200 * 2^(n-1))] ms = [0, 200], [0, 400], [0, 500], [0, 500].
        auto& s = shared();
        const std::vector<double> bounds{200, 400, 500, 500};
        // A gap also holds the upstream's answer, the proxy's reading of it and the next send:
        // a few ms, more on a loaded machine under the sanitizers.
        constexpr double slack_ms = 100;
        double sum = 0;
        double sum_bounds = 0;
        for (int i = 0; i < 4; ++i) {
            const auto key = unique_key("jitter");
            const auto r = egress(s.proxy, "POST", "/jitter/pay",
                                  {{"Idempotency-Key", key}, {"X-Test-Fail-Times", "4"}}, "{}");
            REQUIRE(r.status == 200);
            CHECK(r.header("Onceproxy-Attempts") == "5");
            const auto g = gaps(s.upstream.attempts(key));
            REQUIRE(g.size() == bounds.size());
            for (std::size_t n = 0; n < g.size(); ++n) {
                INFO("request " << i << ", wait " << n + 1 << ": " << g[n] << " ms");
                CHECK(g[n] >= 0);
                CHECK(g[n] <= bounds[n] + slack_ms);
                sum += g[n];
                sum_bounds += bounds[n];
            }
        }
        // Jittered, not the full bound each time: 16 uniform waits average half their bounds
        // (3200 of 6400 ms, standard deviation about 480 ms); a proxy that always waits the
        // bound lands above 6400.
        INFO("sum of the waits " << sum << " ms of at most " << sum_bounds);
        CHECK(sum < 0.85 * sum_bounds);
    }

    TEST_CASE("Retry-After: 1 is honoured: the retry comes at least a second later") {
        // Real time is the subject: the wait the upstream asked for.
        auto& s = shared();
        const auto key = unique_key("retry-after");
        const auto r = egress(s.proxy, "POST", "/retry-after/pay",
                              {{"Idempotency-Key", key},
                               {"X-Test-Fail-Times", "1"},
                               {"X-Test-Header", "Retry-After: 1"}},
                              "{}");
        CHECK(r.status == 200);
        CHECK(r.header("Onceproxy-Attempts") == "2");
        const auto g = gaps(s.upstream.attempts(key));
        REQUIRE(g.size() == 1);
        INFO("gap " << g[0] << " ms");
        // The upstream stamped the first arrival before it answered, so the proxy's wait from
        // the answer on fits inside the gap whole (1 ms for rounding).
        CHECK(g[0] >= 999);
        CHECK(g[0] < 3000);
    }

    TEST_CASE("a Retry-After above max_retry_after is not waited for: the 503 is passed on") {
        auto& s = shared();
        const auto key = unique_key("retry-after-long");
        const auto denied_before = denied_of(s.proxy, "retry-after-short", "retry_after");
        const auto r = egress(s.proxy, "POST", "/retry-after-short/pay",
                              {{"Idempotency-Key", key},
                               {"X-Test-Fail-Times", "1"},
                               {"X-Test-Header", "Retry-After: 5"}},
                              "{}");
        CHECK(r.status == 503);
        CHECK(r.header("Retry-After") == "5");
        CHECK(r.header("Onceproxy-Attempts") == "1");
        CHECK(s.upstream.attempts(key).size() == 1);
        CHECK(denied_of(s.proxy, "retry-after-short", "retry_after") - denied_before == 1);
    }

    // --- what is retried
    // -----------------------------------------------------------------------------

    TEST_CASE("a reset before any answer is retried under the same key") {
        auto& s = shared();
        const auto key = unique_key("reset");
        const auto resets_before = attempts_of(s.proxy, "basic", "reset");
        const auto r = egress(
            s.proxy, "POST", "/basic/pay",
            {{"Idempotency-Key", key}, {"X-Test-Fail-Times", "2"}, {"X-Test-Fail-With", "reset"}},
            "{}");
        CHECK(r.status == 200);
        CHECK(r.header("Onceproxy-Attempts") == "3");
        CHECK(s.upstream.attempts(key).size() == 3);
        CHECK(attempts_of(s.proxy, "basic", "reset") - resets_before == 2);
    }

    TEST_CASE("generate_key: false: a POST without a key is sent once, a GET is retried") {
        auto& s = shared();
        const auto unsafe_before = denied_of(s.proxy, "no-key", "unsafe");

        const auto status_fault = unique_key("unsafe-status");
        const auto r =
            egress(s.proxy, "POST", "/no-key/pay",
                   {{"X-Test-Fault-Id", status_fault}, {"X-Test-Fail-Times", "1"}}, "{}");
        CHECK(r.status == 503); // the upstream's answer, passed on
        CHECK(r.header("Onceproxy-Attempts") == "1");
        CHECK_FALSE(r.has_header("Idempotency-Key"));
        CHECK(json_member(r.body, "key") == "null");
        CHECK(s.upstream.attempts(status_fault).size() == 1);

        const auto reset_fault = unique_key("unsafe-reset");
        const auto dropped = egress(s.proxy, "POST", "/no-key/pay",
                                    {{"X-Test-Fault-Id", reset_fault},
                                     {"X-Test-Fail-Times", "1"},
                                     {"X-Test-Fail-With", "reset"}},
                                    "{}");
        check_problem(dropped, 502, "upstream.unavailable");
        CHECK(s.upstream.attempts(reset_fault).size() == 1);
        CHECK(denied_of(s.proxy, "no-key", "unsafe") - unsafe_before == 2);

        const auto get_fault = unique_key("safe-get");
        const auto get = egress(s.proxy, "GET", "/no-key/items",
                                {{"X-Test-Fault-Id", get_fault}, {"X-Test-Fail-Times", "1"}});
        CHECK(get.status == 200);
        CHECK(get.header("Onceproxy-Attempts") == "2");
        CHECK(s.upstream.attempts(get_fault).size() == 2);

        // The app's own key makes a POST retry-eligible there too.
        const auto key = unique_key("own-key");
        const auto keyed = egress(s.proxy, "POST", "/no-key/pay",
                                  {{"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}}, "{}");
        CHECK(keyed.status == 200);
        CHECK(keyed.header("Onceproxy-Attempts") == "2");
        CHECK(s.upstream.attempts(key).size() == 2);
    }

    // --- the budget and the breaker
    // ------------------------------------------------------------------

    TEST_CASE("total outage: the retry budget keeps attempts near (1 + ratio) x requests") {
        // Nothing listens on the upstream port; every attempt is a connect failure. Unbudgeted,
        // 60 requests of 3 attempts would make 180 attempts.
        const unsigned short closed = free_port();
        const std::string yaml = egress_config(
            "  budget: { ratio: 20%, min_per_second: 1, window: 20s }\n"
            "  breaker: { enabled: false }\n"
            "  routes:\n" +
            egress_route("out", "/", "{ attempts: 3, base_delay: 1ms, max_delay: 2ms }"));
        proxy_process proxy(yaml, closed);
        REQUIRE(proxy.egress_port != 0);
        constexpr int requests = 60;
        for (int i = 0; i < requests; ++i) {
            const auto r = egress(proxy, "POST", "/pay", {}, "{}");
            check_problem(r, 502, "upstream.unavailable");
        }
        // Retries: at most ratio x requests + min_per_second x window = 12 + 20 (the whole run
        // is inside one window), shared by both workers.
        const long long attempts = all_attempts_of(proxy, "out");
        INFO("attempts " << attempts << ", proxy log:\n" << proxy.log());
        CHECK(attempts >= requests);
        CHECK(attempts <= requests + 12 + 20 + 2);
        CHECK(attempts_of(proxy, "out", "connect_failure") == attempts);
        CHECK(denied_of(proxy, "out", "budget") > 0);
        CHECK(egress_metric(proxy, "retries_total", "route", "out") == attempts - requests);
    }

    TEST_CASE("breaker: consecutive failures open it, requests are refused without a send, and "
              "after cool_down a successful probe closes it") {
        upstream_process upstream;
        const std::string yaml =
            egress_config("  budget: { ratio: 100%, min_per_second: 1000, window: 10s }\n"
                          "  breaker: { enabled: true, failures: 3, cool_down: 1s, probes: 1 }\n"
                          "  routes:\n" +
                          egress_route("guarded", "/", "{ attempts: 1 }"));
        proxy_process proxy(yaml, upstream.port);
        REQUIRE(proxy.egress_port != 0);
        const auto state = [&](const std::string& st) {
            return egress_metric(proxy, "breaker_state", "upstream", "app", "state", st);
        };
        const auto transitions = [&](const std::string& to) {
            return egress_metric(proxy, "breaker_transitions_total", "upstream", "app", "to", to);
        };
        // GETs (no key is generated for them) count their executions by X-Test-Fault-Id: the
        // first three fail with 503, the fourth answers 200.
        const auto fault = unique_key("breaker");
        const header_list h{{"X-Test-Fault-Id", fault}, {"X-Test-Fail-Times", "3"}};
        for (int i = 0; i < 3; ++i) {
            CHECK(egress(proxy, "GET", "/items", h).status == 503);
        }
        const auto opened = clock_type::now();
        CHECK(state("open") == 1);
        CHECK(state("closed") == 0);
        CHECK(transitions("open") == 1);

        const auto refused = egress(proxy, "GET", "/items", h);
        check_problem(refused, 503, "egress.circuit_open");
        REQUIRE(refused.has_header("Retry-After"));
        CHECK(std::stoul(refused.header("Retry-After")) <= 1);
        CHECK(upstream.attempts(fault).size() == 3); // nothing was sent
        CHECK(egress_metric(proxy, "circuit_refusals_total", "route", "guarded") >= 1);

        // Refused until the cool-down ends; then the next request is the probe, answered 200.
        http_response passed;
        wait_until(
            [&] {
                passed = egress(proxy, "GET", "/items", h);
                return passed.status != 503 ||
                       passed.header("Content-Type") != "application/problem+json";
            },
            5s, "a request let through after the cool-down");
        CHECK(clock_type::now() - opened >= 900ms);
        CHECK(passed.status == 200);
        CHECK(upstream.attempts(fault).size() == 4); // the refused ones never reached it
        CHECK(state("closed") == 1);
        CHECK(transitions("half_open") == 1);
        CHECK(transitions("closed") == 1);
        CHECK(egress(proxy, "GET", "/items", h).status == 200);
    }

    // --- the whole chain
    // -----------------------------------------------------------------------------

    TEST_CASE("app -> egress -> ingress -> upstream: timed-out attempts are retried under one "
              "key and each logical request executes once") {
        // The upstream takes 1.2 s to answer; the egress attempt timeout (the upstream timeout
        // of its `app`, the ingress proxy) is 500 ms, and `timeout` is retried. So the first
        // attempt of every request times out while the upstream executes it; the ingress proxy
        // keeps going (a client leaving does not lose the answer) and records it. The retries
        // carry the same generated key: the ingress route has `concurrent: wait`, so a retry
        // that arrives while the first execution runs waits for it and gets the replay (with
        // the default `conflict` it would get 409 idempotency.in_progress, which egress does
        // not retry). Attempts that time out while waiting are retried again; 10 attempts
        // within 20 s leave ample room. Deterministic: the first attempt always times out, and
        // whatever the timing, the ingress store lets one execution per key through.
        upstream_process upstream(2);
        proxy_config ingress_cfg;
        ingress_cfg.upstream_settings = {"timeout: 5s"};
        ingress_cfg.routes =
            guarded_route("orders", "/v1/", "concurrent: wait, wait_timeout: 10s, lease: 10s");
        proxy_process ingress(ingress_cfg.yaml(), upstream.port);

        const std::string yaml = egress_config(
            "  budget: { ratio: 100%, min_per_second: 1000, window: 10s }\n"
            "  breaker: { enabled: false }\n"
            "  routes:\n" +
                egress_route("orders", "/v1/",
                             "{ attempts: 10, deadline: 20s, base_delay: 10ms, max_delay: 50ms, "
                             "on: [connect_failure, reset, timeout, 502, 503, 504] }"),
            "500ms");
        proxy_process egress_proxy(yaml, ingress.port);
        REQUIRE(egress_proxy.egress_port != 0);

        constexpr std::size_t requests = 20;
        std::vector<std::unique_ptr<http_client>> apps;
        for (std::size_t i = 0; i < requests; ++i) {
            apps.push_back(std::make_unique<http_client>(egress_proxy.egress_port));
        }
        for (std::size_t i = 0; i < requests; ++i) {
            apps[i]->send_raw(
                make_request("POST", "/v1/orders",
                             {{"Content-Type", "application/json"}, {"X-Test-Delay-Ms", "1200"}},
                             R"({"order":)" + std::to_string(i) + "}"));
        }
        std::set<std::string> keys;
        for (std::size_t i = 0; i < requests; ++i) {
            const auto r = apps[i]->read_response(20s);
            REQUIRE_MESSAGE(r, "request " << i << " got no answer");
            INFO("request " << i << ": " << r->status << " " << r->body);
            CHECK(r->status == 200);
            const auto key = r->header("Idempotency-Key");
            CHECK(is_uuidv7(key));
            keys.insert(key);
            const auto attempts = r->header("Onceproxy-Attempts");
            REQUIRE_FALSE(attempts.empty());
            CHECK(std::stoul(attempts) >= 2); // the first one timed out
            CHECK(r->header("Idempotency-Status") == "replayed");
            CHECK(json_member(r->body, "key") == key);
            CHECK(upstream.count(key) == 1);
        }
        CHECK(keys.size() == requests);
        CHECK(upstream.total() == requests);
        CHECK(attempts_of(egress_proxy, "orders", "timeout") >= static_cast<long long>(requests));
    }
}
