// HTTP/2 inbound (issue 28) with real HTTP/2 clients against the real binary: curl (prior
// knowledge on the plain listener, ALPN on the TLS one), nghttp (many streams on one
// connection) and a small Python client (tests/integration/h2/probe.py, on hyperframe and hpack
// from python3-h2) that sends raw frames, hostile ones included, and prints what it observed.
// Every assertion is something a client, the upstream, the access log or /metrics shows.
//
// One proxy serves most cases (starting binaries under the sanitizers is the slow part); the
// cases that need another config (http2 switched off, TLS, small limits) start their own.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/stream_connection.hpp"
#include "support/test_pki.hpp"
#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

/// The full path of program `name` (process() runs a path, it does not search PATH).
std::string which(const std::string& name) {
    auto r = run_command({"sh", "-c", "command -v " + shell_quote(name)});
    while (!r.output.empty() && r.output.back() == '\n') {
        r.output.pop_back();
    }
    REQUIRE_MESSAGE(r.status == 0, "no " << name << " on PATH");
    return r.output;
}

/// A python3 that has hyperframe and hpack (python3-h2's dependencies): the one on PATH, else
/// the system one (a python3 of a version manager may lack Debian's python3-h2).
const std::string& python() {
    static const std::string found = [] {
        for (const char* p : {"python3", "/usr/bin/python3"}) {
            if (run_command({p, "-c", "import hyperframe, hpack"}).status == 0) {
                return which(p);
            }
        }
        return std::string();
    }();
    REQUIRE_MESSAGE(!found.empty(), "no python3 with hyperframe and hpack (python3-h2)");
    return found;
}

const std::string probe_script =
    std::string(ONCEPROXY_SOURCE_DIR) + "/tests/integration/h2/probe.py";

/// Runs a probe.py scenario against the plain listener `port`; its output lines.
std::string probe(const std::string& scenario, unsigned short port,
                  const std::vector<std::string>& args = {}) {
    std::vector<std::string> argv{python(), probe_script, scenario, std::to_string(port)};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_command(argv);
    INFO("probe " << scenario << ": " << r.output);
    CHECK(r.status == 0);
    return r.output;
}

bool has_line(const std::string& output, const std::string& line) {
    std::istringstream in(output);
    std::string l;
    while (std::getline(in, l)) {
        if (l == line) {
            return true;
        }
    }
    return false;
}

/// What curl saw: the protocol (%{http_version}: "2", "1.1"), the last response head (with any
/// trailer fields, which curl writes after it) and the body.
struct curl_result {
    int exit = -1;
    std::string version;
    http_response response;
    std::string output; ///< curl's own messages and the -w text
};

/// curl `args` (method, headers, ...) on `url`; heads and body go to files in a fresh
/// directory and are parsed back.
curl_result curl(const std::string& url, std::vector<std::string> args = {}) {
    temp_dir dir;
    std::vector<std::string> argv{"curl", "-sS",
                                  "-m",   "30",
                                  "-D",   dir.file("head"),
                                  "-o",   dir.file("body"),
                                  "-w",   "version=%{http_version}\n"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(url);
    const auto r = run_command(argv);
    curl_result out;
    out.exit = r.status;
    out.output = r.output;
    const auto at = r.output.find("version=");
    if (at != std::string::npos) {
        out.version = r.output.substr(at + 8, r.output.find('\n', at) - at - 8);
    }
    // The last head: lines from the last status line on ("HTTP/2 200", "HTTP/1.1 200 OK").
    std::istringstream in(read_file(dir.file("head")));
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') {
            line.pop_back();
        }
        if (line.rfind("HTTP/", 0) == 0) {
            out.response = http_response{};
            const auto sp = line.find(' ');
            out.response.status = static_cast<unsigned>(std::stoul(line.substr(sp + 1)));
        } else if (const auto colon = line.find(':'); colon != std::string::npos) {
            auto value = line.substr(colon + 1);
            value.erase(0, value.find_first_not_of(' '));
            out.response.headers.emplace_back(line.substr(0, colon), value);
        }
    }
    out.response.body = read_file(dir.file("body"));
    return out;
}

std::string h2c_url(unsigned short port, const std::string& path) {
    return "http://127.0.0.1:" + std::to_string(port) + path;
}

/// curl with HTTP/2 prior knowledge (h2c) on the plain listener.
curl_result h2c(unsigned short port, const std::string& path, std::vector<std::string> args = {}) {
    args.insert(args.begin(), "--http2-prior-knowledge");
    return curl(h2c_url(port, path), std::move(args));
}

/// curl with HTTP/1.1 on the plain listener.
curl_result h1(unsigned short port, const std::string& path, std::vector<std::string> args = {}) {
    args.insert(args.begin(), "--http1.1");
    return curl(h2c_url(port, path), std::move(args));
}

std::string label(const std::string& family, const std::string& name, const std::string& value) {
    return family + "{" + name + "=\"" + value + "\"}";
}

/// A metric that is absent counts as 0.
long long counter(const proxy_process& p, const std::string& series) {
    const auto v = p.metric(series);
    return v < 0 ? 0 : v;
}

long long goaways(const proxy_process& p, const std::string& reason) {
    return counter(p, label("onceproxy_http2_goaways_total", "reason", reason));
}

/// A plain route without body limits, a guarded route, and the plain catch-all.
const char* const routes = R"(  - name: unlimited
    match: { prefix: /unlimited/ }
    upstream: app
    limits: { max_request_bytes: none, max_response_bytes: none }
  - name: payments
    match: { path: /v1/payments }
    upstream: app
    idempotency: { mode: required }
)";

/// The upstream and the proxy most cases share. Small limits where a defence needs one:
/// max_header_bytes 8 KiB (the 431 case); the access log on.
struct shared_proxy {
    upstream_process upstream{2};
    proxy_process proxy;
    shared_proxy() : proxy(config(upstream.port), 0, {}, small_asan_quarantine()) {}

    static std::string config(unsigned short upstream_port) {
        proxy_config c;
        c.upstream_port = upstream_port;
        c.access_log = true;
        c.routes = routes;
        c.upstream_settings.push_back("timeout: 30s");
        c.limits.push_back("max_header_bytes: 8KiB");
        c.limits.push_back("drain_timeout: 30s");
        c.top = "defaults:\n  lease: 30s\n";
        return c.yaml();
    }

    void release(const std::string& id) const {
        REQUIRE(fetch(upstream.port, "POST", "/__release?id=" + id).status == 200);
    }
};

shared_proxy& shared() {
    static shared_proxy s;
    return s;
}

/// A proxy of its own: proxy_config `c` (upstream filled in) in front of a new upstream.
struct own_proxy {
    upstream_process upstream;
    proxy_process proxy;
    explicit own_proxy(proxy_config c) : proxy(fill(c, upstream.port)) {}
    static std::string fill(proxy_config& c, unsigned short port) {
        c.upstream_port = port;
        return c.yaml();
    }
};

const std::string json_body = R"({"amount":1000,"currency":"eur"})";

std::vector<std::string> post_args(const std::string& key, const std::string& body = json_body) {
    std::vector<std::string> a{
        "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", body};
    if (!key.empty()) {
        a.insert(a.end(), {"-H", "Idempotency-Key: " + key});
    }
    return a;
}

} // namespace

TEST_SUITE("http2") {

    TEST_CASE("h2c with prior knowledge: a GET on a plain route, logged and counted as HTTP/2") {
        auto& s = shared();
        const auto requests_before =
            counter(s.proxy, label("onceproxy_client_requests_total", "protocol", "h2"));
        const auto connections_before =
            counter(s.proxy, label("onceproxy_client_connections_total", "protocol", "h2"));

        const auto r = h2c(s.proxy.port, "/plain/h2c-get?x=1");
        INFO(r.output);
        REQUIRE(r.exit == 0);
        CHECK(r.version == "2");
        CHECK(r.response.status == 200);
        CHECK(json_member(r.response.body, "method") == "GET");
        CHECK(json_member(r.response.body, "path") == "/plain/h2c-get?x=1");
        CHECK_FALSE(r.response.header("X-Execution-Id").empty());

        // The forwarding headers the upstream saw are the ones an HTTP/1.1 client gets.
        const auto one = h1(s.proxy.port, "/plain/h1-get");
        REQUIRE(one.exit == 0);
        CHECK(one.version == "1.1");
        for (const char* echo : {"X-Echo-Forwarded-For", "X-Echo-Forwarded-Proto",
                                 "X-Echo-Forwarded-Host", "X-Echo-Forwarded"}) {
            CAPTURE(echo);
            CHECK(r.response.header(echo) == one.response.header(echo));
        }
        CHECK(r.response.header("X-Echo-Forwarded-For") == "127.0.0.1");
        CHECK(r.response.header("X-Echo-Forwarded-Proto") == "http");

        // The access log line of that request says HTTP/2; the HTTP/1.1 one says HTTP/1.1.
        std::string h2_line;
        std::string h1_line;
        wait_until(
            [&] {
                std::istringstream in(s.proxy.log());
                std::string line;
                while (std::getline(in, line)) {
                    if (line.find("\"/plain/h2c-get") != std::string::npos) {
                        h2_line = line;
                    } else if (line.find("\"/plain/h1-get") != std::string::npos) {
                        h1_line = line;
                    }
                }
                return !h2_line.empty() && !h1_line.empty();
            },
            5s, "the access log lines of both requests");
        CHECK(json_member(h2_line, "protocol") == "HTTP/2");
        CHECK(json_member(h1_line, "protocol") == "HTTP/1.1");

        CHECK(counter(s.proxy, label("onceproxy_client_requests_total", "protocol", "h2")) >=
              requests_before + 1);
        CHECK(counter(s.proxy, label("onceproxy_client_connections_total", "protocol", "h2")) >=
              connections_before + 1);
    }

    TEST_CASE("http2.cleartext: false: a prior-knowledge client fails, HTTP/1.1 still works") {
        proxy_config c;
        c.top = "http2:\n  cleartext: false\n";
        own_proxy p(c);
        const auto r = h2c(p.proxy.port, "/plain");
        INFO(r.output);
        CHECK(r.exit != 0); // the preface is not HTTP/1.1: the proxy closes the connection
        CHECK(r.response.status == 0);
        const auto one = h1(p.proxy.port, "/plain");
        CHECK(one.exit == 0);
        CHECK(one.response.status == 200);
        CHECK(p.upstream.total() == 1);
    }

    TEST_CASE("Upgrade: h2c is ignored: served as HTTP/1.1, never passed to the upstream") {
        auto& s = shared();
        // curl --http2 on http:// asks for the HTTP/1.1 upgrade to h2c (RFC 7540 section 3.2).
        const auto r = curl(h2c_url(s.proxy.port, "/h2c-upgrade"), {"--http2"});
        INFO(r.output);
        CHECK(r.exit == 0);
        CHECK(r.version == "1.1");
        CHECK(r.response.status == 200);
        CHECK_FALSE(r.response.has_header("X-Echo-Hop"));        // no Upgrade upstream
        CHECK_FALSE(r.response.has_header("X-Echo-Connection")); // no Connection: upgrade
        // An upstream that would switch anyway (101) gets no tunnel to the client: one would
        // carry later requests to the upstream past the routes and the guards.
        const auto switched =
            h1(s.proxy.port, "/h2c-upgrade",
               {"-H", "Connection: Upgrade, HTTP2-Settings", "-H", "Upgrade: h2c", "-H",
                "HTTP2-Settings: AAMAAABkAAQAAP__", "-H", "X-Test-Status: 101"});
        check_problem(switched.response, 502, "upstream.bad_response");
    }

    TEST_CASE("TLS: ALPN negotiates h2 unless http2.tls is false") {
        temp_dir dir;
        test_pki ca(dir.path(), "h2-test-ca");
        const auto server = ca.issue("server");
        for (const bool h2 : {true, false}) {
            CAPTURE(h2);
            proxy_config c;
            c.top = "tls:\n  cert_file: " + server.cert_file + "\n  key_file: " + server.key_file +
                    "\n" + (h2 ? "" : "http2:\n  tls: false\n");
            own_proxy p(c);
            REQUIRE(p.proxy.tls_port != 0);
            const auto r = curl("https://127.0.0.1:" + std::to_string(p.proxy.tls_port) + "/tls",
                                {"--http2", "--cacert", ca.ca_file()});
            INFO(r.output);
            CHECK(r.exit == 0);
            CHECK(r.response.status == 200);
            CHECK(r.version == (h2 ? "2" : "1.1"));
            CHECK(json_member(r.response.body, "path") == "/tls");
            CHECK(r.response.header("X-Echo-Forwarded-Proto") == "https");
            // A body larger than every window, across TLS records and DATA frames.
            constexpr std::size_t size = std::size_t{5} << 20;
            const auto big =
                curl("https://127.0.0.1:" + std::to_string(p.proxy.tls_port) + "/tls-download",
                     {"--http2", "--cacert", ca.ca_file(), "-H",
                      "X-Test-Body-Bytes: " + std::to_string(size)});
            CHECK(big.version == (h2 ? "2" : "1.1"));
            CHECK(big.response.status == 200);
            REQUIRE(big.response.body.size() == size);
            bool pattern_ok = true;
            for (std::size_t i = 0; pattern_ok && i < size; i += 4099) {
                pattern_ok = big.response.body[i] == static_cast<char>('a' + i % 26);
            }
            CHECK(pattern_ok);
        }
    }

    TEST_CASE("a guarded route: stored over h2, replayed over HTTP/1.1 and over h2") {
        auto& s = shared();
        const auto key = unique_key("http2", "h2-first");
        const auto stored = h2c(s.proxy.port, "/v1/payments", post_args(key));
        INFO(stored.output);
        REQUIRE(stored.exit == 0);
        CHECK(stored.version == "2");
        REQUIRE(stored.response.status == 200);
        CHECK(stored.response.header("Idempotency-Status") == "stored");
        const auto id = stored.response.header("X-Execution-Id");
        REQUIRE_FALSE(id.empty());
        CHECK(json_member(stored.response.body, "execution_id") == id);

        const auto over_h1 = h1(s.proxy.port, "/v1/payments", post_args(key));
        CHECK(over_h1.version == "1.1");
        CHECK(over_h1.response.status == 200);
        CHECK(over_h1.response.header("Idempotency-Status") == "replayed");
        CHECK(over_h1.response.header("X-Execution-Id") == id);
        CHECK(over_h1.response.body == stored.response.body);

        const auto over_h2 = h2c(s.proxy.port, "/v1/payments", post_args(key));
        CHECK(over_h2.version == "2");
        CHECK(over_h2.response.status == 200);
        CHECK(over_h2.response.header("Idempotency-Status") == "replayed");
        CHECK(over_h2.response.header("X-Execution-Id") == id);
        CHECK(over_h2.response.body == stored.response.body);

        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("a guarded route: stored over HTTP/1.1, replayed over h2") {
        auto& s = shared();
        const auto key = unique_key("http2", "h1-first");
        const auto stored = h1(s.proxy.port, "/v1/payments", post_args(key));
        REQUIRE(stored.response.status == 200);
        CHECK(stored.response.header("Idempotency-Status") == "stored");
        const auto replay = h2c(s.proxy.port, "/v1/payments", post_args(key));
        CHECK(replay.version == "2");
        CHECK(replay.response.status == 200);
        CHECK(replay.response.header("Idempotency-Status") == "replayed");
        CHECK(replay.response.header("X-Execution-Id") == stored.response.header("X-Execution-Id"));
        CHECK(replay.response.body == stored.response.body);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE(
        "a guarded route over h2: payload mismatch and missing key are the HTTP/1.1 problems") {
        auto& s = shared();
        const auto key = unique_key("http2", "mismatch");
        REQUIRE(h2c(s.proxy.port, "/v1/payments", post_args(key)).response.status == 200);
        const auto mismatch = h2c(s.proxy.port, "/v1/payments",
                                  post_args(key, R"({"amount":1001,"currency":"eur"})"));
        CHECK(mismatch.version == "2");
        check_problem(mismatch.response, 422, "idempotency.payload_mismatch");
        CHECK(s.upstream.count(key) == 1);

        const auto before = s.upstream.total();
        const auto missing2 = h2c(s.proxy.port, "/v1/payments", post_args(""));
        const auto missing1 = h1(s.proxy.port, "/v1/payments", post_args(""));
        CHECK(missing2.version == "2");
        check_problem(missing2.response, 400, "idempotency.missing_key");
        check_problem(missing1.response, 400, "idempotency.missing_key");
        CHECK(json_member(missing2.response.body, "title") ==
              json_member(missing1.response.body, "title"));
        CHECK(s.upstream.total() == before);
    }

    TEST_CASE("a guarded route: one key on two streams of one connection runs once") {
        auto& s = shared();
        const auto key = unique_key("http2", "two-streams");
        temp_dir dir;
        const auto body = dir.write("body.json", json_body);
        // nghttp sends both requests at once; the upstream takes 1 s to answer the first, so
        // the second finds the key in progress.
        const auto r =
            run_command({"nghttp", "-v", "-t", "10", "-m", "2", "-d", body, "-H",
                         "content-type: application/json", "-H", "idempotency-key: " + key, "-H",
                         "x-test-delay-ms: 1000", h2c_url(s.proxy.port, "/v1/payments")});
        INFO(r.output);
        CHECK(r.status == 0);
        CHECK(r.output.find(":status: 200") != std::string::npos);
        CHECK(r.output.find("idempotency-status: stored") != std::string::npos);
        CHECK(r.output.find(":status: 409") != std::string::npos);
        CHECK(r.output.find("\"code\":\"idempotency.in_progress\"") != std::string::npos);
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("a guarded request whose h2 stream is cancelled still completes, once") {
        auto& s = shared();
        const auto key = unique_key("http2", "cancelled");
        const auto out = probe("cancel_guarded", s.proxy.port,
                               {std::to_string(s.upstream.port), "/v1/payments", key});
        CHECK(has_line(out, "cancelled"));
        CHECK(has_line(out, "pong"));
        // As when an HTTP/1.1 client hangs up: the exchange runs to its end and is recorded;
        // the retry gets it replayed (409 in_progress until the upstream has answered).
        curl_result retry;
        wait_until(
            [&] {
                retry = h1(s.proxy.port, "/v1/payments", post_args(key));
                return retry.response.status != 409;
            },
            10s, "the cancelled exchange ends");
        CHECK(retry.response.status == 200);
        CHECK(retry.response.header("Idempotency-Status") == "replayed");
        CHECK(s.upstream.count(key) == 1);
    }

    TEST_CASE("a 100 MiB download over h2 to a slow reader, with bounded proxy memory") {
        auto& s = shared();
        constexpr std::uint64_t size = std::uint64_t{100} << 20;
        const auto pid = s.proxy.proc.pid();
        const auto baseline = rss_kib(pid);
        reset_peak_rss(pid);
        // The client reads at 40 MB/s, slower than the upstream writes: a proxy that does not
        // pass the back-pressure on holds what the client has not taken yet.
        const auto r =
            h2c(s.proxy.port, "/unlimited/download",
                {"-H", "X-Test-Body-Bytes: " + std::to_string(size), "--limit-rate", "40M"});
        const auto peak = peak_rss_kib(pid);
        MESSAGE("h2 download: proxy RSS " << baseline / 1024 << " MiB before, peak " << peak / 1024
                                          << " MiB");
        INFO(r.output);
        CHECK(r.exit == 0);
        CHECK(r.version == "2");
        CHECK(r.response.status == 200);
        CHECK(r.response.body.size() == size);
        bool pattern_ok = r.response.body.size() == size;
        for (std::size_t i = 0; pattern_ok && i < r.response.body.size(); i += 4099) {
            pattern_ok = r.response.body[i] == static_cast<char>('a' + i % 26);
        }
        CHECK(pattern_ok);
        CHECK(peak > 0);
        CHECK(peak < baseline + 48 * 1024);
    }

    TEST_CASE("a 20 MiB upload over h2 reaches the upstream whole, with bounded proxy memory") {
        auto& s = shared();
        constexpr std::size_t size = std::size_t{20} << 20;
        temp_dir dir;
        std::string data(size, '\0');
        std::uint64_t x = 0x9e3779b97f4a7c15ULL;
        for (auto& c : data) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c = static_cast<char>(x >> 56);
        }
        const auto file = dir.write("upload.bin", data);
        fnv1a digest;
        digest.update(data);
        const auto pid = s.proxy.proc.pid();
        const auto baseline = rss_kib(pid);
        reset_peak_rss(pid);
        const auto r =
            h2c(s.proxy.port, "/unlimited/upload", {"-X", "POST", "--data-binary", "@" + file});
        const auto peak = peak_rss_kib(pid);
        MESSAGE("h2 upload: proxy RSS " << baseline / 1024 << " MiB before, peak " << peak / 1024
                                        << " MiB");
        INFO(r.output);
        CHECK(r.exit == 0);
        CHECK(r.version == "2");
        CHECK(r.response.status == 200);
        CHECK(json_member(r.response.body, "body_bytes") == std::to_string(size));
        CHECK(json_member(r.response.body, "body_fnv1a") == digest.hex());
        CHECK(peak < baseline + 32 * 1024);
    }

    TEST_CASE("response trailers arrive over h2") {
        auto& s = shared();
        const auto r =
            run_command({"nghttp", "-v", "-t", "10", "-H", "x-test-trailer-bytes: 20", "-H",
                         "x-test-body-bytes: 1000", h2c_url(s.proxy.port, "/trailers")});
        INFO(r.output);
        CHECK(r.status == 0);
        CHECK(r.output.find(":status: 200") != std::string::npos);
        CHECK(r.output.find("x-test-trailer: " + std::string(20, 't')) != std::string::npos);
    }

    TEST_CASE("SSE over h2: each event reaches the client while the upstream is still writing") {
        auto& s = shared();
        temp_dir dir;
        const std::string id = unique_key("http2", "sse");
        process client({which("curl"), "-sS", "-N", "-m", "30", "--http2-prior-knowledge", "-H",
                        "Accept: text/event-stream", "-H", "X-Test-Events: 3", "-H",
                        "X-Test-Stream-Id: " + id, h2c_url(s.proxy.port, "/events")},
                       dir.file("events"));
        const auto events = [&] { return read_file(dir.file("events")); };
        // The upstream holds event 2 until the test releases it: a proxy that waits for the
        // whole body never shows event 1 here.
        wait_until([&] { return events().find("data: event-1") != std::string::npos; }, 10s,
                   "event 1 at the client");
        CHECK(events().find("event-2") == std::string::npos);
        s.release(id);
        wait_until([&] { return events().find("data: event-2") != std::string::npos; }, 10s,
                   "event 2 at the client");
        s.release(id);
        CHECK(client.wait(10s) == 0);
        CHECK(events().find("data: event-3") != std::string::npos);
    }

    TEST_CASE("multiplexing: 60 concurrent streams on one connection, all answered 200") {
        auto& s = shared();
        const auto connections_before =
            counter(s.proxy, label("onceproxy_client_connections_total", "protocol", "h2"));
        const auto total_before = s.upstream.total();
        const auto r = run_command(
            {"nghttp", "-v", "-n", "-t", "20", "-m", "60", h2c_url(s.proxy.port, "/many")});
        INFO(r.output);
        CHECK(r.status == 0);
        std::size_t ok = 0;
        std::size_t streams = 0;
        for (std::size_t at = 0; (at = r.output.find(":status: ", at)) != std::string::npos; ++at) {
            ++streams;
            ok += r.output.compare(at + 9, 3, "200") == 0 ? 1 : 0;
        }
        CHECK(streams == 60);
        CHECK(ok == 60);
        CHECK(s.upstream.total() == total_before + 60);
        CHECK(counter(s.proxy, label("onceproxy_client_connections_total", "protocol", "h2")) ==
              connections_before + 1);
    }

    TEST_CASE("rapid reset: GOAWAY ENHANCE_YOUR_CALM, counted, other clients still served") {
        auto& s = shared();
        const auto before = goaways(s.proxy, "rapid_reset");
        const auto executions = s.upstream.total();
        const auto out = probe("rapid_reset", s.proxy.port, {"2000"});
        CHECK(has_line(out, "goaway 0xb"));
        CHECK(goaways(s.proxy, "rapid_reset") >= before + 1);
        // The 2000 streams cost the upstream at most about the reset budget (200 a second),
        // not one request each.
        CHECK(s.upstream.total() - executions <= 400);
        CHECK(h2c(s.proxy.port, "/after-rapid-reset").response.status == 200);
    }

    TEST_CASE("CONTINUATION flood: the connection ends with GOAWAY, counted as header_flood") {
        auto& s = shared();
        const auto before = goaways(s.proxy, "header_flood");
        const auto out = probe("continuation_flood", s.proxy.port);
        CHECK(has_line(out, "goaway 0xb"));
        CHECK(goaways(s.proxy, "header_flood") >= before + 1);
        CHECK(h2c(s.proxy.port, "/after-continuation-flood").response.status == 200);
    }

    TEST_CASE("a header list past limits.max_header_bytes gets 431") {
        auto& s = shared();
        const auto before = s.upstream.total();
        const auto out = probe("big_headers", s.proxy.port, {"16384"});
        CHECK(has_line(out, "status 431"));
        CHECK(has_line(out, "pong")); // the stream is answered, the connection goes on
        CHECK(s.upstream.total() == before);
    }

    TEST_CASE("PING flood: GOAWAY ENHANCE_YOUR_CALM, counted as control_flood") {
        auto& s = shared();
        const auto before = goaways(s.proxy, "control_flood");
        const auto out = probe("ping_flood", s.proxy.port);
        CHECK(has_line(out, "goaway 0xb"));
        CHECK(goaways(s.proxy, "control_flood") >= before + 1);
        CHECK(h2c(s.proxy.port, "/after-ping-flood").response.status == 200);
    }

    TEST_CASE("a zero-window stall: the stream is reset after idle_timeout, the proxy stays up") {
        proxy_config c;
        c.limits.push_back("idle_timeout: 1s");
        c.routes = routes;
        own_proxy p(c);
        const auto out = probe("zero_window", p.proxy.port, {"/unlimited/stall", "8388608"});
        CHECK(has_line(out, "status 200"));
        CHECK(out.find("rst 0x8 after ") != std::string::npos);
        CHECK(has_line(out, "pong"));
        CHECK(h2c(p.proxy.port, "/after-stall").response.status == 200);
    }

    TEST_CASE("an idle connection is closed after idle_timeout with GOAWAY NO_ERROR first") {
        proxy_config c;
        c.limits.push_back("idle_timeout: 1s");
        own_proxy p(c);
        const auto out = probe("idle", p.proxy.port);
        // The last stream id tells a client whose next request crossed the GOAWAY that the
        // proxy never took it, so it may send it again on a new connection.
        CHECK(has_line(out, "goaway 0x0 last_stream 1"));
        CHECK(has_line(out, "closed"));
        CHECK(goaways(p.proxy, "protocol_error") == 0);
    }

    TEST_CASE("max_concurrent_streams is advertised and a stream beyond it is refused") {
        proxy_config c;
        c.top = "http2:\n  max_concurrent_streams: 4\n";
        own_proxy p(c);
        SUBCASE("before the client acknowledged the SETTINGS: RST_STREAM REFUSED_STREAM") {
            // The usual case: a client sends its first requests right after its preface.
            const auto out = probe("max_streams", p.proxy.port, {"noack"});
            CHECK(has_line(out, "max_concurrent_streams 4"));
            CHECK(has_line(out, "rst 0x7"));
            CHECK(has_line(out, "pong")); // only that stream was refused
        }
        SUBCASE("after: a connection error (GOAWAY PROTOCOL_ERROR), RFC 9113 section 5.1.2") {
            const auto before = goaways(p.proxy, "protocol_error");
            const auto out = probe("max_streams", p.proxy.port, {"ack"});
            CHECK(has_line(out, "max_concurrent_streams 4"));
            CHECK(has_line(out, "goaway 0x1 last_stream 7"));
            CHECK(goaways(p.proxy, "protocol_error") == before + 1);
        }
        CHECK(h2c(p.proxy.port, "/after-refused").response.status == 200);
    }

    TEST_CASE("drain: SIGTERM during an h2 download: GOAWAY, the download completes, exit 0") {
        proxy_config c;
        c.routes = routes;
        c.upstream_settings.push_back("timeout: 20s");
        c.limits.push_back("drain_timeout: 20s");
        c.top = "defaults:\n  lease: 20s\n";
        own_proxy p(c);
        temp_dir dir;
        const std::string stream_id = "drain-1";
        process client({python(), probe_script, "drain", std::to_string(p.proxy.port),
                        "/unlimited/drain", stream_id},
                       dir.file("client.log"));
        const auto client_log = [&] { return read_file(dir.file("client.log")); };
        wait_until([&] { return has_line(client_log(), "head 200"); }, 10s,
                   "the client has the response head");
        p.proxy.proc.signal(SIGTERM);
        wait_until([&] { return client_log().find("goaway 0x0 ") != std::string::npos; }, 10s,
                   "the client has a GOAWAY");
        REQUIRE(fetch(p.upstream.port, "POST", "/__release?id=" + stream_id).status == 200);
        wait_until([&] { return has_line(client_log(), "complete 2097152"); }, 20s,
                   "the download completes");
        INFO(client_log());
        CHECK(client.wait(10s) == 0);
        CHECK(p.proxy.proc.wait(20s) == 0);
    }
}
