// limits.max_buffered_bytes and limits.max_body_time (issue 26): guarded requests buffer their
// body, so clients that hold partial bodies open must not take the memory every other client
// needs. Real onceproxy (memory store) and the real test upstream over loopback sockets.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/proxy_fixture.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

const char* const guarded_route = R"(  - name: payments
    match: { prefix: /v1/payments }
    upstream: app
    idempotency: { mode: required, lease: 3s }
)";

constexpr std::size_t body_limit = 64 * 1024;

/// A test upstream and a proxy with a guarded /v1/payments route, a plain catch-all and
/// `limits` (max_request_bytes 64KiB).
struct proxied {
    upstream_process upstream;
    proxy_process proxy;
    explicit proxied(std::vector<std::string> limits)
        : upstream(), proxy(config(std::move(limits)), upstream.port) {}

    static std::string config(std::vector<std::string> limits) {
        proxy_config c;
        c.routes = guarded_route;
        c.upstream_settings.push_back("timeout: 2s");
        c.limits = std::move(limits);
        c.limits.push_back("max_request_bytes: 64KiB");
        return c.yaml();
    }

    http_response pay(const std::string& key) const {
        return fetch(proxy.port, "POST", "/v1/payments",
                     {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                     R"({"amount":1000})");
    }

    /// Polls /metrics until `series` satisfies `ok` (bounded by `timeout`); its last value.
    long long wait_metric(const std::string& series, const std::function<bool(long long)>& ok,
                          std::chrono::milliseconds timeout = 10s) const {
        long long v = -1;
        eventually(
            [&] {
                v = proxy.metric(series);
                return ok(v);
            },
            timeout);
        return v;
    }
};

/// The head of a guarded POST of `length` bytes under `key`.
std::string guarded_head(const std::string& key, std::size_t length, bool chunked = false) {
    return "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key +
           "\r\nContent-Type: application/octet-stream\r\n" +
           (chunked ? std::string("Transfer-Encoding: chunked\r\n")
                    : "Content-Length: " + std::to_string(length) + "\r\n") +
           "\r\n";
}

} // namespace

TEST_SUITE("buffer budget") {
    TEST_CASE("held guarded bodies spend limits.max_buffered_bytes: 503 until they leave") {
        // Room for four 64 KiB bodies; slow clients are not cut during the test.
        proxied p({"max_buffered_bytes: 256KiB", "body_timeout: 30s", "max_body_time: 60s"});
        {
            // Four clients each send all but 200 bytes of a guarded body, then hold it.
            std::vector<std::unique_ptr<http_client>> holders;
            for (int i = 0; i < 4; ++i) {
                holders.push_back(std::make_unique<http_client>(p.proxy.port));
                holders.back()->send_raw(guarded_head("hold-" + std::to_string(i), body_limit) +
                                         std::string(body_limit - 200, 'x'));
            }
            CHECK(p.wait_metric("onceproxy_buffered_bytes", [](long long v) {
                return v >= static_cast<long long>(4 * body_limit);
            }) == static_cast<long long>(4 * body_limit));

            // The next guarded request does not fit: 503 + Retry-After, never sent upstream.
            const auto r = p.pay("refused");
            check_problem(r, 503, "proxy.memory_limit");
            CHECK(r.header("Retry-After") == "1");
            CHECK(p.upstream.count("refused") == 0);

            // A chunked guarded body is admitted while small and refused once it outgrows
            // what is left (nothing).
            {
                http_client chunked(p.proxy.port);
                chunked.send_raw(guarded_head("chunked", 0, true));
                chunked.send_raw("400\r\n" + std::string(0x400, 'c') + "\r\n");
                const auto rc = chunked.read_response(10s);
                REQUIRE(rc);
                check_problem(*rc, 503, "proxy.memory_limit");
                CHECK(chunked.wait_closed(5s));
            }
            CHECK(p.upstream.count("chunked") == 0);

            // Plain proxying streams and buffers nothing: unaffected.
            CHECK(fetch(p.proxy.port, "GET", "/plain").status == 200);
            CHECK(p.proxy.metric("onceproxy_buffered_refusals_total") == 2);
            CHECK(p.proxy.metric("onceproxy_buffered_bytes_limit") == 256 * 1024);

            // One holder finishes its body: it is served, and its bytes go back.
            holders[0]->send_raw(std::string(200, 'x'));
            const auto done = holders[0]->read_response(10s);
            REQUIRE(done);
            CHECK(done->status == 200);
            CHECK(done->header("Idempotency-Status") == "stored");
        } // the other holders hang up mid-body
        CHECK(p.wait_metric("onceproxy_buffered_bytes", [](long long v) { return v == 0; }) == 0);
        const auto again = p.pay("after");
        CHECK(again.status == 200);
        CHECK(again.header("Idempotency-Status") == "stored");
        CHECK(p.upstream.count("after") == 1);
        CHECK(p.upstream.count("hold-0") == 1);
        CHECK(p.upstream.count("hold-1") == 0);
        CHECK(p.wait_metric("onceproxy_buffered_bytes", [](long long v) { return v == 0; }) == 0);
    }

    TEST_CASE("a guarded body trickling above min_body_rate is cut at limits.max_body_time") {
        proxied p({"body_timeout: 2s", "min_body_rate: 1KiB", "max_body_time: 3s"});
        http_client c(p.proxy.port);
        const auto start = clock_type::now();
        // Most of the body at once keeps the average far above 1 KiB/s for a minute.
        c.send_raw(guarded_head("trickle", body_limit) + std::string(body_limit - 200, 'x'));
        std::optional<http_response> r;
        for (int i = 0; i < 40 && clock_type::now() - start < 8s; ++i) {
            try {
                c.send_raw("x");
            } catch (const std::exception&) {
                break; // cut: the answer is already waiting
            }
            // Real time is the subject: one byte every 500 ms, each well inside body_timeout.
            if ((r = c.read_response(500ms))) {
                break;
            }
        }
        if (!r) {
            r = c.read_response(3s);
        }
        REQUIRE(r);
        check_problem(*r, 408, "request.timeout");
        const auto took = clock_type::now() - start;
        CHECK(took >= 2500ms);
        CHECK(took < 6s);
        CHECK(c.wait_closed(3s));
        CHECK(p.upstream.count("trickle") == 0);
        CHECK(p.proxy.metric("onceproxy_client_timeouts_total{phase=\"body\"}") == 1);
        CHECK(p.wait_metric("onceproxy_buffered_bytes", [](long long v) { return v == 0; }) == 0);
        // The process goes on serving guarded requests.
        CHECK(p.pay("after-trickle").status == 200);
    }
}
