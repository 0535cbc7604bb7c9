// The upstream keep-alive pool against long-lived and misbehaving upstream connections (issue
// 26), driven from outside: the real onceproxy binary and the real test upstream over loopback.
//
// - WebSocket tunnels count against the upstream's max_tunnels, apart from the max_connections
//   slots of ordinary requests: idle tunnels never starve ordinary requests, and a full pool or a
//   full tunnel budget is reported as such (not as an unreachable upstream).
// - Long transfers (a slow download) move to that same budget once they have lasted a second,
//   freeing their ordinary slots.
// - An idle pooled connection on which the upstream writes an answer nobody asked for is closed,
//   so no later request (of another client) receives that answer; a 101 the proxy did not ask
//   for never puts its connection back into the pool.
//
// One worker, so the per-worker limits are the whole proxy's.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/proxy_fixture.hpp"
#include "support/stream_connection.hpp"
#include "support/websocket_frames.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// The opening handshake of RFC 6455 §1.3 for `target`.
std::string ws_handshake(const std::string& target) {
    return "GET " + target +
           " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: " +
           std::string(ws_sample_key) + "\r\nSec-WebSocket-Version: 13\r\n\r\n";
}

/// A text message through the tunnel and its echo back.
void check_echo(stream_connection& c, const std::string& text) {
    REQUIRE(c.send(ws_client_frame(ws_opcode::text, text)));
    const auto m = read_ws_message(c, 5s);
    REQUIRE(m);
    CHECK(m->opcode == ws_opcode::text);
    CHECK(m->payload == text);
}

/// Polls /metrics (bounded) until `series` reads `want`; returns the last value seen.
long long wait_for_metric(const proxy_process& proxy, const std::string& series, long long want,
                          std::chrono::milliseconds timeout = 5s) {
    long long v = -1;
    eventually(
        [&] {
            v = proxy.metric(series);
            return v == want;
        },
        timeout);
    return v;
}

/// Polls the test upstream (bounded) until it has executed `want` requests.
bool wait_for_executions(const upstream_process& upstream, std::uint64_t want) {
    return eventually([&] { return upstream.total() >= want; }, 5s, 10ms);
}

/// A GET of `path` on a fresh client connection answered by the upstream for that very
/// request: 200, its own path echoed, no stray answer.
void check_own_answer(unsigned short port, const std::string& path) {
    const auto r = fetch(port, "GET", path);
    INFO("GET " << path << ": status " << r.status << ", body " << r.body);
    CHECK(r.status == 200);
    CHECK_FALSE(r.has_header("X-Test-Stray"));
    CHECK(r.body.find("unsolicited-stray") == std::string::npos);
    CHECK(json_member(r.body, "path") == path);
}

} // namespace

TEST_SUITE("upstream pool") {

    TEST_CASE("idle WebSocket tunnels do not take the slots of ordinary requests") {
        upstream_process upstream(2);
        proxy_config cfg;
        cfg.upstream_port = upstream.port;
        cfg.workers = 1;
        cfg.upstream_settings = {"max_connections: 4", "max_tunnels: 8", "connect_timeout: 300ms"};
        proxy_process proxy(cfg.yaml());

        // Twice max_connections idle tunnels: each gets its own connection outside the pool.
        std::vector<std::unique_ptr<stream_connection>> tunnels;
        for (int i = 0; i < 8; ++i) {
            auto c = std::make_unique<stream_connection>(proxy.port);
            REQUIRE(c->send(ws_handshake("/ws")));
            const auto head = c->read_head(5s);
            REQUIRE_MESSAGE(head, "tunnel " << i << " got no answer");
            INFO("tunnel " << i << ": " << head->raw);
            REQUIRE(head->status == 101);
            tunnels.push_back(std::move(c));
        }
        CHECK(wait_for_metric(proxy, "onceproxy_tunnels_open", 8) == 8);

        // Ordinary requests still find their four slots, several at once.
        std::vector<std::unique_ptr<http_client>> clients;
        for (int i = 0; i < 4; ++i) {
            clients.push_back(std::make_unique<http_client>(proxy.port));
            clients.back()->send_raw(
                make_request("GET", "/slow/" + std::to_string(i), {{"X-Test-Delay-Ms", "200"}}));
        }
        for (int i = 0; i < 4; ++i) {
            const auto r = clients[static_cast<std::size_t>(i)]->read_response(5s);
            REQUIRE(r);
            INFO("body " << r->body);
            CHECK(r->status == 200);
            CHECK(json_member(r->body, "path") == "/slow/" + std::to_string(i));
        }
        for (int i = 0; i < 12; ++i) {
            check_own_answer(proxy.port, "/plain/" + std::to_string(i));
        }

        // The ninth tunnel is over max_tunnels: a 503 of its own, nothing sent upstream.
        const auto before = upstream.total();
        {
            http_client c(proxy.port);
            c.send_raw(ws_handshake("/ws"));
            const auto r = c.read_response(5s);
            REQUIRE(r);
            check_problem(*r, 503, "upstream.tunnel_limit");
            CHECK(r->header("Retry-After") == "1");
            CHECK(json_member(r->body, "detail").find("tunnel limit of upstream 'app' reached") !=
                  std::string::npos);
        }
        CHECK(upstream.total() == before);
        CHECK(proxy.metric("onceproxy_tunnels_refused_total") == 1);

        // The open tunnels still work; one closing frees a place for a new one.
        check_echo(*tunnels.front(), "still open");
        check_echo(*tunnels.back(), "also open");
        tunnels.pop_back();
        CHECK(wait_for_metric(proxy, "onceproxy_tunnels_open", 7) == 7);
        stream_connection again(proxy.port);
        REQUIRE(again.send(ws_handshake("/ws")));
        const auto head = again.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 101);
        check_echo(again, "a new tunnel");
    }

    TEST_CASE("slow downloads do not take the slots of ordinary requests") {
        upstream_process upstream(2);
        proxy_config cfg;
        cfg.upstream_port = upstream.port;
        cfg.workers = 1;
        cfg.upstream_settings = {"max_connections: 2", "max_tunnels: 16", "connect_timeout: 2s"};
        cfg.routes = R"(  - name: downloads
    match: { prefix: /download/ }
    upstream: app
    limits: { max_response_bytes: none }
)";
        proxy_process proxy(cfg.yaml());

        // Twice max_connections downloads of about 5 s each (a 64 KiB piece every 50 ms). The
        // first two take both ordinary slots; after long_transfer_after (1 s) they move to the
        // long-transfer budget, and the other two, queued meanwhile, get the slots they freed.
        constexpr std::uint64_t size = std::uint64_t{6} << 20;
        std::vector<std::unique_ptr<stream_connection>> downloads;
        for (int i = 0; i < 4; ++i) {
            auto c = std::make_unique<stream_connection>(proxy.port);
            REQUIRE(c->send(make_request(
                "GET", "/download/" + std::to_string(i),
                {{"X-Test-Body-Bytes", std::to_string(size)}, {"X-Test-Slow-Body-Ms", "50"}})));
            downloads.push_back(std::move(c));
        }
        const auto started = clock_type::now();
        for (int i = 0; i < 4; ++i) {
            auto& c = *downloads[static_cast<std::size_t>(i)];
            const auto head = c.read_head(5s);
            REQUIRE_MESSAGE(head, "download " << i << " got no answer");
            INFO("download " << i << ": " << head->raw);
            REQUIRE(head->status == 200);
            c.begin_body(*head);
        }

        // Once all four have lasted over a second, ordinary requests find both slots free
        // while the downloads go on. Real time is the subject: how long the downloads have lasted.
        std::this_thread::sleep_until(started + 2500ms);
        std::vector<std::unique_ptr<http_client>> clients;
        for (int i = 0; i < 2; ++i) {
            clients.push_back(std::make_unique<http_client>(proxy.port));
            clients.back()->send_raw(
                make_request("GET", "/slow/" + std::to_string(i), {{"X-Test-Delay-Ms", "100"}}));
        }
        for (int i = 0; i < 2; ++i) {
            const auto r = clients[static_cast<std::size_t>(i)]->read_response(5s);
            REQUIRE(r);
            INFO("body " << r->body);
            CHECK(r->status == 200);
            CHECK(json_member(r->body, "path") == "/slow/" + std::to_string(i));
        }
        check_own_answer(proxy.port, "/plain/0");
        CHECK(clock_type::now() - started < 4s); // well before the downloads end

        // The downloads themselves are whole, and their connections find their way back.
        for (int i = 0; i < 4; ++i) {
            const auto got = downloads[static_cast<std::size_t>(i)]->read_body(
                [](std::string_view) {}, 10s, 30s);
            INFO("download " << i);
            CHECK(got.complete);
            CHECK(got.bytes == size);
        }
        for (int i = 1; i < 6; ++i) {
            check_own_answer(proxy.port, "/plain/" + std::to_string(i));
        }
    }

    TEST_CASE("a route's limits.max_tunnels bounds its upgrades, all workers together") {
        upstream_process upstream(2);
        proxy_config cfg;
        cfg.upstream_port = upstream.port;
        cfg.workers = 2;
        cfg.routes = R"(  - name: chat
    match: { prefix: /chat/ }
    upstream: app
    limits: { max_tunnels: 2 }
)";
        proxy_process proxy(cfg.yaml());

        std::vector<std::unique_ptr<stream_connection>> chats;
        for (int i = 0; i < 2; ++i) {
            auto c = std::make_unique<stream_connection>(proxy.port);
            REQUIRE(c->send(ws_handshake("/chat/ws")));
            const auto head = c->read_head(5s);
            REQUIRE(head);
            REQUIRE(head->status == 101);
            chats.push_back(std::move(c));
        }
        for (int i = 0; i < 3; ++i) { // whichever worker takes it
            http_client c(proxy.port);
            c.send_raw(ws_handshake("/chat/ws"));
            const auto r = c.read_response(5s);
            REQUIRE(r);
            check_problem(*r, 503, "upstream.tunnel_limit");
            CHECK(json_member(r->body, "detail").find("tunnel limit of route 'chat' reached") !=
                  std::string::npos);
        }
        CHECK(proxy.metric("onceproxy_tunnels_refused_total") == 3);

        // Other routes are not bound by it; a closed chat tunnel frees its place.
        stream_connection other(proxy.port);
        REQUIRE(other.send(ws_handshake("/ws")));
        auto head = other.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 101);
        chats.pop_back();
        CHECK(wait_for_metric(proxy, "onceproxy_tunnels_open", 2) == 2);
        stream_connection again(proxy.port);
        REQUIRE(again.send(ws_handshake("/chat/ws")));
        head = again.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 101);
        check_echo(again, "a place was free");
    }

    TEST_CASE("a full pool is reported as the upstream's connection limit, not as unreachable") {
        upstream_process upstream(2);
        proxy_config cfg;
        cfg.upstream_port = upstream.port;
        cfg.workers = 1;
        cfg.upstream_settings = {"max_connections: 1", "connect_timeout: 300ms"};
        cfg.routes = R"(  - name: guarded
    match: { prefix: /guarded/ }
    upstream: app
    idempotency: { mode: required }
)";
        proxy_process proxy(cfg.yaml());

        // The one slot is held by a slow request (the upstream has it: the event waited for).
        http_client holder(proxy.port);
        holder.send_raw(make_request("GET", "/held", {{"X-Test-Delay-Ms", "3000"}}));
        REQUIRE(wait_for_executions(upstream, 1));

        const auto plain = fetch(proxy.port, "GET", "/plain");
        check_problem(plain, 502, "upstream.unavailable");
        CHECK(
            json_member(plain.body, "detail").find("connection limit of upstream 'app' reached") !=
            std::string::npos);

        const auto guarded = fetch(
            proxy.port, "POST", "/guarded/pay",
            {{"Idempotency-Key", "\"pool-full-1\""}, {"Content-Type", "application/json"}}, "{}");
        check_problem(guarded, 502, "upstream.unavailable");
        CHECK(json_member(guarded.body, "detail")
                  .find("connection limit of upstream 'app' reached") != std::string::npos);
        CHECK(upstream.total() == 1); // neither was sent

        const auto held = holder.read_response(10s);
        REQUIRE(held);
        CHECK(held->status == 200);
    }

    TEST_CASE("an unsolicited answer on an idle pooled connection reaches no later request") {
        upstream_process upstream;
        proxy_config cfg;
        cfg.upstream_port = upstream.port;
        cfg.workers = 1;
        proxy_process proxy(cfg.yaml());

        // The upstream answers, then 300 ms later writes a second answer nobody asked for.
        const auto first = fetch(proxy.port, "GET", "/first", {{"X-Test-Stray-After-Ms", "300"}});
        REQUIRE(first.status == 200);
        CHECK(json_member(first.body, "path") == "/first");
        // Real time is the subject: the stray answer is written 300 ms after the first one, while
        // the connection sits idle in the pool. Waiting well past it puts every later request
        // after the stray bytes arrived.
        std::this_thread::sleep_for(900ms);

        // Safe requests of other clients take pooled connections without a peek: none of them
        // may read the stray answer (or, after it, the answer of the request before it).
        for (int i = 0; i < 12; ++i) {
            check_own_answer(proxy.port, "/later/" + std::to_string(i));
        }
    }

    TEST_CASE("a 101 no request asked for never puts its connection back into the pool") {
        upstream_process upstream;
        proxy_config cfg;
        cfg.upstream_port = upstream.port;
        cfg.workers = 1;
        cfg.routes = R"(  - name: guarded
    match: { prefix: /guarded/ }
    upstream: app
    idempotency: { mode: required }
)";
        proxy_process proxy(cfg.yaml());

        // A guarded POST never asks for an upgrade, yet this upstream switches protocols and,
        // a second later, writes bytes that are not an answer to anything.
        const auto odd = fetch(proxy.port, "POST", "/guarded/switch",
                               {{"Idempotency-Key", "\"switch-1\""},
                                {"Content-Type", "application/json"},
                                {"X-Test-Status", "101"},
                                {"X-Test-Stray-After-Ms", "1000"}},
                               "{}");
        INFO("status " << odd.status << ", body " << odd.body);
        CHECK(odd.status != 101);
        CHECK(odd.status >= 500);

        // At once (before the stray bytes come): these must not go over that connection.
        for (int i = 0; i < 3; ++i) {
            check_own_answer(proxy.port, "/after-101/" + std::to_string(i));
        }
    }
}
