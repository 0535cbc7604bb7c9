// https:// upstreams (README "TLS: upstreams"): the real onceproxy binary in front of the real
// test upstream's TLS listener, with certificates from a throw-away CA. What is asserted is what
// a client and the upstream observe: answers, problem codes, executions, handshakes, the log.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/test_pki.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

/// The test upstream with a TLS listener (relaying to its plain one, which answers control
/// requests: counts, /__tls).
struct tls_upstream {
    temp_dir dir;
    process proc;
    unsigned short port = 0;     ///< plain listener
    unsigned short tls_port = 0; ///< TLS listener

    explicit tls_upstream(const cert_pair& server, const std::string& client_ca = "") {
        const auto port_file = dir.file("port");
        const auto tls_port_file = dir.file("tls_port");
        std::vector<std::string> argv{TEST_UPSTREAM_BIN, "--listen",   "127.0.0.1:0",
                                      "--port-file",     port_file,    "--tls-cert",
                                      server.cert_file,  "--tls-key",  server.key_file,
                                      "--tls-port-file", tls_port_file};
        if (!client_ca.empty()) {
            argv.insert(argv.end(), {"--tls-client-ca", client_ca});
        }
        proc = process(std::move(argv), dir.file("upstream.log"));
        const auto plain = wait_for_file(port_file, start_timeout);
        const auto tls = wait_for_file(tls_port_file, start_timeout);
        if (plain.empty() || tls.empty()) {
            throw std::runtime_error("the TLS test upstream did not start; its log:\n" +
                                     proc.log());
        }
        port = static_cast<unsigned short>(std::stoul(plain));
        tls_port = static_cast<unsigned short>(std::stoul(tls));
    }

    /// A member of GET /__tls: handshakes, resumed or failed.
    std::uint64_t tls(const std::string& what) const {
        const auto r = fetch(port, "GET", "/__tls");
        REQUIRE(r.status == 200);
        return std::stoull(json_member(r.body, what));
    }
    std::uint64_t total() const {
        const auto r = fetch(port, "GET", "/__counts");
        REQUIRE(r.status == 200);
        return std::stoull(json_member(r.body, "total"));
    }
    std::uint64_t count(const std::string& key) const {
        const auto r = fetch(port, "GET", "/__count?key=" + key);
        REQUIRE(r.status == 200);
        return std::stoull(json_member(r.body, "count"));
    }
};

/// A config with one https:// upstream (`tls_lines`: its `tls:` block, indented by 6), a
/// guarded route /v1/pay and a plain catch-all; one worker, so one upstream connection serves
/// sequential requests.
std::string config_for(unsigned short tls_port, const std::string& tls_lines,
                       const std::string& host = "127.0.0.1") {
    std::string y = "listen: 127.0.0.1:0\n"
                    "workers: 1\n"
                    "access_log: false\n"
                    "limits: { shutdown_delay: 0 }\n"
                    "upstreams:\n"
                    "  app:\n"
                    "    url: https://" +
                    host + ":" + std::to_string(tls_port) +
                    "\n"
                    "    connect_timeout: 2s\n";
    if (!tls_lines.empty()) {
        y += "    tls:\n" + tls_lines;
    }
    y += "store: { type: memory }\n"
         "routes:\n"
         "  - name: pay\n"
         "    match: { path: /v1/pay }\n"
         "    upstream: app\n"
         "    idempotency: { mode: required }\n"
         "  - name: all\n"
         "    match: { prefix: / }\n"
         "    upstream: app\n";
    return y;
}

std::string ca_line(const std::string& file) {
    return "      ca_file: " + file + "\n";
}

/// The failures every refused handshake must show: 502 upstream.tls_error, nothing executed,
/// the reason in the log (component upstream).
void check_refused(const tls_upstream& up, const proxy_process& proxy, const std::string& reason) {
    INFO(proxy.log());
    http_client c(proxy.port);
    const auto r = c.request("GET", "/plain");
    check_problem(r, 502, "upstream.tls_error");
    const auto g = c.request("POST", "/v1/pay", {{"Idempotency-Key", "refused-1"}}, "{}");
    check_problem(g, 502, "upstream.tls_error");
    CHECK(up.total() == 0);
    CHECK(eventually([&] {
        const auto log = proxy.log();
        return log.find("\"component\":\"upstream\"") != std::string::npos &&
               log.find("TLS handshake failed") != std::string::npos &&
               log.find(reason) != std::string::npos;
    }));
}

} // namespace

TEST_SUITE("https upstreams") {

    TEST_CASE("a trusted certificate: answers pass, connections and sessions are reused") {
        temp_dir dir;
        test_pki pki(dir.path());
        const auto server = pki.issue("server");
        tls_upstream up(server);
        proxy_process proxy(config_for(up.tls_port, ca_line(pki.ca_file())));
        http_client c(proxy.port);
        for (int i = 0; i < 5; ++i) {
            const auto r = c.request("GET", "/plain/" + std::to_string(i));
            REQUIRE(r.status == 200);
            CHECK(json_member(r.body, "path") == "/plain/" + std::to_string(i));
        }
        const auto g = c.request("POST", "/v1/pay", {{"Idempotency-Key", "tls-ok-1"}}, "{}");
        CHECK(g.status == 200);
        const auto replay = c.request("POST", "/v1/pay", {{"Idempotency-Key", "tls-ok-1"}}, "{}");
        CHECK(replay.status == 200);
        CHECK(replay.body == g.body);
        CHECK(up.count("tls-ok-1") == 1);
        // A streamed answer (larger than any hold limit) and a streamed request body.
        const auto big = c.request("GET", "/big", {{"X-Test-Body-Bytes", "3000000"}});
        CHECK(big.status == 200);
        CHECK(big.body.size() == 3'000'000);
        const std::string upload(900'000, 'u');
        const auto sent = c.request("POST", "/upload", {}, upload);
        CHECK(sent.status == 200);
        CHECK(json_member(sent.body, "body_bytes") == "900000");
        // One worker, sequential requests: one upstream connection, one handshake.
        CHECK(up.tls("handshakes") == 1);
        CHECK(up.total() == 8); // the replay did not reach it

        // The upstream closes after this answer: the next request needs a new connection,
        // whose handshake resumes the session of the first.
        const auto closing = c.request("GET", "/closing", {{"X-Test-Close-After-Reply", "1"}});
        CHECK(closing.status == 200);
        const auto after = c.request("GET", "/after");
        CHECK(after.status == 200);
        CHECK(up.tls("handshakes") == 2);
        CHECK(up.tls("resumed") == 1);
        CHECK(up.tls("failed") == 0);
    }

    TEST_CASE("server_name: SNI and the name checked; a name the certificate lacks is refused") {
        temp_dir dir;
        test_pki pki(dir.path());
        const auto server = pki.issue(
            "server", {.common_name = "payments.internal", .alt_names = {"DNS:payments.internal"}});
        tls_upstream up(server);
        SUBCASE("the certificate's name") {
            proxy_process proxy(config_for(
                up.tls_port, ca_line(pki.ca_file()) + "      server_name: payments.internal\n"));
            const auto r = fetch(proxy.port, "GET", "/named");
            CHECK(r.status == 200);
            CHECK(up.tls("handshakes") == 1);
        }
        SUBCASE("the url's host (127.0.0.1) is not in the certificate") {
            proxy_process proxy(config_for(up.tls_port, ca_line(pki.ca_file())));
            check_refused(up, proxy, "IP address mismatch");
        }
        SUBCASE("another name") {
            proxy_process proxy(config_for(up.tls_port, ca_line(pki.ca_file()) +
                                                            "      server_name: other.internal\n"));
            check_refused(up, proxy, "hostname mismatch");
        }
    }

    TEST_CASE("a certificate from another CA: 502 upstream.tls_error") {
        temp_dir dir;
        test_pki pki(dir.path());
        temp_dir other_dir;
        test_pki other(other_dir.path(), "another-ca");
        tls_upstream up(pki.issue("server"));
        SUBCASE("ca_file of another CA") {
            proxy_process proxy(config_for(up.tls_port, ca_line(other.ca_file())));
            check_refused(up, proxy, "certificate verify failed");
        }
        SUBCASE("no ca_file: the system's trust store does not know the test CA") {
            proxy_process proxy(config_for(up.tls_port, ""));
            check_refused(up, proxy, "certificate verify failed");
        }
        SUBCASE("verify: false accepts it (explicitly)") {
            proxy_process proxy(config_for(up.tls_port, "      verify: false\n"));
            const auto r = fetch(proxy.port, "GET", "/unverified");
            CHECK(r.status == 200);
        }
    }

    TEST_CASE("an expired certificate: 502 upstream.tls_error") {
        temp_dir dir;
        test_pki pki(dir.path());
        tls_upstream up(pki.issue("expired", {.days = -1}));
        proxy_process proxy(config_for(up.tls_port, ca_line(pki.ca_file())));
        check_refused(up, proxy, "certificate has expired");
    }

    TEST_CASE("an upstream that requires a client certificate") {
        temp_dir dir;
        test_pki pki(dir.path());
        tls_upstream up(pki.issue("server"), pki.ca_file());
        SUBCASE("configured: accepted") {
            const auto client = pki.issue(
                "client",
                {.common_name = "onceproxy", .alt_names = {"DNS:onceproxy"}, .client = true});
            proxy_process proxy(
                config_for(up.tls_port, ca_line(pki.ca_file()) +
                                            "      client_cert_file: " + client.cert_file +
                                            "\n"
                                            "      client_key_file: " +
                                            client.key_file + "\n"));
            http_client c(proxy.port);
            CHECK(c.request("GET", "/mtls").status == 200);
            const auto g = c.request("POST", "/v1/pay", {{"Idempotency-Key", "mtls-1"}}, "{}");
            CHECK(g.status == 200);
            CHECK(up.count("mtls-1") == 1);
            CHECK(up.tls("handshakes") == 1);
        }
        SUBCASE("not configured: refused, nothing executed") {
            proxy_process proxy(config_for(up.tls_port, ca_line(pki.ca_file())));
            check_refused(up, proxy, "certificate required");
        }
    }

    TEST_CASE("guarded route: a failed handshake releases the key (no 409, no replay)") {
        temp_dir dir;
        test_pki pki(dir.path());
        temp_dir other_dir;
        test_pki other(other_dir.path(), "another-ca");
        tls_upstream up(pki.issue("server"));
        proxy_process proxy(config_for(up.tls_port, ca_line(other.ca_file())));
        http_client c(proxy.port);
        const header_list key{{"Idempotency-Key", "handshake-released"}};
        check_problem(c.request("POST", "/v1/pay", key, "{\"n\":1}"), 502, "upstream.tls_error");
        // Not in flight, not recorded: the retry runs again (and fails the same way).
        const auto second = c.request("POST", "/v1/pay", key, "{\"n\":1}");
        check_problem(second, 502, "upstream.tls_error");
        CHECK(second.header("Idempotency-Status") != "replayed");
        CHECK(up.count("handshake-released") == 0);

        // The CA fixed by a reload: the same key now executes, once.
        std::ofstream(proxy.config_file, std::ios::trunc)
            << config_for(up.tls_port, ca_line(pki.ca_file()));
        REQUIRE(::kill(proxy.proc.pid(), SIGHUP) == 0);
        CHECK(eventually(
            [&] { return fetch(proxy.port, "POST", "/v1/pay", key, "{\"n\":1}").status == 200; }));
        CHECK(up.count("handshake-released") == 1);
    }

    TEST_CASE("rotated TLS files: new connections use them, without a restart") {
        temp_dir dir;
        test_pki pki(dir.path());
        temp_dir other_dir;
        test_pki other(other_dir.path(), "another-ca");
        tls_upstream up(pki.issue("server"));
        const auto read = [](const std::string& path) {
            std::ifstream in(path);
            return std::string(std::istreambuf_iterator<char>(in), {});
        };
        // As a Secret update or cert-manager does it: the new file appears at once (rename).
        temp_dir mounted;
        const auto ca = mounted.file("ca.pem");
        const auto replace_ca = [&](const std::string& content) {
            const auto next = mounted.write("ca.pem.next", content);
            REQUIRE(std::rename(next.c_str(), ca.c_str()) == 0);
        };
        const auto with_admin = [](const std::string& yaml) {
            return yaml + "admin:\n  listen: 127.0.0.1:0\n";
        };
        const header_list closing{{"X-Test-Close-After-Reply", "1"}}; // the next one reconnects
        const auto status = [&](const proxy_process& p) {
            return fetch(p.port, "GET", "/rotated", closing).status;
        };
        const std::string successes = "onceproxy_upstream_tls_reloads_total{result=\"success\"}";
        const std::string failures = "onceproxy_upstream_tls_reloads_total{result=\"failure\"}";

        SUBCASE("a ca_file replaced is seen within reload_interval") {
            replace_ca(read(other.ca_file()));
            proxy_process proxy(with_admin(
                config_for(up.tls_port, ca_line(ca) + "      reload_interval: 100ms\n")));
            INFO(proxy.log());
            check_problem(fetch(proxy.port, "GET", "/before"), 502, "upstream.tls_error");
            replace_ca(read(pki.ca_file()));
            CHECK(eventually([&] { return status(proxy) == 200; }));
            CHECK(proxy.metric(successes) == 1);
            CHECK(proxy.metric(failures) == 0);
            CHECK(proxy.log().find("upstream TLS files reloaded") != std::string::npos);
        }
        SUBCASE("files that do not load: the ones in use stay, the next change is used") {
            replace_ca(read(pki.ca_file()));
            proxy_process proxy(with_admin(
                config_for(up.tls_port, ca_line(ca) + "      reload_interval: 100ms\n")));
            INFO(proxy.log());
            REQUIRE(status(proxy) == 200);
            replace_ca("not a certificate\n");
            REQUIRE(eventually([&] { return proxy.metric(failures) == 1; }));
            CHECK(proxy.log().find("upstream TLS files changed but do not load") !=
                  std::string::npos);
            const auto handshakes = up.tls("handshakes");
            CHECK(status(proxy) == 200); // a new connection, made with the CA loaded before
            CHECK(up.tls("handshakes") == handshakes + 1);
            replace_ca(read(other.ca_file())); // loads, but does not vouch for the upstream
            REQUIRE(eventually([&] { return proxy.metric(successes) == 1; }));
            CHECK(eventually([&] { return status(proxy) == 502; }));
        }
        SUBCASE("a client certificate renewed in place (cert-manager): mTLS goes on") {
            tls_upstream mtls(pki.issue("mtls-server"), pki.ca_file());
            const auto expired = pki.issue(
                "expired-client", {.common_name = "onceproxy", .days = -1, .client = true});
            const auto renewed =
                pki.issue("renewed-client", {.common_name = "onceproxy", .client = true});
            const auto cert = mounted.file("tls.crt");
            const auto key = mounted.file("tls.key");
            // The pair swapped at once, as a Secret volume does: a new directory, one rename.
            int version = 0;
            const auto mount = [&](const cert_pair& pair) {
                const auto versioned = mounted.file("v" + std::to_string(++version));
                std::filesystem::create_directory(versioned);
                std::filesystem::copy_file(pair.cert_file, versioned + "/tls.crt");
                std::filesystem::copy_file(pair.key_file, versioned + "/tls.key");
                const auto link = mounted.file("data.next");
                std::filesystem::create_directory_symlink(versioned, link);
                REQUIRE(std::rename(link.c_str(), mounted.file("data").c_str()) == 0);
            };
            mount(expired);
            if (!std::filesystem::exists(cert)) {
                std::filesystem::create_symlink(mounted.file("data/tls.crt"), cert);
                std::filesystem::create_symlink(mounted.file("data/tls.key"), key);
            }
            proxy_process proxy(with_admin(config_for(
                mtls.tls_port, ca_line(pki.ca_file()) + "      client_cert_file: " + cert +
                                   "\n      client_key_file: " + key +
                                   "\n      reload_interval: 100ms\n")));
            INFO(proxy.log());
            check_problem(fetch(proxy.port, "GET", "/expired"), 502, "upstream.tls_error");
            CHECK(mtls.total() == 0);
            mount(renewed);
            CHECK(eventually([&] { return status(proxy) == 200; }));
            CHECK(proxy.metric(successes) >= 1);
        }
        SUBCASE("reload_interval: 0: read on SIGHUP only") {
            replace_ca(read(other.ca_file()));
            proxy_process proxy(
                with_admin(config_for(up.tls_port, ca_line(ca) + "      reload_interval: 0\n")));
            INFO(proxy.log());
            check_problem(fetch(proxy.port, "GET", "/before"), 502, "upstream.tls_error");
            replace_ca(read(pki.ca_file()));
            // Real time is the subject: past a check tick (1 s), no upstream is due.
            std::this_thread::sleep_for(1500ms);
            check_problem(fetch(proxy.port, "GET", "/unchecked"), 502, "upstream.tls_error");
            CHECK(proxy.metric(successes) == 0);
            REQUIRE(::kill(proxy.proc.pid(), SIGHUP) == 0); // the same config file
            CHECK(eventually([&] { return status(proxy) == 200; }));
            CHECK(proxy.metric(successes) == 1); // a rotation picked up by SIGHUP counts too
        }
    }

    TEST_CASE("readiness http_path on an https:// upstream: GET over the upstream's TLS") {
        temp_dir dir;
        test_pki pki(dir.path());
        temp_dir other_dir;
        test_pki other(other_dir.path(), "another-ca");
        tls_upstream up(pki.issue("server"));
        const auto with_readiness = [&](const std::string& ca) {
            return config_for(up.tls_port, ca_line(ca)) +
                   "admin:\n  listen: 127.0.0.1:0\n  readiness:\n"
                   "    upstream: { name: app, http_path: /__health, interval: 200ms, "
                   "timeout: 200ms }\n";
        };
        SUBCASE("a certificate that verifies: ready") {
            proxy_process proxy(with_readiness(pki.ca_file()));
            INFO(proxy.log());
            http_response r;
            CHECK(eventually([&] {
                r = proxy.admin("/readyz");
                return r.status == 200;
            }));
            CHECK(r.body.find("upstream app: answers /__health") != std::string::npos);
            CHECK(up.tls("handshakes") >= 1);
        }
        SUBCASE("a certificate from another CA: not ready, and the body says why") {
            proxy_process proxy(with_readiness(other.ca_file()));
            INFO(proxy.log());
            http_response r;
            CHECK(eventually([&] {
                r = proxy.admin("/readyz");
                return r.body.find("certificate verify failed") != std::string::npos;
            }));
            CHECK(r.status == 503);
        }
    }

    TEST_CASE("bad TLS files: --check-config and a start fail alike, with file:line:column") {
        temp_dir dir;
        test_pki pki(dir.path());
        const auto client = pki.issue("client", {.client = true});
        const auto stranger = pki.issue("stranger"); // its key matches no client certificate
        const auto garbage = dir.write("garbage.pem", "not a certificate\n");
        struct bad_case {
            std::string tls_lines;
            std::string position; ///< ":line:column:" of the bad value
            std::string message;
        };
        const std::vector<bad_case> cases{
            {ca_line(dir.file("missing.pem")), ":10:16:", "No such file or directory"},
            {ca_line(garbage), ":10:16:", "cannot load CA certificates"},
            {"      client_cert_file: " + garbage + "\n      client_key_file: " + client.key_file +
                 "\n",
             ":10:25:", "cannot load a PEM certificate chain"},
            {"      client_cert_file: " + client.cert_file +
                 "\n      client_key_file: " + stranger.key_file + "\n",
             ":11:24:", "does not match"},
            {"      client_cert_file: " + client.cert_file + "\n",
             ":10:25:", "client_cert_file and client_key_file go together"},
        };
        for (std::size_t i = 0; i < cases.size(); ++i) {
            const auto& bad = cases[i];
            CAPTURE(bad.tls_lines);
            const auto n = std::to_string(i);
            const auto file = dir.write("bad" + n + ".yaml", config_for(4443, bad.tls_lines));
            process check({ONCEPROXY_BIN, "--check-config", file}, dir.file("check" + n + ".log"));
            CHECK(check.wait(10s) != 0);
            const auto checked = check.log();
            CAPTURE(checked);
            CHECK(checked.find(file + bad.position) != std::string::npos);
            CHECK(checked.find(bad.message) != std::string::npos);
            process start({ONCEPROXY_BIN, "--config", file}, dir.file("start" + n + ".log"));
            CHECK(start.wait(10s) != 0);
            const auto started = start.log();
            CAPTURE(started);
            CHECK(started.find(file + bad.position) != std::string::npos);
            CHECK(started.find(bad.message) != std::string::npos);
        }
    }
}

TEST_SUITE("https upstreams of egress routes") {

    /// An egress-only config calling the https upstream at `tls_port` (`tls_lines`: its tls
    /// block, indented by 6).
    std::string egress_config(unsigned short tls_port, const std::string& tls_lines) {
        return "listen: 127.0.0.1:0\n"
               "workers: 1\n"
               "access_log: false\n"
               "limits: { shutdown_delay: 0 }\n"
               "upstreams:\n"
               "  provider:\n"
               "    url: https://127.0.0.1:" +
               std::to_string(tls_port) + "\n" +
               (tls_lines.empty() ? "" : "    tls:\n" + tls_lines) +
               "egress:\n"
               "  listen: 127.0.0.1:0\n"
               "  routes:\n"
               "    - name: provider\n"
               "      match: { prefix: / }\n"
               "      upstream: provider\n"
               "      retry: { base_delay: 10ms, max_delay: 50ms }\n";
    }

    TEST_CASE("a verified https upstream: a failed attempt is retried over TLS under one key") {
        temp_dir dir;
        test_pki pki(dir.path());
        tls_upstream up(pki.issue("server"));
        proxy_process proxy(egress_config(up.tls_port, ca_line(pki.ca_file())));
        REQUIRE(proxy.egress_port != 0);
        INFO(proxy.log());
        const auto r = fetch(proxy.egress_port, "POST", "/v1/charges",
                             {{"X-Test-Fail-Times", "1"}, {"Content-Type", "application/json"}},
                             R"({"amount":1})");
        CHECK(r.status == 200);
        CHECK(r.header("Onceproxy-Attempts") == "2");
        const auto key = r.header("Idempotency-Key");
        REQUIRE(key.size() == 36);
        CHECK(json_member(r.body, "key") == key); // what the upstream received
        CHECK(up.count(key) == 2);
        // The upstream was asked for by its own name, not the egress listener's.
        CHECK(up.tls("failed") == 0);
    }

    TEST_CASE("an upstream certificate that does not verify: 502 upstream.tls_error, not retried") {
        temp_dir dir;
        test_pki pki(dir.path());
        tls_upstream up(pki.issue("server"));
        proxy_process proxy(egress_config(up.tls_port, "")); // the system's trust store
        INFO(proxy.log());
        const auto r = fetch(proxy.egress_port, "POST", "/v1/charges", {}, "{}");
        check_problem(r, 502, "upstream.tls_error");
        CHECK(r.header("Onceproxy-Attempts") == "1"); // it would fail the same way again
        CHECK(up.total() == 0);
    }
}
