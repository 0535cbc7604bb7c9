// Upstream answers a guarded exchange must not lose (issue 26), driven from outside: the real
// onceproxy binary with the memory store in front of the real test upstream, over loopback.
//   - an answer no request can get (101 Switching Protocols unasked, a status outside 100-599)
//     is 502 upstream.bad_response, and the key follows on_upstream_uncertain;
//   - an answer that comes after the upstream's timeout (the client already has its 504) is
//     still read, up to late_answer_timeout, and recorded: the retry replays it.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// Upstream timeout 300 ms, late answers read until 2 s after sending; leases of 1 s, so a
// retry after the lease would execute again if the late answer were thrown away.
std::string config_text() {
    proxy_config c;
    c.upstream_settings = {"timeout: 300ms", "late_answer_timeout: 2s"};
    c.routes = R"(  - name: pay
    match: { path: /v1/pay }
    upstream: app
    idempotency: { mode: required, lease: 1s }
  - name: pay_fail
    match: { path: /v1/pay-fail }
    upstream: app
    idempotency: { mode: required, lease: 1s, on_upstream_uncertain: fail }
)";
    return c.yaml();
}

struct setup {
    upstream_process upstream;
    proxy_process proxy;
    setup() : upstream(2), proxy(config_text(), upstream.port) {}
};

setup& shared() {
    static setup s;
    return s;
}

const std::string order_body = R"({"amount":1000,"currency":"eur"})";

http_response post(const std::string& path, const std::string& key, header_list extra = {}) {
    extra.emplace_back("Content-Type", "application/json");
    extra.emplace_back("Idempotency-Key", key);
    return fetch(shared().proxy.port, "POST", path, extra, order_body);
}

/// Retries `key` on `path` while the proxy answers 409 in_progress (the first attempt's lease is
/// held), bounded by `limit`; returns the first other answer.
http_response retry_until_settled(const std::string& path, const std::string& key,
                                  std::chrono::milliseconds limit) {
    http_response r;
    eventually(
        [&] {
            r = post(path, key);
            return r.status != 409;
        },
        limit, 50ms);
    return r;
}

} // namespace

TEST_SUITE("upstream answers") {

    TEST_CASE("a guarded POST answered 101 (not asked for) or 999 is 502 upstream.bad_response "
              "and the key is held: the retry does not execute again") {
        auto& s = shared();
        for (const char* status : {"101", "999"}) {
            CAPTURE(status);
            const auto key = unique_key("answers", std::string("bad-status-") + status);
            const auto first = post("/v1/pay", key, {{"X-Test-Status", status}});
            check_problem(first, 502, "upstream.bad_response");
            CHECK_FALSE(first.has_header("Idempotency-Status"));
            CHECK(s.upstream.count(key) == 1);
            // Executed, this retry would answer 200: it must find the key held instead.
            const auto retry = post("/v1/pay", key);
            check_problem(retry, 409, "idempotency.in_progress");
            CHECK(s.upstream.count(key) == 1);
        }
    }

    TEST_CASE("on_upstream_uncertain: fail records a 999 answer as 502 upstream.outcome_unknown") {
        auto& s = shared();
        const auto key = unique_key("answers", "bad-status-fail");
        const auto first = post("/v1/pay-fail", key, {{"X-Test-Status", "999"}});
        check_problem(first, 502, "upstream.outcome_unknown");
        const auto retry = post("/v1/pay-fail", key);
        check_problem(retry, 502, "upstream.outcome_unknown");
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("a late answer (after the upstream timeout) is recorded: the client got its 504, "
              "the retry replays the answer and the upstream executed once") {
        auto& s = shared();
        const auto key = unique_key("answers", "late");
        const auto recorded_before =
            s.proxy.metric("onceproxy_late_answers_total{outcome=\"recorded\"}");
        const auto start = clock_type::now();
        const auto first = post("/v1/pay", key, {{"X-Test-Delay-Ms", "600"}});
        check_problem(first, 504, "upstream.timeout");
        CHECK(clock_type::now() - start < 600ms); // answered at the timeout, not the answer
        // Until the answer is in, the lease is held: retries see 409, never a second run.
        const auto early = post("/v1/pay", key);
        if (clock_type::now() - start < 550ms) {
            check_problem(early, 409, "idempotency.in_progress");
        }
        // Retried past the 1 s lease: the answer came at 600 ms and was recorded.
        const auto retry = retry_until_settled("/v1/pay", key, 5s);
        CHECK(clock_type::now() - start > 600ms);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(key) == 1);
        CHECK(s.proxy.metric("onceproxy_late_answers_total{outcome=\"recorded\"}") ==
              recorded_before + 1);
    }

    TEST_CASE("no answer by late_answer_timeout: on_upstream_uncertain (hold) applies, then one "
              "retry executes") {
        auto& s = shared();
        const auto key = unique_key("answers", "never");
        const auto unanswered_before =
            s.proxy.metric("onceproxy_late_answers_total{outcome=\"unanswered\"}");
        const auto start = clock_type::now();
        const auto first = post("/v1/pay", key, {{"X-Test-Delay-Ms", "2600"}});
        check_problem(first, 504, "upstream.timeout");
        // Still held past the first lease (1 s): the late answer is awaited until 2 s.
        std::this_thread::sleep_until(start + 1500ms); // real time is the subject here
        check_problem(post("/v1/pay", key), 409, "idempotency.in_progress");
        CHECK(s.upstream.count(key) == 1);
        // After 2 s plus the held lease, the key frees and one retry executes.
        const auto retry = retry_until_settled("/v1/pay", key, 5s);
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "stored");
        CHECK(s.upstream.count(key) == 2);
        CHECK(s.proxy.metric("onceproxy_late_answers_total{outcome=\"unanswered\"}") ==
              unanswered_before + 1);
    }

    TEST_CASE("the shared proxy is still running and its log has no sanitizer report") {
        auto& s = shared();
        CHECK(s.proxy.proc.running());
        const auto log = s.proxy.log();
        CHECK(log.find("runtime error") == std::string::npos);
        CHECK(log.find("AddressSanitizer") == std::string::npos);
    }
}
