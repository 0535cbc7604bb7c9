// HTTP/2 upstreams (docs/http2.md "Upstreams"): onceproxy speaks h2c and h2 (TLS, ALPN) to a
// real nginx with `http2` on, which proxies to the test upstream over HTTP/1.1, so the test
// upstream counts executions and nginx's access log says which protocol onceproxy spoke.

#include "support/proxy_fixture.hpp"
#include "support/test_pki.hpp"
#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

/// Runs `argv` (bounded in time), stdout and stderr together.
std::string run(const std::vector<std::string>& argv) {
    return run_command(argv).output;
}

/// nginx with an h2c server (prior knowledge) and an h2 server (TLS), both proxying to the test
/// upstream; each request's protocol goes to its access log.
struct nginx_h2 {
    temp_dir dir;
    test_pki pki{dir.path()};
    cert_pair server = pki.issue("nginx");
    unsigned short h2c_port = free_port();
    unsigned short h2_port = free_port();
    process proc;

    /// `requests_per_connection`: nginx's keepalive_requests, after which it sends GOAWAY.
    nginx_h2(unsigned short upstream_port, int max_streams, int requests_per_connection = 1000) {
        const auto conf =
            dir.write("nginx.conf",
                      "worker_processes 1;\npid " + dir.file("nginx.pid") + ";\nerror_log " +
                          dir.file("error.log") +
                          ";\nevents { worker_connections 1024; }\nhttp {\n"
                          "  log_format p '$server_protocol $request_uri';\n"
                          "  access_log " +
                          dir.file("access.log") +
                          " p;\n"
                          "  client_body_temp_path " +
                          dir.path() +
                          ";\n"
                          "  proxy_temp_path " +
                          dir.path() +
                          ";\n"
                          "  http2_max_concurrent_streams " +
                          std::to_string(max_streams) + ";\n  keepalive_requests " +
                          std::to_string(requests_per_connection) +
                          ";\n"
                          "  upstream app { server 127.0.0.1:" +
                          std::to_string(upstream_port) +
                          "; keepalive 16; }\n"
                          "  server {\n    listen 127.0.0.1:" +
                          std::to_string(h2c_port) +
                          " http2;\n    location / { proxy_pass http://app; proxy_http_version 1.1;"
                          " proxy_set_header Connection \"\"; proxy_request_buffering off;"
                          " proxy_buffering off; client_max_body_size 0; }\n  }\n"
                          "  server {\n    listen 127.0.0.1:" +
                          std::to_string(h2_port) + " ssl http2;\n    ssl_certificate " +
                          server.cert_file + ";\n    ssl_certificate_key " + server.key_file +
                          ";\n    location / { proxy_pass http://app; proxy_http_version 1.1;"
                          " proxy_set_header Connection \"\"; }\n  }\n}\n");
        proc = process({"/usr/sbin/nginx", "-c", conf, "-p", dir.path(), "-g", "daemon off;"},
                       dir.file("nginx.out"));
        wait_until(
            [&] {
                return run({"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                            "--http2-prior-knowledge",
                            "http://127.0.0.1:" + std::to_string(h2c_port) + "/__health"}) == "200";
            },
            10s, "nginx answers over h2c");
    }
    /// SIGTERM first: nginx's master then stops its worker, which a SIGKILL of the master
    /// alone would leave running (still listening on the test's ports) after the test.
    ~nginx_h2() {
        proc.signal(SIGTERM);
        proc.wait(10s);
    }
    nginx_h2(const nginx_h2&) = delete;
    nginx_h2& operator=(const nginx_h2&) = delete;
    std::string access_log() const { return read_file(dir.file("access.log")); }
};

std::string front_config(const std::string& url, const std::string& extra_upstream = "") {
    proxy_config c;
    c.upstream_settings = {"protocol: " + std::string(url.rfind("https", 0) == 0 ? "h2" : "h2c")};
    if (!extra_upstream.empty()) {
        c.upstream_settings.push_back(extra_upstream);
    }
    c.routes = "  - name: payments\n"
               "    match: { methods: [POST], path: /v1/payments }\n"
               "    upstream: app\n"
               "    idempotency: { mode: required }\n";
    c.limits = {"max_request_bytes: 64MiB"};
    auto yaml = c.yaml();
    const auto at = yaml.find("http://127.0.0.1:{UPSTREAM_PORT}");
    REQUIRE(at != std::string::npos);
    yaml.replace(at, std::string("http://127.0.0.1:{UPSTREAM_PORT}").size(), url);
    return yaml;
}

std::string curl(const std::vector<std::string>& args) {
    std::vector<std::string> argv{"curl", "-sS", "-m", "30"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
}

} // namespace

TEST_SUITE("http2 upstreams") {
    TEST_CASE("h2c upstream: plain and guarded requests from HTTP/1.1 and HTTP/2 clients") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 100);
        proxy_process proxy(front_config("http://127.0.0.1:" + std::to_string(nginx.h2c_port)));
        const auto base = "http://127.0.0.1:" + std::to_string(proxy.port);

        for (const char* client : {"--http1.1", "--http2-prior-knowledge"}) {
            INFO(client);
            const auto plain =
                curl({client, "-w", "|%{http_code}|%{http_version}", base + "/hello?x=1"});
            CHECK(plain.find("\"path\":\"/hello?x=1\"") != std::string::npos);
            CHECK(plain.find("|200|") != std::string::npos);
        }
        // Every request reached nginx over HTTP/2.
        CHECK(nginx.access_log().find("HTTP/2.0 /hello?x=1") != std::string::npos);
        CHECK(nginx.access_log().find("HTTP/1.1") == std::string::npos);

        // Guarded: stored over HTTP/2 to the upstream, replayed to both client protocols.
        const auto key = unique_key("h2up", "pay");
        const std::vector<std::string> post{"-X", "POST",
                                            "-H", "Idempotency-Key: " + key,
                                            "-H", "Content-Type: application/json",
                                            "-d", "{\"amount\":1}",
                                            "-D", "-"};
        auto first = post;
        first.insert(first.begin(), "--http2-prior-knowledge");
        first.push_back(base + "/v1/payments");
        const auto a = curl(first);
        CHECK(a.find("idempotency-status: stored") != std::string::npos);
        auto second = post;
        second.insert(second.begin(), "--http1.1");
        second.push_back(base + "/v1/payments");
        const auto b = curl(second);
        CHECK(b.find("Idempotency-Status: replayed") != std::string::npos);
        CHECK(upstream.count(key) == 1);
    }

    TEST_CASE("egress to an h2c upstream, from an h2c app: a failed attempt is retried over "
              "HTTP/2 under one key") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 100);
        auto yaml = front_config("http://127.0.0.1:" + std::to_string(nginx.h2c_port));
        yaml += "egress:\n"
                "  listen: 127.0.0.1:0\n"
                "  routes:\n"
                "    - name: provider\n"
                "      match: { prefix: / }\n"
                "      upstream: app\n"
                "      retry: { base_delay: 10ms, max_delay: 50ms }\n";
        proxy_process proxy(yaml);
        REQUIRE(proxy.egress_port != 0);
        const auto out =
            curl({"--http2-prior-knowledge", "-X", "POST", "-H", "X-Test-Fail-Times: 1", "-H",
                  "Content-Type: application/json", "-d", "{\"amount\":1}", "-D", "-", "-w",
                  "|%{http_version}",
                  "http://127.0.0.1:" + std::to_string(proxy.egress_port) + "/v1/charges"});
        INFO(out);
        CHECK(out.rfind("|2") != std::string::npos); // the app spoke h2c to the egress listener
        CHECK(out.find("HTTP/2 200") != std::string::npos);
        CHECK(out.find("onceproxy-attempts: 2") != std::string::npos);
        const auto at = out.find("idempotency-key: ");
        REQUIRE(at != std::string::npos);
        const auto key = out.substr(at + 17, 36);
        CHECK(upstream.count(key) == 2);
        // Both attempts reached nginx over HTTP/2.
        const auto log = nginx.access_log();
        CHECK(log.find("HTTP/2.0 /v1/charges") != std::string::npos);
        CHECK(log.find("HTTP/1.1") == std::string::npos);
    }

    TEST_CASE("h2c upstream: large bodies stream both ways for an HTTP/2 client") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 100);
        proxy_process proxy(front_config("http://127.0.0.1:" + std::to_string(nginx.h2c_port)));
        const auto base = "http://127.0.0.1:" + std::to_string(proxy.port);
        const auto down =
            curl({"--http2-prior-knowledge", "-H", "X-Test-Body-Bytes: 30000000", "-o", "/dev/null",
                  "-w", "%{http_code} %{size_download}", base + "/big"});
        CHECK(down == "200 30000000");
        temp_dir d;
        const auto file = d.write("up.bin", std::string(8 * 1024 * 1024, 'u'));
        const auto up = curl({"--http2-prior-knowledge", "-X", "POST", "--data-binary", "@" + file,
                              base + "/upload"});
        CHECK(up.find("\"body_bytes\":8388608") != std::string::npos);
        // An event stream arrives whole (nginx's proxy_pass drops the upstream's trailers, so
        // trailers are checked in http2_test against onceproxy's own h2 paths).
        const auto events = curl(
            {"--http2-prior-knowledge", "-H", "X-Test-Events: 3", "-D", "-", base + "/events"});
        CHECK(events.find("data: event-3") != std::string::npos);
    }

    TEST_CASE("h2c upstream: more concurrent requests than the upstream's streams") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 2);
        proxy_process proxy(front_config("http://127.0.0.1:" + std::to_string(nginx.h2c_port)));
        const auto base = "http://127.0.0.1:" + std::to_string(proxy.port);
        // 40 streams at once on one client connection; nginx takes 2 per connection, so the
        // pool opens connections (or waits for a stream) for the rest.
        const auto out = run({"h2load", "-n", "40", "-c", "1", "-m", "40", base + "/many"});
        INFO(out);
        CHECK(out.find("40 total, 40 started, 40 done, 40 succeeded") != std::string::npos);
        CHECK(out.find("status codes: 40 2xx") != std::string::npos);
    }

    TEST_CASE("h2c upstream sending GOAWAY every 50 requests: requests with bodies the upstream "
              "refused unprocessed go again, none fails") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 100, 50);
        proxy_process proxy(front_config("http://127.0.0.1:" + std::to_string(nginx.h2c_port)));
        const auto base = "http://127.0.0.1:" + std::to_string(proxy.port);
        temp_dir d;
        const auto body = d.write("body.bin", std::string(200, 'b'));
        // Streams opened while a GOAWAY is on its way are above its last stream id: nginx never
        // processed them, so they are sent again on a new connection, body included.
        const auto out =
            run({"h2load", "-n", "300", "-c", "2", "-m", "10", "-d", body, base + "/posts"});
        INFO(out);
        CHECK(out.find("300 total, 300 started, 300 done, 300 succeeded") != std::string::npos);
        CHECK(out.find("status codes: 300 2xx") != std::string::npos);
    }

    TEST_CASE("SIGTERM with pooled h2c upstream connections: the drain ends, not its deadline") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 100);
        proxy_process proxy(front_config("http://127.0.0.1:" + std::to_string(nginx.h2c_port)));
        const auto base = "http://127.0.0.1:" + std::to_string(proxy.port);
        const auto out = run({"h2load", "-n", "200", "-c", "2", "-m", "20", base + "/pooled"});
        REQUIRE(out.find("200 succeeded") != std::string::npos);
        proxy.proc.signal(SIGTERM);
        // limits.drain_timeout is 30 s by default: an upstream connection left open would hold
        // the worker until then (and the log would say the drain overran).
        CHECK(proxy.proc.wait(25s) == 0);
        CHECK(proxy.proc.log().find("overran the drain deadline") == std::string::npos);
    }

    TEST_CASE("h2 upstream over TLS: ALPN h2, the chain verified") {
        upstream_process upstream;
        nginx_h2 nginx(upstream.port, 100);
        proxy_process proxy(front_config("https://127.0.0.1:" + std::to_string(nginx.h2_port),
                                         "tls: { ca_file: " + nginx.pki.ca_file() + " }"));
        const auto base = "http://127.0.0.1:" + std::to_string(proxy.port);
        const auto r = curl({"-w", "|%{http_code}", base + "/tls?y=2"});
        CHECK(r.find("|200") != std::string::npos);
        CHECK(nginx.access_log().find("HTTP/2.0 /tls?y=2") != std::string::npos);
    }

    TEST_CASE("h2c upstream down: 502 upstream.unavailable, nothing sent") {
        proxy_process proxy(front_config("http://127.0.0.1:" + std::to_string(free_port())));
        const auto r = curl({"--http2-prior-knowledge", "-w", "|%{http_code}",
                             "http://127.0.0.1:" + std::to_string(proxy.port) + "/x"});
        CHECK(r.find("upstream.unavailable") != std::string::npos);
        CHECK(r.find("|502") != std::string::npos);
    }
}
