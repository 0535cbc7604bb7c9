// Input an attacker or a broken peer sends, against the real onceproxy binary (memory store) and
// the real test upstream over loopback sockets. Every case checks what a user would see: the
// answer to the hostile request, that the process is still serving, and that a response recorded
// before the attack still replays (a crashed process would have forgotten it, and a retry of an
// already executed request would then execute a second time).

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

const char* const guarded_routes = R"(  - name: payments
    match: { prefix: /v1/payments }
    upstream: app
    idempotency: { mode: required, lease: 3s }
)";

/// A test upstream and a proxy with a guarded /v1/payments route and a plain catch-all.
struct proxied {
    upstream_process upstream;
    proxy_process proxy;
    explicit proxied(proxy_config c = {}) : upstream(), proxy(with_routes(c), upstream.port) {}

    static std::string with_routes(proxy_config& c) {
        c.routes = guarded_routes + c.routes;
        c.upstream_settings.push_back("timeout: 2s");
        return c.yaml();
    }

    /// POST /v1/payments with `key` on a fresh connection.
    http_response pay(const std::string& key, const header_list& extra = {}) const {
        header_list h{{"Idempotency-Key", key}, {"Content-Type", "application/json"}};
        h.insert(h.end(), extra.begin(), extra.end());
        return fetch(proxy.port, "POST", "/v1/payments", h, R"({"amount":1000})");
    }

    /// Records a payment under `key` and returns its execution id.
    std::string record(const std::string& key) const {
        const auto r = pay(key);
        REQUIRE(r.status == 200);
        REQUIRE(r.header("Idempotency-Status") == "stored");
        return json_member(r.body, "execution_id");
    }

    /// The process is alive, serves a plain request, and the payment recorded under `key`
    /// (execution `id`) replays without a second execution.
    void check_still_serving(const std::string& key, const std::string& id) {
        REQUIRE(proxy.proc.running());
        CHECK(fetch(proxy.port, "GET", "/alive").status == 200);
        const auto again = pay(key);
        CHECK(again.status == 200);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(json_member(again.body, "execution_id") == id);
        CHECK(upstream.count(key) == 1);
    }
};

/// Sends raw bytes on a fresh connection and reads one response (nullopt: closed, no answer).
std::optional<http_response> exchange_raw(unsigned short port, const std::string& bytes,
                                          bool* closed_after = nullptr) {
    http_client c(port);
    c.send_raw(bytes);
    auto r = c.read_response(10s);
    if (closed_after != nullptr) {
        *closed_after = c.wait_closed(5s);
    }
    return r;
}

/// Sends `bytes` on a fresh connection and returns every byte the proxy sends back until it
/// closes (bounded).
std::string raw_exchange(unsigned short port, const std::string& bytes) {
    const int fd = connect_loopback(port);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
    std::string out;
    char buf[4096];
    for (;;) {
        const auto n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            break;
        }
        out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return out;
}

/// A chunked request with body "hello" and `trailer` (CRLF-terminated field lines).
std::string chunked_with_trailer(const std::string& method, const std::string& target,
                                 const std::string& headers, const std::string& trailer) {
    return method + " " + target + " HTTP/1.1\r\nHost: x\r\n" + headers +
           "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n" + trailer + "\r\n";
}

/// An upstream that shows what reached "the app": it listens on 127.0.0.1, keeps the bytes of
/// every request it reads and answers each with the same `answer` bytes, then closes that
/// connection. Every wait is bounded (poll with a timeout); the destructor stops the thread.
class scripted_upstream {
public:
    explicit scripted_upstream(std::string answer) : answer_(std::move(answer)) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
            ::listen(fd_, 16) != 0 ||
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            throw std::runtime_error("scripted_upstream: cannot listen");
        }
        port = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    ~scripted_upstream() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    scripted_upstream(const scripted_upstream&) = delete;
    scripted_upstream& operator=(const scripted_upstream&) = delete;

    unsigned short port = 0;

    /// Every request read so far, one after the other.
    std::string received() const {
        std::lock_guard lock(mutex_);
        return received_;
    }

private:
    /// True once `in` holds one whole request: the head, then a Content-Length body or a
    /// chunked body up to the end of its trailer section.
    static bool whole(const std::string& in) {
        const auto head_end = in.find("\r\n\r\n");
        if (head_end == std::string::npos) {
            return false;
        }
        const auto head = in.substr(0, head_end);
        if (head.find("chunked") != std::string::npos) {
            const auto last = in.find("\n0\r\n", head_end + 2);
            return last != std::string::npos && in.find("\r\n\r\n", last + 1) != std::string::npos;
        }
        const auto cl = head.find("Content-Length: ");
        const auto size = cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 16));
        return in.size() >= head_end + 4 + size;
    }

    void serve() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) {
                continue;
            }
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) {
                continue;
            }
            std::string in;
            char buf[4096];
            const auto deadline = clock_type::now() + 10s;
            while (!whole(in) && clock_type::now() < deadline && !stop_) {
                pollfd q{c, POLLIN, 0};
                if (::poll(&q, 1, 50) <= 0) {
                    continue;
                }
                const auto n = ::recv(c, buf, sizeof buf, 0);
                if (n <= 0) {
                    break;
                }
                in.append(buf, static_cast<std::size_t>(n));
            }
            {
                std::lock_guard lock(mutex_);
                received_ += in;
            }
            (void)::send(c, answer_.data(), answer_.size(), MSG_NOSIGNAL);
            ::close(c);
        }
    }

    std::string answer_;
    int fd_ = -1;
    std::atomic<bool> stop_{false};
    mutable std::mutex mutex_;
    std::string received_;
    std::thread thread_;
};

/// A proxy (memory store) in front of `up` with a guarded /guarded route and a catch-all;
/// `top` is extra top-level YAML.
proxy_process proxy_before(const scripted_upstream& up, const std::string& top = "") {
    proxy_config c;
    c.upstream_port = up.port;
    c.routes = R"(  - name: guarded
    match: { prefix: /guarded }
    upstream: app
    idempotency: { mode: required, lease: 3s }
)";
    c.upstream_settings.push_back("timeout: 2s");
    c.top = top;
    return proxy_process(c.yaml());
}

const std::string ok_answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

} // namespace

TEST_SUITE("hostile input") {

    TEST_CASE("a 65,534-byte trailer field gets 431 and the process keeps its records") {
        proxied p;
        const auto id = p.record("trailer-crash-1");
        const std::string big(65'534, 'a');
        bool closed = false;
        // The exact request of the report, on the plain route...
        auto r = exchange_raw(p.proxy.port,
                              chunked_with_trailer("GET", "/", "", "X: " + big + "\r\n"), &closed);
        REQUIRE(r);
        check_problem(*r, 431, "request.header_too_large");
        CHECK(closed);
        // ... and on the guarded route.
        r = exchange_raw(p.proxy.port, chunked_with_trailer("POST", "/v1/payments",
                                                            "Idempotency-Key: trailer-crash-2\r\n",
                                                            "X: " + big + "\r\n"));
        REQUIRE(r);
        check_problem(*r, 431, "request.header_too_large");
        CHECK(p.upstream.count("trailer-crash-2") == 0);
        p.check_still_serving("trailer-crash-1", id);
    }

    TEST_CASE("the same request on the admin port is refused; probes keep answering") {
        proxied p;
        const auto id = p.record("trailer-admin-1");
        const std::string big(65'534, 'a');
        const auto r = exchange_raw(
            p.proxy.admin_port, chunked_with_trailer("GET", "/healthz", "", "X: " + big + "\r\n"));
        // No answer is owed on the admin port, but the process must survive it.
        (void)r;
        REQUIRE(p.proxy.proc.running());
        CHECK(p.proxy.admin("/healthz").status == 200);
        CHECK(p.proxy.admin("/readyz").status == 200);
        p.check_still_serving("trailer-admin-1", id);
    }

    TEST_CASE("an upstream response with a 70,000-byte trailer is cut or a 502, never a crash") {
        proxied p;
        const auto id = p.record("upstream-trailer-1");
        // Plain route: the answer streams, so its head is out before the trailer arrives; the
        // proxy cuts the connection instead of completing a message it cannot read.
        {
            http_client c(p.proxy.port);
            c.send_raw(make_request("GET", "/big-trailer", {{"X-Test-Trailer-Bytes", "70000"}}));
            CHECK_FALSE(c.read_response(10s));
            CHECK(c.wait_closed(5s));
        }
        auto r = fetch(p.proxy.port, "GET", "/after-big-trailer");
        CHECK(r.status == 200);
        // Guarded route: the request was sent, so the key is held, not released.
        r = p.pay("upstream-trailer-2", {{"X-Test-Trailer-Bytes", "70000"}});
        check_problem(r, 502, "upstream.bad_response");
        CHECK(json_member(r.body, "detail").find("was sent") != std::string::npos);
        CHECK(p.upstream.count("upstream-trailer-2") == 1);
        const auto retry = p.pay("upstream-trailer-2", {{"X-Test-Trailer-Bytes", "70000"}});
        check_problem(retry, 409, "idempotency.in_progress");
        CHECK(p.upstream.count("upstream-trailer-2") == 1);
        p.check_still_serving("upstream-trailer-1", id);
    }

    TEST_CASE("a small upstream trailer is passed on as a trailer, never as a header") {
        proxied p;
        const auto raw = raw_exchange(
            p.proxy.port, make_request("GET", "/small-trailer",
                                       {{"X-Test-Trailer-Bytes", "10"}, {"Connection", "close"}}));
        const auto end_of_head = raw.find("\r\n\r\n");
        REQUIRE(end_of_head != std::string::npos);
        const auto head = raw.substr(0, end_of_head);
        INFO(raw);
        CHECK(head.find("HTTP/1.1 200") == 0);
        CHECK(head.find("X-Test-Trailer") == std::string::npos);
        CHECK(raw.find("\r\n0\r\nX-Test-Trailer: tttttttttt\r\n\r\n") != std::string::npos);
    }

    TEST_CASE("max_header_bytes above 60KiB is a config error with its position") {
        temp_dir dir;
        proxy_config c;
        c.upstream_port = 9;
        c.limits.push_back("max_header_bytes: 64KiB");
        const auto file = dir.write("big-header.yaml", c.yaml());
        process check({ONCEPROXY_BIN, "--check-config", file}, dir.file("out.log"));
        const int status = check.wait(20s);
        CHECK(status != 0);
        const auto log = check.log();
        INFO(log);
        CHECK(log.find("big-header.yaml:") != std::string::npos);
        CHECK(log.find("max_header_bytes") != std::string::npos);
        CHECK(log.find("at most 60KiB") != std::string::npos);
    }

    TEST_CASE("at the 60KiB cap a 65,534-byte header is refused with 431") {
        proxy_config c;
        c.limits.push_back("max_header_bytes: 60KiB");
        proxied p(c);
        const auto id = p.record("header-cap-1");
        bool closed = false;
        const auto r = exchange_raw(
            p.proxy.port,
            "GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(65'534, 'a') + "\r\n\r\n", &closed);
        REQUIRE(r);
        check_problem(*r, 431, "request.header_too_large");
        CHECK(closed);
        // A header just under the cap still passes.
        const auto ok = fetch(p.proxy.port, "GET", "/ok", {{"X-Big", std::string(50'000, 'b')}});
        CHECK(ok.status == 200);
        p.check_still_serving("header-cap-1", id);
    }

    TEST_CASE("megabytes of small trailer fields are refused, not buffered") {
        proxied p;
        std::string trailer;
        for (int i = 0; i < 2000; ++i) {
            trailer += "X-T" + std::to_string(i) + ": " + std::string(1000, 'v') + "\r\n";
        }
        bool closed = false;
        const auto r =
            exchange_raw(p.proxy.port, chunked_with_trailer("POST", "/", "", trailer), &closed);
        REQUIRE(r);
        check_problem(*r, 431, "request.header_too_large");
        CHECK(closed);
        CHECK(p.upstream.total() == 0);
    }

    TEST_CASE("an over-long chunk extension is refused") {
        proxied p;
        const std::string req = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "5;ext=" +
                                std::string(8000, 'e') + "\r\nhello\r\n0\r\n\r\n";
        const auto r = exchange_raw(p.proxy.port, req);
        REQUIRE(r);
        check_problem(*r, 400, "request.malformed");
        CHECK(p.upstream.total() == 0);
    }

    TEST_CASE("trailer fields never act as headers") {
        proxied p;
        SUBCASE("an Idempotency-Key sent as a trailer is no key") {
            const auto r = exchange_raw(p.proxy.port,
                                        chunked_with_trailer("POST", "/v1/payments",
                                                             "Content-Type: application/json\r\n",
                                                             "Idempotency-Key: late-key\r\n"));
            REQUIRE(r);
            check_problem(*r, 400, "idempotency.missing_key");
            CHECK(p.upstream.total() == 0);
        }
        SUBCASE("trailers are not forwarded as headers on a plain route") {
            const auto r = exchange_raw(
                p.proxy.port, chunked_with_trailer("POST", "/plain", "",
                                                   "Idempotency-Key: smuggled\r\n"
                                                   "X-Forwarded-For: 6.6.6.6\r\nHost: evil\r\n"));
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(json_member(r->body, "key") == "null");
            CHECK(json_member(r->body, "body_bytes") == "5");
            CHECK(r->header("X-Echo-Forwarded-For") == "127.0.0.1");
        }
    }

    TEST_CASE("Host: missing on HTTP/1.1 or repeated gets 400; HTTP/1.0 may omit it") {
        proxied p;
        bool closed = false;
        auto r = exchange_raw(p.proxy.port, "GET /no-host HTTP/1.1\r\n\r\n", &closed);
        REQUIRE(r);
        check_problem(*r, 400, "request.malformed");
        CHECK(closed);
        r = exchange_raw(p.proxy.port, "GET /two-hosts HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
        REQUIRE(r);
        check_problem(*r, 400, "request.malformed");
        r = exchange_raw(p.proxy.port, "GET /bad-host HTTP/1.1\r\nHost: a b/c\r\n\r\n");
        REQUIRE(r);
        check_problem(*r, 400, "request.malformed");
        CHECK(p.upstream.total() == 0);
        r = exchange_raw(p.proxy.port, "GET /http10 HTTP/1.0\r\n\r\n");
        REQUIRE(r);
        CHECK(r->status == 200);
        CHECK(json_member(r->body, "path") == "/http10");
    }

    TEST_CASE("Transfer-Encoding on an HTTP/1.0 request is refused before anything is sent") {
        proxied p;
        bool closed = false;
        const auto r =
            exchange_raw(p.proxy.port,
                         "POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "5\r\nhello\r\n0\r\n\r\n",
                         &closed);
        REQUIRE(r);
        check_problem(*r, 400, "request.malformed");
        CHECK(closed);
        CHECK(p.upstream.total() == 0);
    }

    TEST_CASE("a malformed upstream answer says the request was sent") {
        proxied p;
        auto r = p.pay("malformed-1", {{"X-Test-Malformed", "1"}});
        check_problem(r, 502, "upstream.bad_response");
        CHECK(json_member(r.body, "detail").find("was sent") != std::string::npos);
        CHECK(p.upstream.count("malformed-1") == 1);
        // Outcome unknown under the default `hold`: no second execution while the lease runs.
        r = p.pay("malformed-1", {{"X-Test-Malformed", "1"}});
        check_problem(r, 409, "idempotency.in_progress");
        CHECK(p.upstream.count("malformed-1") == 1);
        r = fetch(p.proxy.port, "GET", "/plain-malformed", {{"X-Test-Malformed", "1"}});
        check_problem(r, 502, "upstream.bad_response");
    }

    TEST_CASE("above limits.max_connections a new connection gets 503 and is closed") {
        proxy_config c;
        c.limits.push_back("max_connections: 4");
        proxied p(c);
        std::vector<std::unique_ptr<http_client>> held;
        for (int i = 0; i < 4; ++i) {
            held.push_back(std::make_unique<http_client>(p.proxy.port));
            CHECK(held.back()->request("GET", "/held").status == 200);
        }
        {
            http_client extra(p.proxy.port);
            extra.send_raw(make_request("GET", "/one-too-many"));
            const auto r = extra.read_response(5s);
            REQUIRE(r);
            check_problem(*r, 503, "proxy.connection_limit");
            CHECK(r->header("Retry-After") == "1");
            CHECK(extra.wait_closed(5s));
        }
        // The held connections keep working; once one closes there is room again.
        CHECK(held.front()->request("GET", "/still-held").status == 200);
        held.pop_back();
        CHECK(eventually([&] {
            http_client again(p.proxy.port);
            again.send_raw(make_request("GET", "/room-again"));
            const auto r = again.read_response(5s);
            return r && r->status == 200;
        }));
        const auto text = p.proxy.admin("/metrics").body;
        CHECK(metric_value(text, "onceproxy_connection_limit") == 4);
        CHECK(metric_value(text, "onceproxy_connections_refused_total") >= 1);
    }

    TEST_CASE("out of descriptors: the admin listener recovers and the client cap protects it") {
        upstream_process upstream;
        proxy_config c;
        proxy_process proxy(proxied::with_routes(c), upstream.port, {},
                            {"/usr/bin/prlimit", "--nofile=128:128", "--"});
        auto text = proxy.admin("/metrics").body;
        const auto limit = metric_value(text, "onceproxy_connection_limit");
        INFO("connection limit " << limit);
        CHECK(limit > 0);
        CHECK(limit < 64); // lowered from 10000 to fit 128 descriptors

        // A flood on the proxy port: connections above the cap are refused, never accepted
        // into descriptor exhaustion; the probes keep answering meanwhile.
        {
            std::vector<std::unique_ptr<http_client>> flood;
            for (int i = 0; i < 150; ++i) {
                flood.push_back(std::make_unique<http_client>(proxy.port));
            }
            CHECK(eventually([&] {
                text = proxy.admin("/metrics").body;
                return metric_value(text, "onceproxy_connections_refused_total") > 0;
            }));
            CHECK(proxy.admin("/healthz").status == 200);
        }

        // A flood on the admin port itself: connections above admin.max_connections are
        // closed at once. Once the flood goes away, the admin listener must answer again.
        {
            std::vector<std::unique_ptr<http_client>> flood;
            for (int i = 0; i < 200; ++i) {
                flood.push_back(std::make_unique<http_client>(proxy.admin_port));
            }
            // The last of them is over the cap.
            wait_until([&] { return flood.back()->wait_closed(10ms); }, 5s,
                       "the admin listener closes a connection over its cap");
        }
        CHECK(eventually(
            [&] {
                try {
                    http_client probe(proxy.admin_port);
                    probe.send_raw(make_request("GET", "/healthz"));
                    const auto r = probe.read_response(2s);
                    return r && r->status == 200;
                } catch (const std::exception&) {
                    return false;
                }
            },
            30s, 50ms)); // as long as before: 200 closes under load can take a while
        text = proxy.admin("/metrics").body;
        CHECK(metric_value(text, "onceproxy_admin_connections_refused_total") > 0);
        CHECK(proxy.proc.running());
        // And the proxy port serves again.
        CHECK(fetch(proxy.port, "GET", "/after-flood").status == 200);
    }

    TEST_CASE("admin flood under 256 descriptors: admin.max_connections holds, the proxy "
              "listener answers") {
        upstream_process upstream;
        proxy_config c;
        proxy_process proxy(proxied::with_routes(c), upstream.port, {},
                            {"/usr/bin/prlimit", "--nofile=256:256", "--"});
        // 300 idle admin connections: more than the descriptors the process has.
        std::vector<std::unique_ptr<http_client>> flood;
        for (int i = 0; i < 300; ++i) {
            flood.push_back(std::make_unique<http_client>(proxy.admin_port));
        }
        // All but the 16 admitted (admin.max_connections) are closed at once.
        std::size_t closed = 0;
        eventually([&] {
            closed = 0;
            for (auto& f : flood) {
                closed += f->wait_closed(5ms) ? 1 : 0;
            }
            return closed >= 300 - 16;
        });
        CHECK(closed >= 300 - 16);
        // While the flood holds its connections, the proxy listener still serves a proxied
        // request (the upstream connection needs a descriptor too).
        {
            http_client client(proxy.port);
            client.send_raw(make_request("GET", "/during-admin-flood"));
            const auto r = client.read_response(5s);
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(r->body.find("/during-admin-flood") != std::string::npos);
        }
        CHECK(upstream.total() >= 1);
        // The flood leaves: the admin listener answers again and counted what it refused.
        flood.clear();
        long long refused = -1;
        CHECK(eventually([&] {
            try {
                refused = proxy.metric("onceproxy_admin_connections_refused_total");
            } catch (const std::exception&) {
                refused = -1; // not yet room on the admin listener
            }
            return refused >= 0;
        }));
        CHECK(refused >= 300 - 16);
        CHECK(proxy.metric("onceproxy_accept_errors_total{listener=\"proxy\"}") == 0);
        CHECK(proxy.proc.running());
    }

    TEST_CASE("admin connections: an idle one is closed after admin.header_timeout, and a "
              "keep-alive one after admin.idle_timeout") {
        upstream_process upstream;
        proxy_config c;
        c.admin_settings = {"max_connections: 2", "header_timeout: 1s", "idle_timeout: 2500ms"};
        proxy_process proxy(proxied::with_routes(c), upstream.port);
        http_client idle(proxy.admin_port);
        http_client kept(proxy.admin_port);
        CHECK(kept.request("GET", "/healthz").status == 200);
        // Two held: a third connection is closed at once, unanswered.
        {
            http_client third(proxy.admin_port);
            third.send_raw(make_request("GET", "/healthz"));
            CHECK_FALSE(third.read_response(5s));
        }
        // Real time is the subject here: the idle connection is cut at its header timeout,
        // well before the keep-alive one at its idle timeout.
        const auto t0 = clock_type::now();
        CHECK(idle.wait_closed(10s));
        const auto idle_cut = clock_type::now() - t0;
        CHECK(kept.wait_closed(10s));
        const auto kept_cut = clock_type::now() - t0;
        CHECK(idle_cut < kept_cut);
        CHECK(kept_cut < 10s);
        CHECK(proxy.admin("/healthz").status == 200);
        CHECK(proxy.metric("onceproxy_admin_connections_refused_total") == 1);
    }

    TEST_CASE("an unsupported Expect on a guarded route gets 417 and counts as rejected") {
        proxied p;
        const std::string series =
            "onceproxy_requests_total{route=\"(none)\",outcome=\"rejected\"}";
        const auto before = metric_value(p.proxy.admin("/metrics").body, series);
        REQUIRE(before >= 0);
        bool closed = false;
        // The body is not sent: the proxy must refuse before reading it.
        const auto r =
            exchange_raw(p.proxy.port,
                         "POST /v1/payments HTTP/1.1\r\nHost: x\r\n"
                         "Idempotency-Key: expect-417\r\nContent-Type: application/json\r\n"
                         "Content-Length: 5\r\nExpect: fancy\r\n\r\n",
                         &closed);
        REQUIRE(r);
        check_problem(*r, 417, "request.malformed");
        CHECK(closed);
        CHECK(p.upstream.count("expect-417") == 0);
        // Counted right after the answer is written: poll (bounded) for it.
        auto now = before;
        eventually([&] {
            now = metric_value(p.proxy.admin("/metrics").body, series);
            return now == before + 1;
        });
        CHECK(now == before + 1);
    }

    TEST_CASE("obs-fold, bare LF, over-long chunk sizes and non-origin targets get 400") {
        proxied p;
        const std::vector<std::string> requests{
            "GET /a HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n",
            "GET /a HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\tc\r\n\r\n",
            "GET /a HTTP/1.1\nHost: x\n\n",
            "GET /a HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n",
            "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            "fffffffffffffffff\r\nx\r\n0\r\n\r\n",
            "GET http://evil.example/a HTTP/1.1\r\nHost: x\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
            "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
            "GET /v1%2Fpayments HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n"};
        for (const auto& raw : requests) {
            CAPTURE(raw);
            bool closed = false;
            const auto r = exchange_raw(p.proxy.port, raw, &closed);
            REQUIRE(r);
            check_problem(*r, 400, "request.malformed");
            CHECK(closed);
        }
        CHECK(p.upstream.total() == 0);
    }

    TEST_CASE("a guarded path cannot be bypassed by spelling it differently") {
        proxied p;
        const auto id = p.record("spelling-1");
        header_list h{{"Idempotency-Key", "spelling-1"}, {"Content-Type", "application/json"}};
        for (const char* target : {"/v1//payments", "/v1/./payments", "/v1/x/../payments",
                                   "/v1/%70ayments", "//v1/payments"}) {
            CAPTURE(target);
            const auto r = fetch(p.proxy.port, "POST", target, h, R"({"amount":1000})");
            CHECK(r.status == 200);
            CHECK(r.header("Idempotency-Status") == "replayed");
            CHECK(json_member(r.body, "execution_id") == id);
        }
        CHECK(p.upstream.count("spelling-1") == 1);
        // The app receives the normalised path too.
        const auto plain = fetch(p.proxy.port, "GET", "/a//b/./c/../d%7e");
        CHECK(json_member(plain.body, "path") == "/a/b/d~");
    }

    TEST_CASE("a request body that stalls or trickles is cut with 408") {
        proxy_config cfg;
        cfg.limits = {"body_timeout: 1s", "min_body_rate: 1KiB"};
        proxied p(cfg);
        for (const char* target : {"/plain", "/v1/payments"}) {
            CAPTURE(target);
            {
                INFO("stalled");
                http_client c(p.proxy.port);
                const auto start = clock_type::now();
                c.send_raw(std::string("POST ") + target +
                           " HTTP/1.1\r\nHost: x\r\nIdempotency-Key: stall\r\n"
                           "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":");
                const auto r = c.read_response(5s);
                REQUIRE(r);
                check_problem(*r, 408, "request.timeout");
                CHECK(clock_type::now() - start < 4s);
                CHECK(c.wait_closed(3s));
            }
            {
                INFO("trickled, each byte inside body_timeout");
                http_client c(p.proxy.port);
                const auto start = clock_type::now();
                c.send_raw(std::string("POST ") + target +
                           " HTTP/1.1\r\nHost: x\r\nIdempotency-Key: trickle\r\n"
                           "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n");
                std::optional<http_response> r;
                for (int i = 0; i < 40 && clock_type::now() - start < 8s; ++i) {
                    try {
                        c.send_raw("a");
                    } catch (const std::exception&) {
                        break; // cut: the answer is already waiting
                    }
                    // Real time is the subject: a client that trickles, one byte every 300 ms.
                    std::this_thread::sleep_for(300ms);
                    if (i >= 3 && (r = c.read_response(10ms))) {
                        break;
                    }
                }
                if (!r) {
                    r = c.read_response(3s);
                }
                REQUIRE(r);
                check_problem(*r, 408, "request.timeout");
                CHECK(clock_type::now() - start < 6s);
            }
        }
        CHECK(p.upstream.count("stall") == 0);
        CHECK(p.upstream.count("trickle") == 0);
        CHECK(metric_value(p.proxy.admin("/metrics").body,
                           "onceproxy_client_timeouts_total{phase=\"body\"}") == 4);
    }

    TEST_CASE("max_requests_per_connection: the last answer says Connection: close") {
        proxy_config cfg;
        cfg.limits = {"max_requests_per_connection: 3"};
        proxied p(cfg);
        http_client c(p.proxy.port);
        for (int i = 1; i <= 3; ++i) {
            const auto r = c.request("GET", "/n" + std::to_string(i));
            CHECK(r.status == 200);
            CHECK((r.header("Connection") == "close") == (i == 3));
        }
        CHECK(c.wait_closed(3s));
    }

    TEST_CASE("a guarded route is not reached around by ;params, a slash, case, %00 or ..;") {
        proxy_config cfg;
        cfg.routes = R"(  - name: pay
    match: { path: /pay }
    upstream: app
    idempotency: { mode: required, lease: 3s }
  - name: refund
    match: { template: "/orders/{id}/refund" }
    upstream: app
    idempotency: { mode: required, lease: 3s }
)";
        proxied p(cfg);
        const header_list json{{"Content-Type", "application/json"}};
        // Each of these is /pay or /orders/1/refund to some framework (README "Route
        // matching"): the route guards it, so a request without a key is refused.
        for (const char* target :
             {"/pay;x=1", "/pay%3B", "/pay%3bx", "/orders/1/refund;jsessionid=1", "/pay/", "/PAY",
              "/Orders/1/Refund/", "/pay;a=1/"}) {
            CAPTURE(target);
            const auto r = fetch(p.proxy.port, "POST", target, json, R"({"amount":1})");
            check_problem(r, 400, "idempotency.missing_key");
        }
        // Never routable: an encoded NUL, a dot segment with parameters, a standard method in
        // another case.
        for (const char* raw : {"POST /pay%00 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                                "GET /public/..;/admin HTTP/1.1\r\nHost: x\r\n\r\n",
                                "GET /public/.;/admin HTTP/1.1\r\nHost: x\r\n\r\n",
                                "post /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                                "Post /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"}) {
            CAPTURE(raw);
            const auto r = exchange_raw(p.proxy.port, raw);
            REQUIRE(r);
            check_problem(*r, 400, "request.malformed");
        }
        CHECK(p.upstream.total() == 0);
        // A keyed request on a spelling of /pay is recorded and replayed like /pay itself.
        const auto first = fetch(p.proxy.port, "POST", "/pay;x=1",
                                 {{"Idempotency-Key", "params-1"}, json[0]}, R"({"amount":1})");
        CHECK(first.header("Idempotency-Status") == "stored");
        const auto again = fetch(p.proxy.port, "POST", "/pay;x=1",
                                 {{"Idempotency-Key", "params-1"}, json[0]}, R"({"amount":1})");
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(p.upstream.count("params-1") == 1);
        // A non-standard method token still passes, in any case.
        const auto custom = exchange_raw(p.proxy.port, "mymethod /x HTTP/1.1\r\nHost: x\r\n\r\n");
        REQUIRE(custom);
        CHECK(custom->status != 400);
    }

    TEST_CASE("match.path_params, trailing_slash and case switch each reading per route") {
        proxy_config cfg;
        cfg.routes = R"(  - name: literal
    match: { path: /lit, path_params: literal, trailing_slash: exact, case: exact }
    upstream: app
    idempotency: { mode: required, lease: 3s }
  - name: strict
    match: { prefix: /strict, path_params: refuse }
    upstream: app
    idempotency: { mode: required, lease: 3s }
)";
        proxied p(cfg);
        const header_list json{{"Content-Type", "application/json"}};
        // The literal route reads them as other paths: the catch-all serves them.
        for (const char* target : {"/lit;x=1", "/lit/", "/LIT"}) {
            CAPTURE(target);
            CHECK(fetch(p.proxy.port, "POST", target, json, "{}").status == 200);
        }
        check_problem(fetch(p.proxy.port, "POST", "/lit", json, "{}"), 400,
                      "idempotency.missing_key");
        // The refusing route: parameters get 400 even with a key; without them it guards.
        check_problem(fetch(p.proxy.port, "POST", "/strict;x=1",
                            {{"Idempotency-Key", "strict-1"}, json[0]}, "{}"),
                      400, "request.malformed");
        check_problem(fetch(p.proxy.port, "POST", "/strict%3B", json, "{}"), 400,
                      "request.malformed");
        check_problem(fetch(p.proxy.port, "POST", "/STRICT/a", json, "{}"), 400,
                      "idempotency.missing_key");
        CHECK(p.upstream.count("strict-1") == 0);
    }

    TEST_CASE("a chunk extension with a bare LF and a folded request trailer get 400") {
        proxied p;
        const std::string head =
            "POST /plain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        for (const std::string& body : {std::string("5;a=\"x\ny\"\r\nhello\r\n0\r\n\r\n"),
                                        std::string("5\r\nhello\r\n0\r\nX-A: b\r\n c\r\n\r\n"),
                                        std::string("5\r\nhello\r\n0\r\nX-A: b\r\n\tc\r\n\r\n")}) {
            CAPTURE(body);
            bool closed = false;
            const auto r = exchange_raw(p.proxy.port, head + body, &closed);
            REQUIRE(r);
            check_problem(*r, 400, "request.malformed");
            CHECK(closed);
        }
        CHECK(p.upstream.total() == 0);
    }

    TEST_CASE("request trailers pass an allowlist; response trailers keep proxy fields out") {
        SUBCASE("request") {
            scripted_upstream up(ok_answer);
            auto proxy = proxy_before(up);
            const auto r = exchange_raw(proxy.port,
                                        chunked_with_trailer("POST", "/plain", "",
                                                             "Expect: 100-continue\r\n"
                                                             "Proxy-Authorization: Basic eDp5\r\n"
                                                             "Content-Encoding: gzip\r\n"
                                                             "X-Custom: 1\r\n"
                                                             "Content-Digest: sha-256=:abc=:\r\n"));
            REQUIRE(r);
            CHECK(r->status == 200);
            const auto got = up.received();
            INFO(got);
            const auto trailers = got.substr(got.find("\r\n0\r\n"));
            CHECK(trailers == "\r\n0\r\nContent-Digest: sha-256=:abc=:\r\n\r\n");
        }
        SUBCASE("response") {
            scripted_upstream up("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                                 "Connection: close\r\n\r\n2\r\nok\r\n0\r\n"
                                 "Proxy-Authenticate: Basic\r\nIdempotency-Status: stored\r\n"
                                 "X-Fine: 1\r\n\r\n");
            auto proxy = proxy_before(up);
            const auto raw =
                raw_exchange(proxy.port, make_request("GET", "/t", {{"Connection", "close"}}));
            INFO(raw);
            CHECK(raw.find("HTTP/1.1 200") == 0);
            CHECK(raw.ends_with("\r\n0\r\nX-Fine: 1\r\n\r\n"));
        }
    }

    TEST_CASE("Host must be uri-host [:port]: a list, two colons or an open bracket get 400") {
        proxied p;
        for (const char* host : {"a,b", "a:1:2", "[::1", "a;b", "[::1]x"}) {
            CAPTURE(host);
            const auto r = exchange_raw(p.proxy.port, std::string("GET /h HTTP/1.1\r\nHost: ") +
                                                          host + "\r\n\r\n");
            REQUIRE(r);
            check_problem(*r, 400, "request.malformed");
        }
        CHECK(p.upstream.total() == 0);
        for (const char* host : {"[::1]:8080", "shop.example:80", "127.0.0.1"}) {
            CAPTURE(host);
            const auto r = exchange_raw(p.proxy.port, std::string("GET /h HTTP/1.1\r\nHost: ") +
                                                          host + "\r\n\r\n");
            REQUIRE(r);
            CHECK(r->status == 200);
            CHECK(r->header("X-Echo-Forwarded-Host") == host);
        }
    }

    TEST_CASE("forwarding fields the proxy does not set never come from an untrusted client") {
        SUBCASE("untrusted") {
            scripted_upstream up(ok_answer);
            auto proxy = proxy_before(up);
            const auto r = fetch(proxy.port, "GET", "/f",
                                 {{"X-Real-IP", "6.6.6.6"},
                                  {"X-Forwarded-Port", "443"},
                                  {"X-Forwarded-Prefix", "/admin"},
                                  {"X_Forwarded_For", "6.6.6.6"},
                                  {"X_Real_IP", "6.6.6.6"}});
            CHECK(r.status == 200);
            const auto got = up.received();
            INFO(got);
            CHECK(got.find("6.6.6.6") == std::string::npos);
            CHECK(got.find("X-Forwarded-Port") == std::string::npos);
            CHECK(got.find("/admin") == std::string::npos);
            CHECK(got.find("X-Forwarded-For: 127.0.0.1\r\n") != std::string::npos);
        }
        SUBCASE("a trusted proxy's Forwarded with an unclosed quote does not swallow ours") {
            scripted_upstream up(ok_answer);
            auto proxy = proxy_before(up, "trusted_proxies: [127.0.0.1]\n");
            const auto r = exchange_raw(proxy.port, "GET /f HTTP/1.1\r\nHost: shop.example\r\n"
                                                    "Forwarded: for=\"1.2.3.4\r\n\r\n");
            REQUIRE(r);
            CHECK(r->status == 200);
            const auto got = up.received();
            INFO(got);
            CHECK(got.find("\r\nForwarded: for=127.0.0.1;host=shop.example;proto=http\r\n") !=
                  std::string::npos);
        }
    }

    TEST_CASE("a guarded request gets this hop's forwarding fields, before its facts read them") {
        // The forwarding fields of a guarded request are added when it is forwarded, unless
        // its route's key, scope or fingerprint reads one: then before the facts are derived.
        scripted_upstream up(ok_answer);
        proxy_config c;
        c.upstream_port = up.port;
        c.routes = R"(  - name: guarded
    match: { prefix: /guarded }
    upstream: app
    idempotency: { mode: required }
  - name: by_forwarder
    match: { prefix: /fp }
    upstream: app
    idempotency: { mode: required, fingerprint: { headers: [X-Forwarded-For] } }
)";
        proxy_process proxy(c.yaml());
        const header_list forged{
            {"X-Forwarded-For", "6.6.6.6"}, {"Forwarded", "for=6.6.6.6"}, {"X-Real-IP", "6.6.6.6"}};
        const auto with_key = [&](const char* key) {
            auto h = forged;
            h.emplace_back("Idempotency-Key", key);
            return h;
        };
        auto r = fetch(proxy.port, "POST", "/guarded/1", with_key("fw-1"), "{}");
        CHECK(r.status == 200);
        auto got = up.received();
        INFO(got);
        CHECK(got.find("6.6.6.6") == std::string::npos);
        CHECK(got.find("\r\nX-Forwarded-For: 127.0.0.1\r\n") != std::string::npos);
        CHECK(got.find("\r\nX-Forwarded-Proto: http\r\n") != std::string::npos);
        CHECK(got.find("\r\nX-Forwarded-Host: 127.0.0.1\r\n") != std::string::npos);
        CHECK(got.find("\r\nForwarded: for=127.0.0.1;host=127.0.0.1;proto=http\r\n") !=
              std::string::npos);
        // Once each, however the request was routed.
        CHECK(got.find("X-Forwarded-For:") == got.rfind("X-Forwarded-For:"));
        // The replay forwards nothing.
        r = fetch(proxy.port, "POST", "/guarded/1", with_key("fw-1"), "{}");
        CHECK(r.header("Idempotency-Status") == "replayed");
        CHECK(up.received() == got);

        // The fingerprint reads X-Forwarded-For as this hop sets it: a retry that forges another
        // one is the same request, not a 422.
        r = fetch(proxy.port, "POST", "/fp/1", with_key("fw-2"), "{}");
        CHECK(r.status == 200);
        auto retry = with_key("fw-2");
        retry[0].second = "7.7.7.7";
        r = fetch(proxy.port, "POST", "/fp/1", retry, "{}");
        CHECK(r.status == 200);
        CHECK(r.header("Idempotency-Status") == "replayed");
    }

    TEST_CASE("an upstream Content-Length list is passed on as one value; gzip stays coded") {
        SUBCASE("Content-Length: 2, 2") {
            scripted_upstream up(
                "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nConnection: close\r\n\r\nok");
            auto proxy = proxy_before(up);
            const auto raw =
                raw_exchange(proxy.port, make_request("GET", "/cl", {{"Connection", "close"}}));
            INFO(raw);
            CHECK(raw.find("HTTP/1.1 200") == 0);
            CHECK(raw.find("\r\nContent-Length: 2\r\n") != std::string::npos);
            CHECK(raw.find("2, 2") == std::string::npos);
        }
        SUBCASE("Transfer-Encoding: gzip, chunked") {
            scripted_upstream up("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n"
                                 "Connection: close\r\n\r\n2\r\nzz\r\n0\r\n\r\n");
            auto proxy = proxy_before(up);
            const auto raw =
                raw_exchange(proxy.port, make_request("GET", "/te", {{"Connection", "close"}}));
            INFO(raw);
            CHECK(raw.find("HTTP/1.1 200") == 0);
            CHECK(raw.find("\r\nTransfer-Encoding: gzip, chunked\r\n") != std::string::npos);
            // An HTTP/1.0 client knows no transfer coding; a guarded route records no coding.
            const auto old = exchange_raw(proxy.port, "GET /te HTTP/1.0\r\n\r\n");
            REQUIRE(old);
            check_problem(*old, 502, "upstream.bad_response");
            const auto guarded = exchange_raw(
                proxy.port, make_request("POST", "/guarded", {{"Idempotency-Key", "te-1"}}, "{}"));
            REQUIRE(guarded);
            CHECK(guarded->status == 502);
        }
    }
}
