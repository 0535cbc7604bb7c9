// A thousand slow clients (slowloris: a header trickled a byte at a time) against the real
// onceproxy binary: normal requests keep being served while they hang on, the proxy's memory
// stays bounded, and every slow connection is cut at the header deadline.

#include "support/http_client.hpp"
#include "support/proxy_fixture.hpp"
#include "support/stream_connection.hpp"

#include <doctest/doctest.h>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::size_t slow_clients = 1000;

/// True when the peer closed `fd` (EOF or reset), after reading whatever it sent.
bool peer_closed(int fd) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) {
        return false;
    }
    char buf[512];
    const auto n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    return n <= 0 ? true : peer_closed(fd);
}

/// Raises the soft descriptor limit of this test process so it can hold the slow clients.
void allow_descriptors(std::size_t n) {
    rlimit lim{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
    if (lim.rlim_cur < n) {
        REQUIRE_MESSAGE(lim.rlim_max >= n, "the hard RLIMIT_NOFILE is below " << n);
        lim.rlim_cur = n;
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &lim) == 0);
    }
}

} // namespace

TEST_CASE("1,000 slowloris connections: others are served, memory is bounded, all are cut") {
    allow_descriptors(slow_clients + 256);
    upstream_process upstream;
    proxy_config cfg;
    cfg.upstream_port = upstream.port;
    cfg.limits = {"header_timeout: 6s"};
    proxy_process proxy(cfg.yaml(), upstream.port);
    REQUIRE(fetch(proxy.port, "GET", "/warm").status == 200);
    const auto rss_before = static_cast<long>(rss_kib(proxy.proc.pid()));

    const std::string head = "GET /slow HTTP/1.1\r\nHost: x\r\nX-Drip: ";
    std::vector<int> fds;
    fds.reserve(slow_clients);
    const auto opened = clock_type::now();
    for (std::size_t i = 0; i < slow_clients; ++i) {
        const int fd = connect_loopback(proxy.port);
        REQUIRE(::send(fd, head.data(), head.size(), MSG_NOSIGNAL) ==
                static_cast<ssize_t>(head.size()));
        fds.push_back(fd);
    }

    // While they trickle a byte each per second, normal requests are answered, and quickly.
    long rss_peak = rss_before;
    std::size_t served = 0;
    std::size_t slow_ok = 0;
    while (clock_type::now() - opened < 4s) {
        for (const int fd : fds) {
            (void)::send(fd, "a", 1, MSG_NOSIGNAL);
        }
        for (int i = 0; i < 20; ++i) {
            const auto start = clock_type::now();
            const auto r = fetch(proxy.port, "GET", "/normal");
            CHECK(r.status == 200);
            served += r.status == 200 ? 1 : 0;
            slow_ok += clock_type::now() - start < 1s ? 1 : 0;
        }
        rss_peak = std::max(rss_peak, static_cast<long>(rss_kib(proxy.proc.pid())));
        std::this_thread::sleep_for(500ms); // real time is the subject: slow clients trickle
    }
    std::size_t still_open = 0;
    for (const int fd : fds) {
        still_open += peer_closed(fd) ? 0 : 1;
    }
    CHECK(still_open == slow_clients); // held open until the header deadline, not dropped early
    CHECK(served >= 100);
    CHECK(slow_ok == served); // each normal request answered within a second

    // Bounded memory: a session waiting for its header holds its coroutine frame and a read
    // buffer (tens of KiB under ASan), nothing that grows with the trickle.
    const long growth_kib = rss_peak - rss_before;
    MESSAGE("proxy RSS before " << rss_before / 1024 << " MiB, peak with " << slow_clients
                                << " slow clients " << rss_peak / 1024 << " MiB");
    CHECK(growth_kib < 64 * 1024); // 64 KiB per slow connection at most

    // At the header deadline (6 s after each connection opened) every one of them is cut.
    std::size_t closed = 0;
    eventually(
        [&] {
            closed = 0;
            for (const int fd : fds) {
                closed += peer_closed(fd) ? 1 : 0;
            }
            return closed == slow_clients;
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(opened + 12s - clock_type::now()),
        200ms);
    CHECK(closed == slow_clients);
    const auto metrics = proxy.admin("/metrics").body;
    const std::string series = "onceproxy_client_timeouts_total{phase=\"header\"} ";
    const auto pos = metrics.find(series);
    REQUIRE(pos != std::string::npos);
    CHECK(std::stoul(metrics.substr(pos + series.size())) >= slow_clients);
    for (const int fd : fds) {
        ::close(fd);
    }
    CHECK(fetch(proxy.port, "GET", "/after").status == 200);
    CHECK(upstream.total() == served + 2);
}

// The wait for a client's next request skips the read that would find nothing when the last one
// drained the connection (wire::stream::async_read_next). A client that shuts down its sending
// side right after its request still gets its whole answer, and its connection still ends: at
// once when the close came after the request was read, at idle_timeout when it came with it.
TEST_CASE("a client that half-closes after its request gets its answer, then the connection ends") {
    upstream_process upstream;
    proxy_config cfg;
    cfg.upstream_port = upstream.port;
    cfg.limits = {"idle_timeout: 1s"};
    proxy_process proxy(cfg.yaml(), upstream.port);
    for (int i = 0; i < 5; ++i) {
        stream_connection c(proxy.port);
        REQUIRE(c.send("GET /half-close HTTP/1.1\r\nHost: x\r\n\r\n"));
        c.shutdown_send();
        const auto head = c.read_head(5s);
        REQUIRE(head);
        CHECK(head->status == 200);
        c.begin_body(*head);
        CHECK(c.read_body([](std::string_view) {}).complete);
        CHECK(c.wait_closed(10s));
    }
    CHECK(upstream.total() == 5);
}
