// The plain (unguarded) path as a streaming HTTP/1.1 proxy, driven from outside: the real
// onceproxy binary and the real test upstream over loopback sockets. Bodies flow through bounded
// buffers both ways (the proxy's resident memory stays under a bound while 512 MiB pass), a
// response's first bytes reach the client while the upstream is still writing, chunked answers
// keep their trailers, WebSocket upgrades become tunnels, and limits can be set per route.
//
// Each case is built so that a proxy that buffers whole bodies fails it: held event streams are
// released by the test only after it has seen the first event, so no assertion depends on timing.

#include "support/stream_connection.hpp"

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/websocket_frames.hpp"

#include <doctest/doctest.h>

#include <boost/beast/core/string.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// Size of each large upload and download (the issue asks for 512 MiB). Lower it while iterating.
constexpr std::uint64_t large_body_bytes = std::uint64_t{512} << 20;

/// Peak resident memory the proxy may reach while a large body passes through it. A proxy that
/// holds a whole body needs at least large_body_bytes on top of its baseline; a streaming one
/// stays near its baseline (about 30 MiB under ASan) whatever the body size.
constexpr std::uint64_t rss_bound_kib = 160 * 1024;

/// A plain route without body limits, and a plain catch-all (the proxy_config default).
const char* const unlimited_route = R"(  - name: unlimited
    match: { prefix: /unlimited/ }
    upstream: app
    limits: { max_request_bytes: none, max_response_bytes: none }
)";

/// A test upstream and a proxy in front of it, configured by `c` (upstream port filled in). The
/// upstream timeout is long enough for 512 MiB under ASan.
struct proxied {
    upstream_process upstream;
    proxy_process proxy;
    explicit proxied(proxy_config c = {})
        : upstream(2), proxy(with_defaults(c), upstream.port, {}, small_asan_quarantine()) {}

    static std::string with_defaults(proxy_config& c) {
        c.upstream_settings.push_back("timeout: 300s");
        c.limits.push_back("drain_timeout: 300s"); // at least the upstream timeout
        return c.yaml();
    }

    /// Lets the held event stream `id` send its next event (POST /__release on the upstream).
    void release(const std::string& id) const {
        const auto r = fetch(upstream.port, "POST", "/__release?id=" + id);
        REQUIRE(r.status == 200);
    }
};

proxy_config with_routes(std::string routes) {
    proxy_config c;
    c.routes = std::move(routes);
    return c;
}

/// Byte i of an upload: a fixed pseudo-random block of a prime length repeated, so a lost,
/// repeated or reordered piece changes the digest.
class upload_pattern {
public:
    static constexpr std::size_t period = (std::size_t{1} << 20) + 7;
    static constexpr std::size_t max_piece = std::size_t{1} << 20;

    upload_pattern() : bytes_(period + max_piece, '\0') {
        std::uint64_t x = 0x9e3779b97f4a7c15ULL;
        for (std::size_t i = 0; i < period; ++i) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bytes_[i] = static_cast<char>(x >> 56);
        }
        for (std::size_t i = period; i < bytes_.size(); ++i) {
            bytes_[i] = bytes_[i - period];
        }
    }
    /// Bytes offset .. offset + n of the body (n <= max_piece).
    std::string_view piece(std::uint64_t offset, std::size_t n) const {
        return std::string_view(bytes_).substr(static_cast<std::size_t>(offset % period), n);
    }

private:
    std::string bytes_;
};

const upload_pattern& pattern() {
    static const upload_pattern p;
    return p;
}

/// FNV-1a of the first `n` bytes of the upload pattern.
std::string pattern_digest(std::uint64_t n) {
    fnv1a h;
    for (std::uint64_t off = 0; off < n;) {
        const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(n - off, 1 << 20));
        h.update(pattern().piece(off, len));
        off += len;
    }
    return h.hex();
}

/// Sends `n` bytes of the upload pattern as the body: raw when `chunked` is false, else as
/// chunks of varying sizes. Returns the digest of what was sent; nullopt if the proxy stopped
/// taking bytes.
std::optional<std::string> send_body(stream_connection& c, std::uint64_t n, bool chunked) {
    fnv1a sent;
    std::uint64_t off = 0;
    std::size_t round = 0;
    while (off < n) {
        // Chunks of about 1 MiB with a few tiny ones in between; raw bodies in 1 MiB writes.
        std::size_t len = chunked && round % 5 == 4 ? 17 : (std::size_t{1} << 20) - round % 3;
        len = static_cast<std::size_t>(std::min<std::uint64_t>(len, n - off));
        const auto piece = pattern().piece(off, len);
        if (chunked) {
            char size_line[32];
            const int w = std::snprintf(size_line, sizeof size_line, "%zx\r\n", len);
            if (!c.send(std::string_view(size_line, static_cast<std::size_t>(w)))) {
                return std::nullopt;
            }
        }
        if (!c.send(piece) || (chunked && !c.send("\r\n"))) {
            return std::nullopt;
        }
        sent.update(piece);
        off += len;
        ++round;
    }
    if (chunked && !c.send("0\r\n\r\n")) {
        return std::nullopt;
    }
    return sent.hex();
}

/// Reads a whole (small) response on `c`, skipping 1xx heads; nullopt on timeout or close.
std::optional<http_response> read_small_response(stream_connection& c,
                                                 std::chrono::milliseconds timeout,
                                                 bool head_request = false) {
    for (;;) {
        auto head = c.read_head(timeout);
        if (!head) {
            return std::nullopt;
        }
        if (head->status >= 100 && head->status < 200 && head->status != 101) {
            continue;
        }
        c.begin_body(*head, head_request);
        http_response r;
        r.status = head->status;
        r.headers = head->headers;
        const auto got = c.read_body([&](std::string_view p) { r.body.append(p); }, timeout);
        if (!got.complete) {
            return std::nullopt;
        }
        return r;
    }
}

std::string letters(std::size_t n) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) {
        s[i] = static_cast<char>('a' + i % 26);
    }
    return s;
}

/// Sum of every sample of metric `name` (any labels) in a Prometheus text exposition; nullopt
/// when there is none.
std::optional<double> metric(const std::string& exposition, const std::string& name) {
    std::optional<double> sum;
    std::size_t pos = 0;
    while (pos < exposition.size()) {
        auto eol = exposition.find('\n', pos);
        if (eol == std::string::npos) {
            eol = exposition.size();
        }
        const std::string_view line(exposition.data() + pos, eol - pos);
        pos = eol + 1;
        if (!line.starts_with(name) || line.size() <= name.size() ||
            (line[name.size()] != ' ' && line[name.size()] != '{')) {
            continue;
        }
        const auto space = line.rfind(' ');
        sum = sum.value_or(0) + std::stod(std::string(line.substr(space + 1)));
    }
    return sum;
}

/// Polls /metrics (bounded) until `name` sums to `want`; returns the last value seen.
std::optional<double> wait_for_metric(const proxy_process& proxy, const std::string& name,
                                      double want, std::chrono::milliseconds timeout = 5s) {
    std::optional<double> v;
    eventually(
        [&] {
            v = metric(proxy.admin("/metrics").body, name);
            return v && *v == want;
        },
        timeout);
    return v;
}

/// The opening handshake of RFC 6455 §1.3 for `target`, with `method` and `extra` fields.
std::string ws_handshake(const std::string& target, const std::string& method = "GET",
                         const std::string& extra = "") {
    return method + " " + target +
           " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: " +
           std::string(ws_sample_key) + "\r\nSec-WebSocket-Version: 13\r\n" + extra + "\r\n";
}

/// After a 101 on `c`: a text and a binary message come back as they were sent.
void check_echo(stream_connection& c) {
    const std::string text = "hello through the tunnel";
    REQUIRE(c.send(ws_client_frame(ws_opcode::text, text)));
    const auto t = read_ws_message(c, 5s);
    REQUIRE(t);
    CHECK(t->opcode == ws_opcode::text);
    CHECK(t->payload == text);

    // 70000 bytes: the 64-bit length form, every byte value.
    std::string binary(70000, '\0');
    for (std::size_t i = 0; i < binary.size(); ++i) {
        binary[i] = static_cast<char>(static_cast<unsigned char>(i * 7 & 0xff));
    }
    REQUIRE(c.send(ws_client_frame(ws_opcode::binary, binary)));
    const auto b = read_ws_message(c, 5s);
    REQUIRE(b);
    CHECK(b->opcode == ws_opcode::binary);
    CHECK(b->payload == binary);
}

/// Sends a close frame (1000) and expects the echo service's close back, then the connection
/// closed by the proxy.
void close_websocket(stream_connection& c) {
    REQUIRE(c.send(ws_client_frame(ws_opcode::close, std::string("\x03\xe8", 2))));
    const auto m = read_ws_message(c, 5s);
    REQUIRE(m);
    CHECK(m->opcode == ws_opcode::close);
    CHECK(c.wait_closed(5s));
}

} // namespace

TEST_SUITE("streaming: the test upstream itself") {

    // These talk to the test upstream directly: they pass today and show that a failure of the
    // proxied cases below comes from the proxy, not from the test machinery.

    TEST_CASE("a held event stream sends event 1, then each next event only once released") {
        upstream_process upstream;
        stream_connection c(upstream.port);
        REQUIRE(c.send(
            make_request("GET", "/sse", {{"X-Test-Events", "2"}, {"X-Test-Stream-Id", "direct"}})));
        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->header("Content-Type") == "text/event-stream");
        c.begin_body(*head);
        const auto first = c.read_body_until(
            [](std::string_view s) { return s.find("event-1\n\n") != s.npos; }, 5s);
        REQUIRE(first);
        CHECK(*first == "data: event-1\n\n"); // event 2 is not written before the release
        CHECK(fetch(upstream.port, "POST", "/__release?id=direct").status == 200);
        std::string rest;
        const auto done = c.read_body([&](std::string_view p) { rest.append(p); }, 5s);
        CHECK(done.complete);
        CHECK(rest == "data: event-2\n\n");
    }

    TEST_CASE("the upstream reports the FNV-1a digest of a streamed chunked upload") {
        upstream_process upstream;
        stream_connection c(upstream.port);
        constexpr std::uint64_t n = 8 << 20;
        REQUIRE(c.send("POST /digest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
        const auto sent = send_body(c, n, true);
        REQUIRE(sent);
        const auto r = read_small_response(c, 10s);
        REQUIRE(r);
        CHECK(json_member(r->body, "body_bytes") == std::to_string(n));
        CHECK(json_member(r->body, "body_fnv1a") == *sent);
        CHECK(*sent == pattern_digest(n));
    }

    TEST_CASE("a WebSocket upgrade on /ws gets 101 and an echo") {
        upstream_process upstream;
        stream_connection c(upstream.port);
        REQUIRE(c.send(ws_handshake("/ws")));
        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 101);
        CHECK(head->header("Sec-WebSocket-Accept") == ws_sample_accept);
        check_echo(c);
        close_websocket(c);
        CHECK(upstream.total() == 1);
    }
}

TEST_SUITE("streaming") {

    TEST_CASE("a 512 MiB upload streams through with bounded proxy memory") {
        proxied p(with_routes(unlimited_route));
        for (const bool chunked : {false, true}) {
            CAPTURE(chunked);
            stream_connection c(p.proxy.port);
            const std::string framing = chunked
                                            ? "Transfer-Encoding: chunked"
                                            : "Content-Length: " + std::to_string(large_body_bytes);
            REQUIRE(c.send("POST /unlimited/upload HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing +
                           "\r\n\r\n"));
            reset_peak_rss(p.proxy.proc.pid());
            const auto start = clock_type::now();
            const auto sent = send_body(c, large_body_bytes, chunked);
            const auto r = read_small_response(c, 60s);
            const auto peak = peak_rss_kib(p.proxy.proc.pid());
            const auto ms =
                std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start)
                    .count();
            MESSAGE("upload, " << std::string(chunked ? "chunked" : "Content-Length") << ": " << ms
                               << " ms, proxy peak RSS " << peak / 1024 << " MiB");
            REQUIRE_MESSAGE(sent, "the proxy stopped reading the body");
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(json_member(r->body, "body_bytes") == std::to_string(large_body_bytes));
            CHECK(json_member(r->body, "body_fnv1a") == *sent);
            CHECK(peak > 0);
            CHECK(peak < rss_bound_kib);
        }
        CHECK(p.upstream.total() == 2);
    }

    TEST_CASE("a 512 MiB download streams through with bounded proxy memory, reader paused") {
        proxied p(with_routes(unlimited_route));
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(make_request("GET", "/unlimited/download",
                                    {{"X-Test-Body-Bytes", std::to_string(large_body_bytes)}})));
        reset_peak_rss(p.proxy.proc.pid());
        const auto start = clock_type::now();
        const auto head = c.read_head(30s);
        REQUIRE(head);
        CHECK(head->status == 200);
        CHECK(head->header("Content-Length") == std::to_string(large_body_bytes));
        c.begin_body(*head);

        std::uint64_t offset = 0;
        std::optional<std::uint64_t> first_bad;
        const auto verify = [&](std::string_view piece) {
            for (std::size_t i = 0; i < piece.size() && !first_bad; ++i) {
                if (piece[i] != static_cast<char>('a' + (offset + i) % 26)) {
                    first_bad = offset + i;
                }
            }
            offset += piece.size();
        };
        // Read a little, then stop reading for a moment: a proxy without back-pressure keeps
        // pulling from the upstream meanwhile and holds what it cannot pass on.
        const auto some = c.read_body_until(
            [](std::string_view s) { return s.size() >= (std::size_t{4} << 20); }, 30s);
        REQUIRE(some);
        verify(*some);
        std::this_thread::sleep_for(1500ms); // real time is the subject: a client that stalls
        const auto got = c.read_body(verify, 30s, 600s);
        const auto peak = peak_rss_kib(p.proxy.proc.pid());
        MESSAGE("download: " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                    clock_type::now() - start)
                                    .count()
                             << " ms, proxy peak RSS " << peak / 1024 << " MiB");
        CHECK(got.complete);
        CHECK(offset == large_body_bytes);
        CHECK_FALSE(first_bad);
        CHECK(peak > 0);
        CHECK(peak < rss_bound_kib);
    }

    TEST_CASE("SSE: each event reaches the client while the upstream is still writing") {
        proxied p;
        stream_connection c(p.proxy.port);
        REQUIRE(c.send(make_request("GET", "/events",
                                    {{"Accept", "text/event-stream"},
                                     {"X-Test-Events", "3"},
                                     {"X-Test-Stream-Id", "sse-1"}})));
        // The upstream has written the head and event 1 and now waits for the test: a proxy
        // that waits for the whole answer shows nothing here.
        const auto head = c.read_head(5s);
        REQUIRE_MESSAGE(head, "no response head while the upstream holds the stream open");
        CHECK(head->status == 200);
        CHECK(head->header("Content-Type") == "text/event-stream");
        c.begin_body(*head);
        for (int i = 1; i <= 3; ++i) {
            CAPTURE(i);
            const std::string event = "data: event-" + std::to_string(i) + "\n\n";
            const auto got =
                c.read_body_until([&](std::string_view s) { return s.find(event) != s.npos; }, 5s);
            REQUIRE_MESSAGE(got, "event " << i << " did not reach the client before release");
            CHECK(*got == event);
            if (i < 3) {
                p.release("sse-1");
            }
        }
        std::string rest;
        const auto end = c.read_body([&](std::string_view s) { rest.append(s); }, 5s);
        CHECK(end.complete);
        CHECK(rest.empty());
        // The connection is still usable.
        REQUIRE(c.send(make_request("GET", "/after-sse")));
        const auto after = read_small_response(c, 5s);
        REQUIRE(after);
        CHECK(json_member(after->body, "path") == "/after-sse");
    }

    TEST_CASE("trailers of a chunked upstream answer reach an HTTP/1.1 client as trailers") {
        proxied p;
        SUBCASE("a whole chunked body") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(make_request("GET", "/trailer",
                                        {{"TE", "trailers"},
                                         {"X-Test-Trailer-Bytes", "12"},
                                         {"X-Test-Body-Bytes", "5000"}})));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            INFO("head: " << head->raw);
            CHECK(head->status == 200);
            CHECK(head->header("Transfer-Encoding") == "chunked");
            CHECK_FALSE(head->has_header("Content-Length"));
            CHECK_FALSE(head->has_header("X-Test-Trailer"));
            c.begin_body(*head);
            std::string body;
            const auto got = c.read_body([&](std::string_view s) { body.append(s); }, 5s);
            INFO("trailer section: " << got.raw_trailer);
            CHECK(got.complete);
            CHECK_FALSE(got.framing_error);
            CHECK(body == letters(5000));
            REQUIRE(got.trailers.size() == 1);
            CHECK(got.trailers[0].first == "X-Test-Trailer");
            CHECK(got.trailers[0].second == std::string(12, 't'));
        }
        SUBCASE("a held stream: events first, the trailer after the last one") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(make_request("GET", "/trailer-events",
                                        {{"TE", "trailers"},
                                         {"X-Test-Trailer-Bytes", "5"},
                                         {"X-Test-Events", "2"},
                                         {"X-Test-Stream-Id", "trailer-1"}})));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            CHECK(head->header("Transfer-Encoding") == "chunked");
            CHECK_FALSE(head->has_header("X-Test-Trailer"));
            c.begin_body(*head);
            const auto first = c.read_body_until(
                [](std::string_view s) { return s.find("event-1\n\n") != s.npos; }, 5s);
            REQUIRE(first);
            p.release("trailer-1");
            std::string rest;
            const auto got = c.read_body([&](std::string_view s) { rest.append(s); }, 5s);
            CHECK(got.complete);
            CHECK(rest == "data: event-2\n\n");
            REQUIRE(got.trailers.size() == 1);
            CHECK(got.trailers[0].second == "ttttt");
        }
        // The connection goes on after the trailer section (framing was kept exactly).
    }

    TEST_CASE("an HTTP/1.0 client gets a chunked upstream answer close-delimited") {
        proxied p;
        SUBCASE("a whole chunked body") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send("GET /old HTTP/1.0\r\nHost: 127.0.0.1\r\nX-Test-Chunked: 1\r\n"
                           "X-Test-Body-Bytes: 100000\r\n\r\n"));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            INFO("head: " << head->raw);
            CHECK(head->status == 200);
            CHECK_FALSE(head->has_header("Transfer-Encoding"));
            c.begin_body(*head);
            std::string body;
            const auto got = c.read_body([&](std::string_view s) { body.append(s); }, 5s);
            CHECK(got.complete);
            // Close-delimited or, for a proxy that knows the length, Content-Length; never
            // chunk-size lines inside the body.
            CHECK(body == letters(100000));
            CHECK(c.wait_closed(5s));
        }
        SUBCASE("a held stream: event 1 arrives before the upstream is done") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send("GET /old-events HTTP/1.0\r\nHost: 127.0.0.1\r\nX-Test-Events: 2\r\n"
                           "X-Test-Stream-Id: old-1\r\n\r\n"));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            INFO("head: " << head->raw);
            CHECK(head->status == 200);
            CHECK_FALSE(head->has_header("Transfer-Encoding"));
            CHECK_FALSE(head->has_header("Content-Length"));
            c.begin_body(*head);
            CHECK(c.body().framing == body_framing::close);
            const auto first = c.read_body_until(
                [](std::string_view s) { return s.find("event-1\n\n") != s.npos; }, 5s);
            REQUIRE(first);
            CHECK(*first == "data: event-1\n\n");
            p.release("old-1");
            std::string rest;
            const auto got = c.read_body([&](std::string_view s) { rest.append(s); }, 5s);
            CHECK(got.complete); // the proxy closed after the last byte
            CHECK(rest == "data: event-2\n\n");
        }
    }

    TEST_CASE("Expect: 100-continue with a large body on a plain route") {
        proxied p(with_routes(unlimited_route));
        constexpr std::uint64_t n = std::uint64_t{64} << 20;
        SUBCASE("the client waits for 100 Continue before sending the body") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send("POST /unlimited/expect HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Content-Length: " +
                           std::to_string(n) + "\r\nExpect: 100-continue\r\n\r\n"));
            const auto interim = c.read_head(5s);
            REQUIRE_MESSAGE(interim, "no 100 Continue: a client that waits for it would hang");
            CHECK(interim->status == 100);
            const auto sent = send_body(c, n, false);
            REQUIRE(sent);
            const auto r = read_small_response(c, 60s);
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(json_member(r->body, "body_bytes") == std::to_string(n));
            CHECK(json_member(r->body, "body_fnv1a") == *sent);
        }
        SUBCASE("the client sends the body without waiting") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send("POST /unlimited/expect HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Content-Length: " +
                           std::to_string(n) + "\r\nExpect: 100-continue\r\n\r\n"));
            const auto sent = send_body(c, n, false);
            REQUIRE(sent);
            const auto r = read_small_response(c, 60s); // a 100 Continue, if any, is skipped
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(json_member(r->body, "body_fnv1a") == *sent);
        }
    }

    TEST_CASE("pipelining: requests behind a streamed one are answered in order") {
        proxied p(with_routes(unlimited_route));
        stream_connection c(p.proxy.port);
        // Small enough to sit in the socket buffers: a proxy need not read request 2 while it
        // streams response 1, and the test releases response 1 only after sending everything.
        constexpr std::uint64_t n = 48 * 1024;
        // A held event stream, a chunked upload, a plain GET, sent before any answer is read.
        std::string first = make_request("GET", "/pipe/1",
                                         {{"X-Test-Events", "2"}, {"X-Test-Stream-Id", "pipe-1"}});
        first += "POST /unlimited/pipe/2 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n";
        REQUIRE(c.send(first));
        const auto sent = send_body(c, n, true);
        REQUIRE(sent);
        REQUIRE(c.send(make_request("GET", "/pipe/3")));

        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->header("Content-Type") == "text/event-stream");
        c.begin_body(*head);
        const auto event = c.read_body_until(
            [](std::string_view s) { return s.find("event-1\n\n") != s.npos; }, 5s);
        REQUIRE_MESSAGE(event, "the first response did not stream while requests queued behind it");
        p.release("pipe-1");
        std::string rest;
        CHECK(c.read_body([&](std::string_view s) { rest.append(s); }, 5s).complete);
        CHECK(rest == "data: event-2\n\n");

        const auto second = read_small_response(c, 30s);
        REQUIRE(second);
        CHECK(json_member(second->body, "path") == "/unlimited/pipe/2");
        CHECK(json_member(second->body, "body_fnv1a") == *sent);
        const auto third = read_small_response(c, 5s);
        REQUIRE(third);
        CHECK(json_member(third->body, "path") == "/pipe/3");
        CHECK(p.upstream.total() == 3);
    }

    TEST_CASE("HEAD and 304 answers carry no body, even for a huge Content-Length") {
        proxied p(with_routes(unlimited_route));
        stream_connection c(p.proxy.port);
        // 3 GiB announced: a proxy that pre-checks the length against a buffer or waits for a
        // body fails here.
        REQUIRE(
            c.send(make_request("HEAD", "/unlimited/huge",
                                {{"X-Test-Body-Bytes", std::to_string(std::uint64_t{3} << 30)}})));
        const auto head = read_small_response(c, 5s, true);
        REQUIRE(head);
        CHECK(head->status == 200);
        CHECK(head->header("Content-Length") == std::to_string(std::uint64_t{3} << 30));
        REQUIRE(c.send(make_request("GET", "/unlimited/not-modified", {{"X-Test-Status", "304"}})));
        const auto nm = read_small_response(c, 5s);
        REQUIRE(nm);
        CHECK(nm->status == 304);
        CHECK(nm->body.empty());
        REQUIRE(c.send(make_request("GET", "/after")));
        const auto after = read_small_response(c, 5s);
        REQUIRE(after);
        CHECK(json_member(after->body, "path") == "/after");
    }

    TEST_CASE("WebSocket on a plain route: 101, echo through the tunnel, tunnel metrics") {
        proxied p;
        {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(ws_handshake("/ws")));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            INFO("head: " << head->raw);
            REQUIRE(head->status == 101);
            CHECK(head->header("Sec-WebSocket-Accept") == ws_sample_accept);
            CHECK(boost::beast::iequals(head->header("Upgrade"), "websocket"));
            check_echo(c);

            CHECK(wait_for_metric(p.proxy, "onceproxy_tunnels_open", 1) == 1.0);
            CHECK(metric(p.proxy.admin("/metrics").body, "onceproxy_tunnels_total") == 1.0);
            close_websocket(c);
        }
        CHECK(wait_for_metric(p.proxy, "onceproxy_tunnels_open", 0) == 0.0);
        CHECK(metric(p.proxy.admin("/metrics").body, "onceproxy_tunnels_total") == 1.0);
        CHECK(p.upstream.total() == 1);
    }

    TEST_CASE("WebSocket on a guarded route: GET upgrades, a guarded POST never does") {
        proxy_config cfg = with_routes(R"(  - name: guarded
    match: { prefix: /guarded/ }
    upstream: app
    idempotency: { mode: required, lease: 300s }
)");
        proxied p(cfg);
        {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(ws_handshake("/guarded/ws")));
            const auto head = c.read_head(5s);
            REQUIRE(head);
            REQUIRE(head->status == 101);
            check_echo(c);
            close_websocket(c);
        }
        {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(ws_handshake("/guarded/ws", "POST",
                                        "Idempotency-Key: \"ws-post-1\"\r\n"
                                        "Content-Type: application/json\r\nContent-Length: 2\r\n") +
                           "{}"));
            const auto r = read_small_response(c, 5s);
            REQUIRE_MESSAGE(r, "a guarded POST with Upgrade got no HTTP answer");
            INFO("status " << r->status << ", body " << r->body);
            CHECK(r->status != 101);
            CHECK(r->status >= 200);
            CHECK(r->status < 600);
        }
        CHECK(wait_for_metric(p.proxy, "onceproxy_tunnels_open", 0) == 0.0);
        CHECK(metric(p.proxy.admin("/metrics").body, "onceproxy_tunnels_total") == 1.0);
    }

    TEST_CASE("per-route limits: max_request_bytes and max_response_bytes") {
        proxy_config cfg = with_routes(R"(  - name: small
    match: { prefix: /small/ }
    upstream: app
    limits: { max_request_bytes: 1KiB, max_response_bytes: 1KiB }
)" + std::string(unlimited_route));
        cfg.limits = {"max_request_bytes: 4KiB"};
        proxied p(cfg);

        SUBCASE("a route limit below the global one: 413 request.too_large") {
            check_problem(fetch(p.proxy.port, "POST", "/small/x", {}, std::string(2048, 'x')), 413,
                          "request.too_large");
            CHECK(p.upstream.total() == 0);
            const auto ok = fetch(p.proxy.port, "POST", "/small/x", {}, std::string(1024, 'x'));
            CHECK(ok.status == 200);
            CHECK(json_member(ok.body, "body_bytes") == "1024");
        }
        SUBCASE("routes without limits inherit the global one") {
            check_problem(fetch(p.proxy.port, "POST", "/other", {}, std::string(8192, 'x')), 413,
                          "request.too_large");
            CHECK(fetch(p.proxy.port, "POST", "/other", {}, std::string(2048, 'x')).status == 200);
        }
        SUBCASE("none: a body far above the global limit passes whole") {
            const std::string body(256 * 1024, 'z');
            const auto r = fetch(p.proxy.port, "POST", "/unlimited/big", {}, body);
            CHECK(r.status == 200);
            CHECK(json_member(r.body, "body_bytes") == std::to_string(body.size()));
            fnv1a h;
            h.update(body);
            CHECK(json_member(r.body, "body_fnv1a") == h.hex());
        }
        SUBCASE("a Content-Length response over the route limit: 502 upstream.bad_response") {
            check_problem(fetch(p.proxy.port, "GET", "/small/big", {{"X-Test-Body-Bytes", "1500"}}),
                          502, "upstream.bad_response");
            CHECK(fetch(p.proxy.port, "GET", "/small/fits", {{"X-Test-Body-Bytes", "1000"}})
                      .body.size() == 1000);
        }
        SUBCASE("a chunked response over the route limit: 502, or cut short and closed") {
            stream_connection c(p.proxy.port);
            REQUIRE(c.send(make_request("GET", "/small/big-chunked",
                                        {{"X-Test-Chunked", "1"}, {"X-Test-Body-Bytes", "1500"}})));
            const auto head = c.read_head(5s);
            if (head && head->status == 502) {
                c.begin_body(*head);
                std::string body;
                c.read_body([&](std::string_view s) { body.append(s); }, 5s);
                CHECK(json_member(body, "code") == "upstream.bad_response");
            } else {
                // The head went out before the limit was crossed: the body must not look complete.
                if (head) {
                    c.begin_body(*head);
                    std::uint64_t bytes = 0;
                    const auto got =
                        c.read_body([&](std::string_view s) { bytes += s.size(); }, 5s);
                    CHECK_FALSE(got.complete);
                    CHECK(bytes <= 1024);
                }
                CHECK(c.wait_closed(5s));
            }
        }
    }

    TEST_CASE("--check-config: limits none is refused on a guarded route, with file:line:col") {
        temp_dir dir;
        const std::string head = "listen: 127.0.0.1:0\n"                    // 1
                                 "upstreams:\n"                             // 2
                                 "  app:\n"                                 // 3
                                 "    url: http://127.0.0.1:1\n"            // 4
                                 "routes:\n";                               // 5
        const std::string guarded = "  - name: pay\n"                       // 6
                                    "    match: { prefix: /pay }\n"         // 7
                                    "    upstream: app\n"                   // 8
                                    "    idempotency: { mode: required }\n" // 9
                                    "    limits:\n"                         // 10
                                    "      max_request_bytes: none\n"       // 11
                                    "      max_response_bytes: none\n";     // 12
        const std::string plain = "  - name: rest\n"
                                  "    match: { prefix: / }\n"
                                  "    upstream: app\n"
                                  "    limits:\n"
                                  "      max_request_bytes: none\n"
                                  "      max_response_bytes: none\n";
        SUBCASE("guarded route: both lines reported") {
            const auto bad = dir.write("bad.yaml", head + guarded + plain);
            const auto [status, out] = run_cli({"--check-config", bad});
            CAPTURE(out);
            CHECK(status != 0);
            CHECK(status != -1);
            CHECK(out.find(bad + ":11:") != std::string::npos);
            CHECK(out.find(bad + ":12:") != std::string::npos);
            CHECK(out.find(bad + ":17:") == std::string::npos); // `none` is fine on a plain route
        }
        SUBCASE("plain route only: valid") {
            const auto good = dir.write("good.yaml", head + plain);
            const auto [status, out] = run_cli({"--check-config", good});
            CAPTURE(out);
            CHECK(status == 0);
        }
    }

} // TEST_SUITE
