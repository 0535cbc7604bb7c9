// Inbound TLS (README "TLS: inbound") with real handshakes: curl and `openssl s_client` against
// the real binary, certificates from a throw-away CA (test_pki). Server certificate checks,
// mTLS, keys scoped by the client certificate, rotation by a Secret-style symlink swap under
// load, the rotation metrics, and --check-config agreeing with a start.

#include "support/http_client.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/test_pki.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

/// curl over TLS to 127.0.0.1:`port` (bounded at 5 s); prints the body, then "|" and the status.
command_result curl(unsigned short port, const std::string& path, const std::string& ca,
                    std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{
        "curl", "-sS",           "-m",
        "5",    "--cacert",      ca,
        "-w",   "|%{http_code}", "https://127.0.0.1:" + std::to_string(port) + path};
    argv.insert(argv.end() - 1, extra.begin(), extra.end());
    return run_command(argv);
}

/// The subject line of the certificate the server at `port` presents.
std::string served_subject(unsigned short port) {
    const auto r = run_command({"openssl", "s_client", "-connect",
                                "127.0.0.1:" + std::to_string(port), "-servername", "localhost"});
    const auto at = r.output.find("subject=");
    if (at == std::string::npos) {
        return "(none)\n" + r.output;
    }
    return r.output.substr(at, r.output.find('\n', at) - at);
}

/// notAfter of a PEM certificate, seconds since the epoch (via openssl x509 -enddate).
long long not_after(const std::string& cert) {
    const auto out =
        run_openssl({"x509", "-noout", "-enddate", "-dateopt", "iso_8601", "-in", cert});
    // notAfter=2026-12-23 17:50:00Z
    std::tm tm{};
    const auto at = out.find('=');
    REQUIRE(at != std::string::npos);
    REQUIRE(strptime(out.c_str() + at + 1, "%Y-%m-%d %H:%M:%S", &tm) != nullptr);
    return static_cast<long long>(timegm(&tm));
}

/// A mounted Secret as the kubelet writes it: <dir>/tls.crt -> ..data/tls.crt, and ..data a
/// symlink to a versioned directory, swapped in one rename.
struct secret_dir {
    std::string dir;
    int version = 0;

    explicit secret_dir(std::string d) : dir(std::move(d)) {}

    std::string cert() const { return dir + "/tls.crt"; }
    std::string key() const { return dir + "/tls.key"; }

    void publish(const cert_pair& pair) {
        namespace fs = std::filesystem;
        const auto v = "..v" + std::to_string(++version);
        fs::create_directories(dir + "/" + v);
        fs::copy_file(pair.cert_file, dir + "/" + v + "/tls.crt");
        fs::copy_file(pair.key_file, dir + "/" + v + "/tls.key");
        fs::create_symlink(v, dir + "/..data_tmp");
        fs::rename(dir + "/..data_tmp", dir + "/..data");
        if (version == 1) {
            fs::create_symlink("..data/tls.crt", cert());
            fs::create_symlink("..data/tls.key", key());
        }
    }
};

proxy_config config_for(unsigned short upstream_port) {
    proxy_config c;
    c.upstream_port = upstream_port;
    return c;
}

std::string tls_block(const std::string& cert, const std::string& key, std::string more = "") {
    return "tls:\n  cert_file: " + cert + "\n  key_file: " + key + "\n" + more;
}

struct pki_fixture {
    temp_dir dir;
    test_pki ca{dir.path(), "test-ca"};
    cert_pair server = ca.issue("server");
    upstream_process upstream;
};

/// How a TLS connection to 127.0.0.1:`port` ended after `request` was sent: what was read,
/// then "|close_notify" when the server ended the TLS session (SSL_ERROR_ZERO_RETURN), or
/// "|cut: <OpenSSL's reason>" when the connection closed without it (OpenSSL 3 reports
/// "unexpected eof while reading"). Reads are bounded at 5 s.
std::string tls_ending(unsigned short port, const std::string& ca, const std::string& request) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    REQUIRE(SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) == 1);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, "localhost");
    std::string out;
    if (SSL_connect(ssl) != 1) {
        out = "|handshake failed";
    } else {
        REQUIRE(SSL_write(ssl, request.data(), static_cast<int>(request.size())) ==
                static_cast<int>(request.size()));
        std::array<char, 4096> buf{};
        int n = 0;
        while ((n = SSL_read(ssl, buf.data(), static_cast<int>(buf.size()))) > 0) {
            out.append(buf.data(), static_cast<std::size_t>(n));
        }
        if (SSL_get_error(ssl, n) == SSL_ERROR_ZERO_RETURN) {
            out += "|close_notify";
        } else {
            std::array<char, 256> why{};
            ERR_error_string_n(ERR_peek_error(), why.data(), why.size());
            out += std::string("|cut: ") + why.data();
        }
        ERR_clear_error();
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
    return out;
}

} // namespace

TEST_CASE("TLS connections end with close_notify, so a client can tell the end from a cut") {
    pki_fixture f;
    auto c = config_for(f.upstream.port);
    c.top = tls_block(f.server.cert_file, f.server.key_file);
    proxy_process p(c.yaml());
    SUBCASE("after an answer with Connection: close") {
        const auto r = tls_ending(p.tls_port, f.ca.ca_file(),
                                  "GET /ends HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        CHECK(r.starts_with("HTTP/1.1 200"));
        CHECK(r.ends_with("|close_notify"));
    }
    SUBCASE("after a refused request (400)") {
        const auto r = tls_ending(p.tls_port, f.ca.ca_file(), "GET /ends HTTP/1.1\r\n\r\n");
        CHECK(r.starts_with("HTTP/1.1 400"));
        CHECK(r.ends_with("|close_notify"));
    }
    SUBCASE("an idle keep-alive connection at a drain") {
        std::string r;
        std::thread client([&] {
            r = tls_ending(p.tls_port, f.ca.ca_file(), "GET /idle HTTP/1.1\r\nHost: x\r\n\r\n");
        });
        // The answer is read, the connection stays open: idle until SIGTERM drains it.
        CHECK(eventually([&] { return p.metric("onceproxy_open_connections") == 1; }));
        wait_until(
            [&] {
                return p.metric("onceproxy_requests_total{route=\"everything-else\",outcome="
                                "\"passthrough\"}") == 1;
            },
            5s, "the request is answered");
        CHECK(p.terminate() == 0);
        client.join();
        CHECK(r.starts_with("HTTP/1.1 200"));
        CHECK(r.ends_with("|close_notify"));
    }
    SUBCASE("an HTTP/1.0 answer the upstream broke off: no close_notify, the cut shows") {
        // Chunked from the upstream, so close-delimited to the HTTP/1.0 client: only a close
        // without close_notify tells it that the body is not whole.
        const auto r = tls_ending(p.tls_port, f.ca.ca_file(),
                                  "GET /cut HTTP/1.0\r\nX-Test-Chunked: 1\r\n"
                                  "X-Test-Body-Bytes: 4194304\r\n"
                                  "X-Test-Cut-After-Bytes: 1048576\r\n\r\n");
        CHECK(r.starts_with("HTTP/1.1 200"));
        CHECK(r.size() < 4194304);
        CHECK(r.find("|close_notify") == std::string::npos);
        CHECK(r.find("|cut: ") != std::string::npos);
    }
    SUBCASE("an HTTP/1.0 answer, which ends at the close") {
        const auto r = tls_ending(p.tls_port, f.ca.ca_file(), "GET /ends HTTP/1.0\r\n\r\n");
        CHECK(r.starts_with("HTTP/1.1 200"));
        CHECK(r.ends_with("|close_notify"));
    }
}

TEST_CASE("TLS on the listener: curl verifies the chain, speaks HTTP/2 or HTTP/1.1 over TLS 1.3") {
    pki_fixture f;
    auto c = config_for(f.upstream.port);
    c.top = tls_block(f.server.cert_file, f.server.key_file);
    proxy_process p(c.yaml());
    REQUIRE(p.tls_port == p.port); // tls.listen unset: `listen` itself serves TLS

    const auto ok = curl(p.tls_port, "/hello", f.ca.ca_file(),
                         {"-w", "|%{http_code}|%{http_version}|%{ssl_verify_result}"});
    CHECK(ok.status == 0);
    CHECK(ok.output.find("|200|2|0") != std::string::npos); // ALPN h2 (http2.tls)
    const auto h1 = curl(p.tls_port, "/hello", f.ca.ca_file(),
                         {"--http1.1", "-w", "|%{http_code}|%{http_version}|%{ssl_verify_result}"});
    CHECK(h1.output.find("|200|1.1|0") != std::string::npos);

    // ALPN h2 first, then http/1.1; TLS 1.3 by default, TLS 1.2 accepted.
    const auto s13 =
        run_command({"openssl", "s_client", "-connect", "127.0.0.1:" + std::to_string(p.tls_port),
                     "-alpn", "h2,http/1.1", "-CAfile", f.ca.ca_file()});
    CHECK(s13.output.find("New, TLSv1.3") != std::string::npos);
    CHECK(s13.output.find("ALPN protocol: h2") != std::string::npos);
    const auto s11 =
        run_command({"openssl", "s_client", "-connect", "127.0.0.1:" + std::to_string(p.tls_port),
                     "-alpn", "http/1.1", "-CAfile", f.ca.ca_file()});
    CHECK(s11.output.find("ALPN protocol: http/1.1") != std::string::npos);
    const auto s12 =
        run_command({"openssl", "s_client", "-connect", "127.0.0.1:" + std::to_string(p.tls_port),
                     "-tls1_2", "-CAfile", f.ca.ca_file(), "-brief"});
    CHECK(s12.output.find("Protocol version: TLSv1.2") != std::string::npos);
    CHECK(s12.output.find("Verification: OK") != std::string::npos);

    // A plain HTTP request to the TLS port is not answered as HTTP.
    const auto plain =
        run_command({"curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
                     "http://127.0.0.1:" + std::to_string(p.tls_port) + "/"});
    CHECK(plain.output.find("200") == std::string::npos);
    CHECK(p.metric("onceproxy_tls_handshake_failures_total") >= 1);
}

TEST_CASE("TLS session resumption: a second connection resumes the first one's session") {
    pki_fixture f;
    auto c = config_for(f.upstream.port);
    c.top = tls_block(f.server.cert_file, f.server.key_file);
    proxy_process p(c.yaml());
    const auto session = f.dir.file("session.pem");
    for (const char* version : {"-tls1_2", "-tls1_3"}) {
        CAPTURE(version);
        const auto target = "127.0.0.1:" + std::to_string(p.tls_port);
        const auto first =
            run_command({"openssl", "s_client", "-connect", target, version, "-CAfile",
                         f.ca.ca_file(), "-sess_out", session, "-ign_eof"});
        CHECK(first.output.find("New, TLSv1") != std::string::npos);
        const auto second = run_command({"openssl", "s_client", "-connect", target, version,
                                         "-CAfile", f.ca.ca_file(), "-sess_in", session});
        CHECK(second.output.find("Reused, TLSv1") != std::string::npos);
    }
}

TEST_CASE("plain and TLS listeners side by side; a wrong CA or an expired certificate is refused "
          "by the client") {
    pki_fixture f;
    temp_dir other_dir;
    test_pki other(other_dir.path(), "other-ca");
    auto c = config_for(f.upstream.port);
    c.top = tls_block(f.server.cert_file, f.server.key_file, "  listen: 127.0.0.1:0\n");
    proxy_process p(c.yaml());
    REQUIRE(p.tls_port != 0);
    REQUIRE(p.tls_port != p.port);

    CHECK(fetch(p.port, "GET", "/plain").status == 200);
    CHECK(curl(p.tls_port, "/tls", f.ca.ca_file()).output.find("|200") != std::string::npos);

    const auto wrong = curl(p.tls_port, "/tls", other.ca_file());
    CHECK(wrong.status == 60); // peer certificate cannot be authenticated
    CHECK(wrong.output.find("|200") == std::string::npos);

    leaf_options expired;
    expired.days = -1;
    const auto old = f.ca.issue("expired", expired);
    auto e = config_for(f.upstream.port);
    e.top = tls_block(old.cert_file, old.key_file);
    proxy_process q(e.yaml());
    const auto r = curl(q.tls_port, "/tls", f.ca.ca_file());
    CHECK(r.status == 60);
    CHECK(r.output.find("expired") != std::string::npos);
    CHECK(q.metric("onceproxy_tls_certificate_expiry_timestamp_seconds") ==
          not_after(old.leaf_file));
}

TEST_CASE("mTLS: require_client_cert refuses a client without a certificate or with one from "
          "another CA") {
    pki_fixture f;
    temp_dir other_dir;
    test_pki other(other_dir.path(), "other-ca");
    leaf_options client;
    client.client = true;
    client.common_name = "alice";
    const auto alice = f.ca.issue("alice", client);
    const auto mallory = other.issue("mallory", client);
    auto c = config_for(f.upstream.port);
    c.top = tls_block(f.server.cert_file, f.server.key_file,
                      "  client_ca_file: " + f.ca.ca_file() + "\n  require_client_cert: true\n");
    proxy_process p(c.yaml());

    const auto none = curl(p.tls_port, "/x", f.ca.ca_file());
    CHECK(none.status != 0);
    CHECK(none.output.find("|200") == std::string::npos);
    const auto foreign = curl(p.tls_port, "/x", f.ca.ca_file(),
                              {"--cert", mallory.cert_file, "--key", mallory.key_file});
    CHECK(foreign.status != 0);
    CHECK(foreign.output.find("|200") == std::string::npos);
    const auto good = curl(p.tls_port, "/x", f.ca.ca_file(),
                           {"--cert", alice.cert_file, "--key", alice.key_file});
    CHECK(good.status == 0);
    CHECK(good.output.find("|200") != std::string::npos);
}

TEST_CASE("principal: client_cert scopes keys by the verified client certificate") {
    pki_fixture f;
    leaf_options client;
    client.client = true;
    client.common_name = "alice";
    const auto alice = f.ca.issue("alice", client);
    client.common_name = "bob";
    const auto bob = f.ca.issue("bob", client);
    auto c = config_for(f.upstream.port);
    c.routes = "  - name: payments\n"
               "    match: { path: /v1/payments }\n"
               "    upstream: app\n"
               "    idempotency: { mode: required, scope: { principal: client_cert } }\n";
    c.top = tls_block(f.server.cert_file, f.server.key_file,
                      "  client_ca_file: " + f.ca.ca_file() + "\n  require_client_cert: true\n");
    proxy_process p(c.yaml());
    const std::string key = "tls-principal-key";
    const auto post = [&](const cert_pair& who) {
        return curl(p.tls_port, "/v1/payments", f.ca.ca_file(),
                    {"--http1.1", "--cert", who.cert_file, "--key", who.key_file, "-X", "POST",
                     "-H", "Idempotency-Key: " + key, "-H", "Content-Type: application/json", "-d",
                     "{\"amount\":1}", "-D", "-"});
    };
    const auto a1 = post(alice);
    CHECK(a1.output.find("|200") != std::string::npos);
    CHECK(f.upstream.count(key) == 1);
    const auto b1 = post(bob); // same key, same body, another certificate: its own execution
    CHECK(b1.output.find("|200") != std::string::npos);
    CHECK(b1.output.find("Idempotency-Status: stored") != std::string::npos);
    CHECK(f.upstream.count(key) == 2);
    const auto a2 = post(alice); // alice's retry: replayed
    CHECK(a2.output.find("Idempotency-Status: replayed") != std::string::npos);
    CHECK(f.upstream.count(key) == 2);
}

TEST_CASE("principal: client_cert: the keys API finds and purges a record made over mTLS by "
          "the certificate subject") {
    pki_fixture f;
    leaf_options client;
    client.client = true;
    client.common_name = "alice";
    const auto alice = f.ca.issue("alice", client);
    auto c = config_for(f.upstream.port);
    c.routes = "  - name: payments\n"
               "    match: { path: /v1/payments }\n"
               "    upstream: app\n"
               "    idempotency: { mode: required, scope: { principal: client_cert } }\n";
    c.top = tls_block(f.server.cert_file, f.server.key_file,
                      "  client_ca_file: " + f.ca.ca_file() + "\n  require_client_cert: true\n");
    const std::string token(40, 't');
    c.admin_settings = {
        "keys_api: { enabled: true, token_file: " + f.dir.write("admin-token", token) + " }"};
    proxy_process p(c.yaml());
    const std::string key = "tls-admin-key";
    const auto post = [&] {
        return curl(p.tls_port, "/v1/payments", f.ca.ca_file(),
                    {"--http1.1", "--cert", alice.cert_file, "--key", alice.key_file, "-X", "POST",
                     "-H", "Idempotency-Key: " + key, "-H", "Content-Type: application/json", "-d",
                     "{\"amount\":1}", "-D", "-"});
    };
    const auto keys = [&](const std::string& method, const std::string& query) {
        return fetch(p.admin_port, method, "/admin/v1/keys?route=payments&key=" + key + query,
                     {{"Authorization", "Bearer " + token}});
    };
    const auto first = post();
    REQUIRE(first.output.find("|200") != std::string::npos);
    REQUIRE(f.upstream.count(key) == 1);

    // The subject as the proxy reads it (RFC 2253) addresses alice's record; another subject
    // or none does not.
    const auto found = keys("GET", "&principal=CN%3Dalice");
    CHECK(found.status == 200);
    CHECK(found.body.find("\"state\":\"completed\"") != std::string::npos);
    CHECK(keys("GET", "&principal=CN%3Dbob").body.find("\"state\":\"absent\"") !=
          std::string::npos);
    CHECK(keys("GET", "").body.find("\"state\":\"absent\"") != std::string::npos);
    // One subject only.
    const auto twice = keys("GET", "&principal=CN%3Dalice&principal=CN%3Dbob");
    CHECK(twice.status == 400);
    CHECK(twice.body.find("\"code\":\"admin.bad_request\"") != std::string::npos);
    CHECK(twice.body.find("give its subject once") != std::string::npos);

    // Purged: alice's retry executes again instead of replaying.
    const auto purged = keys("DELETE", "&principal=CN%3Dalice");
    CHECK(purged.status == 200);
    CHECK(purged.body.find("\"purged\":true") != std::string::npos);
    CHECK(purged.body.find("\"was\":\"completed\"") != std::string::npos);
    CHECK(keys("GET", "&principal=CN%3Dalice").body.find("\"state\":\"absent\"") !=
          std::string::npos);
    const auto again = post();
    CHECK(again.output.find("|200") != std::string::npos);
    CHECK(again.output.find("Idempotency-Status: stored") != std::string::npos);
    CHECK(f.upstream.count(key) == 2);
}

TEST_CASE("certificate rotation: a symlink swap serves the new pair to new connections, with no "
          "failed request; a broken pair is refused and the old one stays") {
    pki_fixture f;
    leaf_options second;
    second.common_name = "rotated";
    second.days = 90;
    const auto next = f.ca.issue("rotated", second);
    secret_dir secret(f.dir.file("secret"));
    secret.publish(f.server);
    auto c = config_for(f.upstream.port);
    c.top = tls_block(secret.cert(), secret.key(), "  reload_interval: 200ms\n");
    proxy_process p(c.yaml());
    CHECK(served_subject(p.tls_port).find("CN = localhost") != std::string::npos);
    CHECK(p.metric("onceproxy_tls_certificate_expiry_timestamp_seconds") ==
          not_after(f.server.leaf_file));

    // Requests on fresh connections all through the swap.
    std::atomic<bool> stop{false};
    std::atomic<int> sent{0};
    std::vector<std::string> failures;
    std::thread load([&] {
        while (!stop) {
            const auto r = curl(p.tls_port, "/load", f.ca.ca_file());
            ++sent;
            if (r.status != 0 || r.output.find("|200") == std::string::npos) {
                failures.push_back(r.output);
            }
        }
    });
    wait_until([&] { return sent >= 3; }, 10s, "requests before the swap");
    secret.publish(next);
    CHECK(eventually(
        [&] { return served_subject(p.tls_port).find("CN = rotated") != std::string::npos; }));
    const int rotated_at = sent;
    wait_until([&] { return sent >= rotated_at + 3; }, 10s, "requests after the swap");
    stop = true;
    load.join();
    CHECK(sent > 5);
    CHECK(failures.empty());
    if (!failures.empty()) {
        MESSAGE(failures.front());
    }
    CHECK(p.metric("onceproxy_tls_certificate_reloads_total{result=\"success\"}") == 1);
    CHECK(p.metric("onceproxy_tls_certificate_reloads_total{result=\"failure\"}") == 0);
    CHECK(p.metric("onceproxy_tls_certificate_expiry_timestamp_seconds") ==
          not_after(next.leaf_file));

    // A broken pair (the key of another certificate): logged, counted, the rotated one stays.
    cert_pair broken{next.cert_file, f.server.key_file, next.leaf_file};
    secret.publish(broken);
    CHECK(eventually([&] {
        return p.metric("onceproxy_tls_certificate_reloads_total{result=\"failure\"}") == 1;
    }));
    CHECK(p.log().find("certificate reload failed") != std::string::npos);
    CHECK(served_subject(p.tls_port).find("CN = rotated") != std::string::npos);
    CHECK(curl(p.tls_port, "/after", f.ca.ca_file()).output.find("|200") != std::string::npos);

    // SIGHUP reloads a changed pair too (polling aside: the first pair again).
    secret.publish(f.server);
    p.proc.signal(SIGHUP);
    CHECK(eventually(
        [&] { return served_subject(p.tls_port).find("CN = localhost") != std::string::npos; }));
    CHECK(p.metric("onceproxy_tls_certificate_reloads_total{result=\"success\"}") == 2);
}

TEST_CASE("--check-config and a start refuse missing or unparsable TLS files at their key") {
    pki_fixture f;
    const auto garbage = f.dir.write("garbage.pem", "not a certificate\n");
    const auto check = [&](const std::string& tls) {
        auto c = config_for(f.upstream.port);
        c.top = tls;
        const auto file = f.dir.write("check.yaml", c.yaml());
        const auto r = run_command({ONCEPROXY_BIN, "--check-config", file});
        return std::make_pair(r, file);
    };
    {
        const auto [r, file] = check(tls_block(f.dir.file("missing.pem"), f.server.key_file));
        CHECK(r.status != 0);
        CHECK(r.output.find(file + ":") != std::string::npos);
        CHECK(r.output.find("tls.cert_file: cannot read cert_file") != std::string::npos);
    }
    {
        const auto [r, file] = check(tls_block(f.server.cert_file, garbage));
        CHECK(r.status != 0);
        CHECK(r.output.find("tls.key_file: key_file '" + garbage + "' holds no usable PEM") !=
              std::string::npos);
    }
    {
        const auto [r, file] =
            check(tls_block(f.server.cert_file, f.server.key_file,
                            "  client_ca_file: " + garbage + "\n  require_client_cert: true\n"));
        CHECK(r.status != 0);
        CHECK(r.output.find("tls.client_ca_file: client_ca_file") != std::string::npos);
    }
    {
        const auto other = f.ca.issue("other");
        const auto [r, file] = check(tls_block(f.server.cert_file, other.key_file));
        CHECK(r.status != 0);
        CHECK(r.output.find("does not match the certificate") != std::string::npos);
        // A start with the same file fails the same way.
        const auto start = run_command({ONCEPROXY_BIN, "--config", file});
        CHECK(start.status != 0);
        CHECK(start.output.find("does not match the certificate") != std::string::npos);
    }
    {
        const auto [r, file] = check(tls_block(f.server.cert_file, f.server.key_file));
        CHECK(r.status == 0);
    }
}
