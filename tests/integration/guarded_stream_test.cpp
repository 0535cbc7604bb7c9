// A guarded request whose upstream answer is larger than max_record_bytes (issue 8, item 4):
// the answer streams on to the caller instead of being held whole, and the key is completed as
// not replayable once its body has ended. Driven from outside: the real onceproxy binary and
// the real test upstream over loopback sockets.
//
// The upstream pauses part-way through its body until the test releases it, so "the first
// bytes arrived before the upstream finished" is a fact of the test, not a timing guess.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/stream_connection.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

/// Guarded routes that hold at most 1 MiB of an answer. `/big/` lets a streamed answer reach
/// 1 GiB (the route's response limit applies to streamed answers as on the plain path);
/// `/cut/` records an upstream that breaks off as upstream.outcome_unknown.
const char* const guarded_routes = R"(  - name: big
    match: { prefix: /big/ }
    upstream: app
    limits: { max_response_bytes: 1GiB }
    idempotency: { mode: required, max_record_bytes: 1MiB, lease: 60s }
  - name: cut
    match: { prefix: /cut/ }
    upstream: app
    limits: { max_response_bytes: 1GiB }
    idempotency: { mode: required, max_record_bytes: 1MiB, lease: 60s,
                   on_upstream_uncertain: fail }
)";

/// A route whose lease (2 s) is shorter than a slow caller's download: only extensions keep
/// the key from being claimed again mid-stream. The upstream timeout may not exceed the lease.
const char* const short_lease_route = R"(  - name: short-lease
    match: { prefix: /lease/ }
    upstream: app
    limits: { max_response_bytes: 1GiB }
    idempotency: { mode: required, max_record_bytes: 1MiB, lease: 2s }
)";

struct proxied {
    upstream_process upstream;
    proxy_process proxy;
    explicit proxied(const char* routes = guarded_routes, const char* timeout = "60s")
        : upstream(2), proxy(config(routes, timeout), upstream.port, {}, small_asan_quarantine()) {}

    static std::string config(const char* routes, const std::string& timeout) {
        proxy_config c;
        c.routes = routes;
        c.upstream_settings.push_back("timeout: " + timeout);
        c.limits.push_back("drain_timeout: 60s"); // at least the upstream timeout
        return c.yaml();
    }

    /// Lets the paused body `id` go on (POST /__release on the upstream).
    void release(const std::string& id) const {
        const auto r = fetch(upstream.port, "POST", "/__release?id=" + id);
        REQUIRE(r.status == 200);
    }
};

std::string unique_key(const std::string& name) {
    return onceproxy::test::unique_key("gs", name);
}

/// The request for a generated answer of `bytes` that pauses after `pause_after` bytes until
/// stream `id` is released.
std::string big_request(const std::string& path, const std::string& key, std::uint64_t bytes,
                        const std::string& id, std::uint64_t pause_after, header_list extra = {}) {
    header_list h{{"Idempotency-Key", key},
                  {"X-Test-Body-Bytes", std::to_string(bytes)},
                  {"X-Test-Stream-Id", id},
                  {"X-Test-Pause-After-Bytes", std::to_string(pause_after)}};
    h.insert(h.end(), extra.begin(), extra.end());
    return make_request("POST", path, h, "{}");
}

/// Checks each body byte against the test upstream's pattern ('a' + i % 26).
struct pattern_check {
    std::uint64_t offset = 0;
    std::optional<std::uint64_t> first_bad;
    void operator()(std::string_view piece) {
        for (std::size_t i = 0; i < piece.size() && !first_bad; ++i) {
            if (piece[i] != static_cast<char>('a' + (offset + i) % 26)) {
                first_bad = offset + i;
            }
        }
        offset += piece.size();
    }
};

/// Retries `key` on `path` until the first attempt's lease is gone (bounded): its answer.
http_response retry_after_first(const proxied& p, const std::string& path, const std::string& key) {
    http_response r;
    eventually(
        [&] {
            r = fetch(p.proxy.port, "POST", path, {{"Idempotency-Key", key}}, "{}");
            return json_member(r.body, "code") != "idempotency.in_progress";
        },
        20s, 50ms);
    return r;
}

} // namespace

TEST_SUITE("guarded answers over max_record_bytes stream") {

    TEST_CASE("200 MiB: streamed intact before the upstream finished, flat memory, recorded "
              "not replayable, executed once") {
        proxied p;
        constexpr std::uint64_t total = 200 * mib;
        const auto key = unique_key("big");
        const auto pid = p.proxy.proc.pid();
        const auto rss_before = rss_kib(pid);
        reset_peak_rss(pid);
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(big_request("/big/download", key, total, "big-1", 4 * mib)));
        // The upstream holds the rest back until released (or for 10 s): the head and the
        // first bytes must come through well within that.
        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 200);
        CHECK(head->header("Idempotency-Status") == "stored");
        CHECK(head->header("Content-Length") == std::to_string(total));
        c.begin_body(*head);

        pattern_check check;
        const auto some =
            c.read_body_until([](std::string_view s) { return s.size() >= 2 * mib; }, 5s);
        REQUIRE_MESSAGE(some, "the first bytes did not arrive while the upstream was paused");
        check(*some);
        p.release("big-1");
        const auto got = c.read_body(std::ref(check), 30s, 240s);
        const auto peak = peak_rss_kib(pid);
        MESSAGE("proxy RSS before " << rss_before / 1024 << " MiB, peak " << peak / 1024
                                    << " MiB for a " << total / mib << " MiB answer");
        CHECK(got.complete);
        CHECK(check.offset == total);
        CHECK_FALSE(check.first_bad);
        // A proxy holding the answer would grow by at least its size.
        CHECK(peak > 0);
        CHECK(peak < rss_before + 64 * 1024);

        const auto retry = retry_after_first(p, "/big/download", key);
        check_problem(retry, 409, "idempotency.response_not_replayable");
        CHECK(p.upstream.count(key) == 1);
    }

    TEST_CASE("a chunked answer over the limit reaches the client chunked, whole") {
        proxied p;
        const auto key = unique_key("chunked");
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(big_request("/big/chunked", key, 8 * mib, "chunked-1", 2 * mib,
                                   {{"X-Test-Chunked", "1"}})));
        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 200);
        CHECK(head->header("Transfer-Encoding") == "chunked");
        CHECK(head->header("Idempotency-Status") == "stored");
        c.begin_body(*head);
        pattern_check check;
        const auto some =
            c.read_body_until([](std::string_view s) { return s.size() >= mib + 1; }, 5s);
        REQUIRE(some);
        check(*some);
        p.release("chunked-1");
        const auto got = c.read_body(std::ref(check), 30s, 60s);
        CHECK(got.complete);
        CHECK(check.offset == 8 * mib);
        CHECK_FALSE(check.first_bad);

        // The connection carries on: the retry on it gets the not-replayable answer.
        REQUIRE(c.send(make_request("POST", "/big/chunked", {{"Idempotency-Key", key}}, "{}")));
        const auto next = c.read_head(10s);
        REQUIRE(next);
        CHECK(next->status == 409);
        CHECK(p.upstream.count(key) == 1);
    }

    TEST_CASE("the client hangs up mid-stream: the record still completes, no second run") {
        proxied p;
        const auto key = unique_key("gone");
        {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(big_request("/big/gone", key, 64 * mib, "gone-1", 4 * mib)));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            CHECK(head->status == 200);
            c.begin_body(*head);
            REQUIRE(c.read_body_until([](std::string_view s) { return s.size() >= mib; }, 5s));
        } // closed with most of the body unread
        p.release("gone-1");
        const auto retry = retry_after_first(p, "/big/gone", key);
        check_problem(retry, 409, "idempotency.response_not_replayable");
        CHECK(p.upstream.count(key) == 1);
    }

    TEST_CASE("the upstream breaks off mid-stream: the client is cut, the key follows "
              "on_upstream_uncertain") {
        proxied p;
        const auto key = unique_key("cut");
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(make_request("POST", "/cut/download",
                                    {{"Idempotency-Key", key},
                                     {"X-Test-Body-Bytes", std::to_string(64 * mib)},
                                     {"X-Test-Cut-After-Bytes", std::to_string(8 * mib)}},
                                    "{}")));
        const auto head = c.read_head(30s);
        REQUIRE(head);
        CHECK(head->status == 200);
        c.begin_body(*head);
        pattern_check check;
        const auto got = c.read_body(std::ref(check), 30s, 60s);
        CHECK_FALSE(got.complete);
        CHECK(check.offset < 64 * mib);
        CHECK_FALSE(check.first_bad);
        CHECK(c.wait_closed(10s));

        // on_upstream_uncertain: fail records the problem; the retry gets it, never a re-run.
        const auto retry = retry_after_first(p, "/cut/download", key);
        check_problem(retry, 502, "upstream.outcome_unknown");
        CHECK(retry.header("Idempotency-Status") == "replayed");
        CHECK(p.upstream.count(key) == 1);
    }

    TEST_CASE("an answer that is not recorded (5xx) streams too, and frees the key") {
        proxied p;
        const auto key = unique_key("released");
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(big_request("/big/failing", key, 4 * mib, "released-1", 2 * mib,
                                   {{"X-Test-Status", "503"}})));
        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 503);
        CHECK_FALSE(head->has_header("Idempotency-Status"));
        c.begin_body(*head);
        pattern_check check;
        const auto some =
            c.read_body_until([](std::string_view s) { return s.size() >= mib + 1; }, 5s);
        REQUIRE(some);
        check(*some);
        p.release("released-1");
        CHECK(c.read_body(std::ref(check), 30s, 60s).complete);
        CHECK(check.offset == 4 * mib);
        CHECK_FALSE(check.first_bad);

        // Released before the body went out: the retry runs again.
        const auto retry = fetch(p.proxy.port, "POST", "/big/failing",
                                 {{"Idempotency-Key", key}, {"X-Test-Body-Bytes", "10"}}, "{}");
        CHECK(retry.status == 200);
        CHECK(retry.header("Idempotency-Status") == "stored");
        CHECK(p.upstream.count(key) == 2);
    }

    TEST_CASE("a download slower than the lease: the lease is extended while the body streams") {
        proxied p(short_lease_route, "2s");
        const auto key = unique_key("slow");
        constexpr std::uint64_t total = 48 * mib;
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(make_request(
            "POST", "/lease/download",
            {{"Idempotency-Key", key}, {"X-Test-Body-Bytes", std::to_string(total)}}, "{}")));
        const auto head = c.read_head(30s);
        REQUIRE(head);
        CHECK(head->status == 200);
        c.begin_body(*head);
        // The caller takes about 4 s, twice the lease; a retry past the first lease's end must
        // find the key still in flight, not free to run again.
        pattern_check check;
        const auto start = clock_type::now();
        bool retried = false;
        while (check.offset < total && clock_type::now() - start < 60s) {
            const auto piece =
                c.read_body_until([](std::string_view s) { return s.size() >= 4 * mib; }, 10s);
            REQUIRE(piece);
            check(*piece);
            if (c.body_done()) {
                break;
            }
            // Real time is the subject: a slow reader, so the exchange outlives its first lease.
            std::this_thread::sleep_for(400ms);
            if (!retried && clock_type::now() - start > 3s) {
                retried = true;
                const auto during = fetch(p.proxy.port, "POST", "/lease/download",
                                          {{"Idempotency-Key", key}}, "{}");
                check_problem(during, 409, "idempotency.in_progress");
            }
        }
        CHECK(retried);
        CHECK(check.offset == total);
        CHECK_FALSE(check.first_bad);
        const auto retry = retry_after_first(p, "/lease/download", key);
        check_problem(retry, 409, "idempotency.response_not_replayable");
        CHECK(p.upstream.count(key) == 1);
    }
}
