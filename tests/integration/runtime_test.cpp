// The runtime around the engine (issue 9): forwarding headers with trusted proxies, Redis
// credentials as their own fields, a start with Redis down (degraded, never a crash loop) and
// readiness that checks the app. Real onceproxy processes, the real test upstream, a real
// redis-server; every wait is bounded.

#include "support/http_client.hpp"
#include "support/log_lines.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string unique_key(const std::string& tag) {
    return onceproxy::test::unique_key("rt", tag);
}

http_response keyed_post(unsigned short port, const std::string& path, const std::string& key) {
    return fetch(port, "POST", path,
                 {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                 R"({"amount":100})");
}

std::vector<std::string> redis_lines(const std::string& url,
                                     const std::vector<std::string>& extra = {}) {
    std::vector<std::string> lines{"type: redis", "redis:", "  url: \"" + url + "\"",
                                   "  command_timeout: 250ms", "  connect_timeout: 500ms"};
    for (const auto& e : extra) {
        lines.push_back("  " + e);
    }
    return lines;
}

/// Starts onceproxy with `yaml` expecting it to refuse; returns its exit status (-1: it was
/// still running after 15 s, then killed) and its log.
std::pair<int, std::string> refused_start(const std::string& yaml) {
    temp_dir dir;
    const auto config = dir.write("config.yaml", yaml);
    process p({ONCEPROXY_BIN, "--config", config}, dir.file("proxy.log"));
    const int status = p.wait(15s);
    return {status, p.log()};
}

/// A loopback listener that never accepts: connects succeed (backlog), nothing answers.
struct silent_listener {
    int fd = -1;
    unsigned short port = 0;
    silent_listener() {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
            ::listen(fd, 64) != 0 ||
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            throw std::runtime_error("silent_listener: cannot listen");
        }
        port = ntohs(a.sin_port);
    }
    ~silent_listener() { ::close(fd); }
    silent_listener(const silent_listener&) = delete;
    silent_listener& operator=(const silent_listener&) = delete;
};

/// The test upstream on a given port (the fixture's binds port 0).
process start_upstream_on(unsigned short port, const temp_dir& dir) {
    const auto port_file = dir.file("upstream.port");
    ::unlink(port_file.c_str());
    process p({TEST_UPSTREAM_BIN, "--listen", "127.0.0.1:" + std::to_string(port), "--port-file",
               port_file},
              dir.file("upstream.log"));
    if (wait_for_file(port_file, 10s).empty()) {
        throw std::runtime_error("test upstream did not start on port " + std::to_string(port) +
                                 ":\n" + p.log());
    }
    return p;
}

} // namespace

TEST_SUITE("runtime") {
    TEST_CASE("a TLS file that cannot be read is refused alike by --check-config and at start, "
              "with file:line:column") {
        proxy_config c;
        c.upstream_port = 1;
        c.top = "tls: { cert_file: c.pem, key_file: k.pem }\n";
        const auto yaml = c.yaml();
        const auto line =
            1 + std::count(yaml.begin(),
                           yaml.begin() + static_cast<std::ptrdiff_t>(yaml.find("tls:")), '\n');
        temp_dir dir;
        const auto file = dir.write("config.yaml", yaml);
        const auto where =
            file + ":" + std::to_string(line) + ":19: tls.cert_file: cannot read cert_file 'c.pem'";

        process check({ONCEPROXY_BIN, "--check-config", file}, dir.file("check.log"));
        CHECK(check.wait(15s) == 1);
        CHECK(check.log().find(where) != std::string::npos);

        process run({ONCEPROXY_BIN, "--config", file}, dir.file("run.log"));
        CHECK(run.wait(15s) == 1);
        const auto log = run.log();
        INFO("log:\n" << log);
        const auto refused = find_log_line(log, "cannot read cert_file");
        REQUIRE(refused);
        CHECK(log_field(*refused, "msg").find(where) == 0);
        CHECK(log_field(*refused, "line") == std::to_string(line));
        CHECK(log_field(*refused, "column") == "19");
        CHECK(log.find("listening") == std::string::npos);
    }

    TEST_CASE("forwarding headers: replaced for an untrusted client, extended behind a trusted "
              "proxy, on plain and guarded routes") {
        upstream_process up;
        const std::string routes = guarded_route("pay", "/pay");
        const header_list forged{{"X-Forwarded-For", "203.0.113.7"},
                                 {"X-Forwarded-Proto", "https"},
                                 {"X-Forwarded-Host", "evil.example"},
                                 {"Forwarded", "for=203.0.113.7;proto=https"}};
        SUBCASE("untrusted (no trusted_proxies)") {
            proxy_config c;
            c.upstream_port = up.port;
            c.routes = routes;
            proxy_process p(c.yaml());
            const auto plain = fetch(p.port, "GET", "/plain", forged);
            REQUIRE(plain.status == 200);
            CHECK(plain.header("X-Echo-Forwarded-For") == "127.0.0.1");
            CHECK(plain.header("X-Echo-Forwarded-Proto") == "http");
            CHECK(plain.header("X-Echo-Forwarded-Host") == "127.0.0.1");
            CHECK(plain.header("X-Echo-Forwarded") == "for=127.0.0.1;host=127.0.0.1;proto=http");
            header_list keyed = forged;
            keyed.emplace_back("Idempotency-Key", unique_key("fwd"));
            const auto guarded = fetch(p.port, "POST", "/pay", keyed, "{}");
            REQUIRE(guarded.status == 200);
            CHECK(guarded.header("X-Echo-Forwarded-For") == "127.0.0.1");
            CHECK(guarded.header("X-Echo-Forwarded-Proto") == "http");
            CHECK(guarded.header("X-Echo-Forwarded-Host") == "127.0.0.1");
            CHECK(guarded.header("X-Echo-Forwarded") == "for=127.0.0.1;host=127.0.0.1;proto=http");
        }
        SUBCASE("trusted (127.0.0.0/8 in trusted_proxies)") {
            proxy_config c;
            c.upstream_port = up.port;
            c.routes = routes;
            c.top = "trusted_proxies: [10.0.0.0/8, 127.0.0.0/8]\n";
            proxy_process p(c.yaml());
            for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
                     {"GET", "/plain"}, {"POST", "/pay"}}) {
                CAPTURE(path);
                header_list h = forged;
                h.emplace_back("Idempotency-Key", unique_key("fwd"));
                const auto r = fetch(p.port, method, path, h, "{}");
                REQUIRE(r.status == 200);
                CHECK(r.header("X-Echo-Forwarded-For") == "203.0.113.7, 127.0.0.1");
                CHECK(r.header("X-Echo-Forwarded-Proto") == "https");
                CHECK(r.header("X-Echo-Forwarded-Host") == "evil.example");
                CHECK(r.header("X-Echo-Forwarded") ==
                      "for=203.0.113.7;proto=https, for=127.0.0.1;host=127.0.0.1;proto=http");
            }
        }
    }

    TEST_CASE("redis credentials as fields: a password with '@' ':' '/' '%', a password_file "
              "and an ACL user") {
        const std::string password = "p@ss:w0rd/x%41#";
        redis_server_options o;
        o.requirepass = password;
        redis_server srv(o);
        upstream_process up;
        temp_dir secrets;
        const auto file = secrets.write("redis-password", password + "\n");
        srv.cli({"ACL", "SETUSER", "onceproxy", "on", ">us@r:pw/1", "~*", "+@all"});

        const std::vector<std::vector<std::string>> variants{
            {"password: \"" + password + "\""},
            {"password_file: " + file},
            {"username: onceproxy", "password: \"us@r:pw/1\""},
        };
        for (const auto& creds : variants) {
            CAPTURE(creds.front());
            proxy_config c;
            c.upstream_port = up.port;
            c.routes = guarded_route("pay", "/pay");
            c.store = redis_lines(srv.url() + "/0", creds);
            proxy_process p(c.yaml());
            const auto key = unique_key("auth");
            http_response first;
            // The per-worker connections come up just after the port file: bounded retry.
            REQUIRE(eventually([&] {
                first = keyed_post(p.port, "/pay", key);
                return first.status != 503;
            }));
            CHECK(first.status == 200);
            CHECK(first.header("Idempotency-Status") == "stored");
            const auto again = keyed_post(p.port, "/pay", key);
            CHECK(again.header("Idempotency-Status") == "replayed");
            CHECK(up.count(key) == 1);
            CHECK(p.log().find(password) == std::string::npos);
        }

        SUBCASE("a wrong password is refused at start, and the log does not show it") {
            proxy_config c;
            c.upstream_port = up.port;
            c.store = redis_lines(srv.url() + "/0", {"password: \"wr0ng@pass\""});
            const auto [status, log] = refused_start(c.yaml());
            CHECK(status == 1);
            CHECK(log.find("AUTH") != std::string::npos);
            CHECK(log.find("wr0ng@pass") == std::string::npos);
        }
        SUBCASE("a missing password_file is a config error with file:line:column") {
            proxy_config c;
            c.upstream_port = up.port;
            c.store = redis_lines(srv.url() + "/0", {"password_file: /nonexistent/redis-pw"});
            const auto [status, log] = refused_start(c.yaml());
            CHECK(status != 0);
            CHECK(log.find("config.yaml:") != std::string::npos);
            CHECK(log.find("cannot read password_file '/nonexistent/redis-pw'") !=
                  std::string::npos);
        }
    }

    TEST_CASE("Redis down at start: the proxy starts degraded and recovers without a restart") {
        redis_server srv;
        srv.stop(); // its port is now closed; start() brings it back on the same port
        upstream_process up;
        const std::string routes = guarded_route("closed", "/closed") +
                                   guarded_route("open", "/open", "on_store_error: fail_open");
        proxy_config c;
        c.upstream_port = up.port;
        c.routes = routes;
        c.store = redis_lines(srv.url() + "/0");
        proxy_process p(c.yaml()); // throws (with the log) if it does not come up

        proxy_config strict = c;
        strict.admin = false;
        strict.top = "admin:\n  listen: 127.0.0.1:0\n  readiness: { require_store: true }\n";
        proxy_process q(strict.yaml());

        CHECK(p.log().find("starting degraded") != std::string::npos);
        CHECK(fetch(p.port, "GET", "/plain").status == 200);
        const auto closed = keyed_post(p.port, "/closed", unique_key("down"));
        CHECK(closed.status == 503);
        CHECK(json_member(closed.body, "code") == "idempotency.store_unavailable");
        const auto open_key = unique_key("open");
        const auto open = keyed_post(p.port, "/open", open_key);
        CHECK(open.status == 200);
        CHECK(up.count(open_key) == 1);
        // require_store: false → ready (plain routes serve); true → not ready.
        const auto ready = p.admin("/readyz");
        CHECK(ready.status == 200);
        CHECK(ready.body.find("(not required)") != std::string::npos);
        CHECK(q.admin("/readyz").status == 503);
        CHECK(p.proc.running());
        CHECK(q.proc.running());

        srv.start();
        const auto key = unique_key("back");
        http_response stored;
        CHECK(eventually(
            [&] {
                stored = keyed_post(p.port, "/closed", key);
                return stored.status == 200;
            },
            15s));
        CHECK(stored.header("Idempotency-Status") == "stored");
        // Each worker has its own connection, each back after its own backoff: the retry may
        // meet a worker still reconnecting (503, nothing run) before it is replayed.
        http_response replay;
        CHECK(eventually(
            [&] {
                replay = keyed_post(p.port, "/closed", key);
                return replay.status != 503;
            },
            15s));
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(up.count(key) == 1);
        CHECK(eventually([&] { return q.admin("/readyz").status == 200; }, 15s));
        CHECK(eventually([&] { return p.log().find("in service") != std::string::npos; }));
    }

    TEST_CASE("readiness follows the app: TCP check and HTTP check") {
        SUBCASE("tcp: 503 while nothing listens, 200 once the app is up, 503 when it stops") {
            const auto app_port = free_port();
            proxy_config c;
            c.upstream_port = app_port;
            c.admin = false;
            c.top = "admin:\n  listen: 127.0.0.1:0\n  readiness:\n"
                    "    upstream: { name: app, interval: 200ms, timeout: 150ms }\n";
            proxy_process p(c.yaml());
            CHECK(eventually([&] {
                const auto r = p.admin("/readyz");
                return r.status == 503 &&
                       r.body.find("upstream app: not answering") != std::string::npos;
            }));
            temp_dir dir;
            {
                auto app = start_upstream_on(app_port, dir);
                http_response r;
                CHECK(eventually([&] {
                    r = p.admin("/readyz");
                    return r.status == 200;
                }));
                CHECK(r.body.find("upstream app: accepts connections") != std::string::npos);
                CHECK(fetch(p.port, "GET", "/x").status == 200);
            } // SIGKILL
            CHECK(eventually([&] { return p.admin("/readyz").status == 503; }));
        }
        SUBCASE("http_path: a listener that never answers is not ready; the app's path is") {
            silent_listener silent;
            proxy_config c;
            c.upstream_port = silent.port;
            c.admin = false;
            c.top = "admin:\n  listen: 127.0.0.1:0\n  readiness:\n"
                    "    upstream: { name: app, http_path: /__health, interval: 200ms, "
                    "timeout: 150ms }\n";
            proxy_process p(c.yaml());
            http_response r;
            CHECK(eventually([&] {
                r = p.admin("/readyz");
                return r.body.find("upstream app: not answering") != std::string::npos;
            }));
            CHECK(r.status == 503);

            upstream_process up;
            proxy_config ok = c;
            ok.upstream_port = up.port;
            proxy_process q(ok.yaml());
            CHECK(eventually([&] {
                r = q.admin("/readyz");
                return r.status == 200;
            }));
            CHECK(r.body.find("upstream app: answers /__health") != std::string::npos);
        }
    }
}
