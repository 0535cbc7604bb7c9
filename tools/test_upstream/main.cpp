// onceproxy_test_upstream: the HTTP/1.1 service behind onceproxy in the integration tests, the
// benchmark and the demo. It counts executions (globally and per Idempotency-Key), echoes what
// the proxy forwarded, and misbehaves on demand through X-Test-* request headers.
//
//   onceproxy_test_upstream --listen 127.0.0.1:PORT [--threads N] [--port-file PATH]
//       [--tls-cert CHAIN.pem --tls-key KEY.pem [--tls-client-ca CA.pem]
//        [--tls-listen HOST:PORT] [--tls-port-file PATH]]
//
// Port 0 binds an ephemeral port. Once listening it prints `listening on HOST:PORT` (flushed)
// and, with --port-file, writes the port to PATH atomically (PATH.tmp, then rename).
// SIGINT/SIGTERM exit 0.
//
// TLS (tls_front.hpp): with --tls-cert and --tls-key, a second listener (--tls-listen, default
// 127.0.0.1:0; its port in --tls-port-file) speaks TLS and relays to the plain one;
// --tls-client-ca requires a client certificate signed by that CA. GET /__tls answers
// {"handshakes":N,"resumed":N,"failed":N}.
//
// Streaming (request_facts.cpp lists every X-Test-* header):
//   X-Test-Body-Bytes: N   body of N bytes ('a' + i % 26), up to 4 GiB; above 1 MiB it is
//                          generated and written in 64 KiB pieces (chunks, with X-Test-Chunked)
//   X-Test-Events: N       chunked text/event-stream, one chunk `data: event-<i>\n\n` per event;
//   X-Test-Stream-Id: ID   with it, each event after the first waits (10 s at most, then the
//                          stream ends) for `POST /__release?id=ID` from any connection
//   X-Test-Pause-After-Bytes: N  with X-Test-Stream-Id, a generated body waits after its
//                          first N bytes (at least) for the release (10 s at most)
//   X-Test-Cut-After-Bytes: N    a generated body stops after about N bytes: the connection
//                          closes with the body unfinished
//   X-Test-Slow-Body-Ms: N       a generated body waits N ms before each 64 KiB piece
//   the JSON reply         has "body_fnv1a": 64-bit FNV-1a of the request body, 16 hex digits
//
// Faults, for clients that retry (the egress tests):
//   X-Test-Fail-Times: N   the first N executions of the request's Idempotency-Key fail (a
//                          request without a key counts by X-Test-Fault-Id; with neither: 400);
//                          later executions answer normally. Counted since the last /__reset.
//   X-Test-Fail-With: F    how they fail: `status` (default) answers X-Test-Fail-Status (default
//                          503, with the usual JSON body), `reset` closes the connection without
//                          an answer (as X-Test-Drop), `hang` waits X-Test-Fail-Hang-Ms (default
//                          5000) and then closes without an answer
//   X-Test-Header          with X-Test-Fail-Times, goes on the failing answers only (e.g.
//                          `Retry-After: 1`); otherwise on every answer
//   GET /__attempts?key=K  {"key":K,"at_ms":[...]}: when each request with Idempotency-Key (or
//                          X-Test-Fault-Id) K arrived (its head read; steady clock, ms with
//                          3 decimals), failed ones included, in order. At most 1000 keys (the
//                          oldest goes first) and 1000 times per key; POST /__reset clears it.
//   GET .../ws + Upgrade: websocket (Connection: Upgrade, Sec-WebSocket-Key): 101, then every
//                          message is echoed back; any method is upgraded (see session.cpp)
//
// Threads: one io_context per thread; the acceptor runs on the first and hands each accepted
// connection to the next context round-robin, so a connection never changes thread.

#include "attempt_log.hpp"
#include "execution_counts.hpp"
#include "session.hpp"
#include "stream_releases.hpp"
#include "tls_front.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <charconv>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <csignal>
#include <cstdlib>

namespace net = boost::asio;
using tcp = net::ip::tcp;
using onceproxy::test_upstream::attempt_log;
using onceproxy::test_upstream::execution_counts;
using onceproxy::test_upstream::stream_releases;

namespace {

struct options {
    std::string host = "127.0.0.1";
    unsigned short port = 0;
    unsigned threads = 1;
    std::string port_file;
    std::string tls_host = "127.0.0.1";
    unsigned short tls_port = 0;
    std::string tls_port_file;
    std::string tls_cert;
    std::string tls_key;
    std::string tls_client_ca;
};

[[noreturn]] void usage_error(std::string_view message) {
    std::fprintf(stderr,
                 "onceproxy_test_upstream: %.*s\n"
                 "usage: onceproxy_test_upstream --listen HOST:PORT [--threads N] "
                 "[--port-file PATH]\n"
                 "       [--tls-cert CHAIN.pem --tls-key KEY.pem [--tls-client-ca CA.pem] "
                 "[--tls-listen HOST:PORT] [--tls-port-file PATH]]\n",
                 static_cast<int>(message.size()), message.data());
    std::exit(2);
}

template <typename Int>
Int parse_int(std::string_view text, Int min, Int max, std::string_view what) {
    Int value{};
    auto const* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (ec != std::errc{} || ptr != end || value < min || value > max)
        usage_error(std::string("bad ") + std::string(what) + ": " + std::string(text));
    return value;
}

options parse_options(int argc, char** argv) {
    options opts;
    for (int i = 1; i < argc; ++i) {
        std::string_view const arg = argv[i];
        auto const value = [&]() -> std::string_view {
            if (i + 1 >= argc)
                usage_error(std::string(arg) + " needs a value");
            return argv[++i];
        };
        if (arg == "--listen") {
            std::string_view const listen = value();
            auto const colon = listen.rfind(':');
            if (colon == std::string_view::npos)
                usage_error("--listen wants HOST:PORT");
            std::string_view host = listen.substr(0, colon);
            if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
                host = host.substr(1, host.size() - 2);
            opts.host = host;
            opts.port = parse_int<unsigned short>(listen.substr(colon + 1), 0, 65535, "port");
        } else if (arg == "--threads") {
            opts.threads = parse_int<unsigned>(value(), 1, 256, "--threads");
        } else if (arg == "--port-file") {
            opts.port_file = value();
        } else if (arg == "--tls-listen") {
            std::string_view const listen = value();
            auto const colon = listen.rfind(':');
            if (colon == std::string_view::npos)
                usage_error("--tls-listen wants HOST:PORT");
            opts.tls_host = listen.substr(0, colon);
            opts.tls_port = parse_int<unsigned short>(listen.substr(colon + 1), 0, 65535, "port");
        } else if (arg == "--tls-port-file") {
            opts.tls_port_file = value();
        } else if (arg == "--tls-cert") {
            opts.tls_cert = value();
        } else if (arg == "--tls-key") {
            opts.tls_key = value();
        } else if (arg == "--tls-client-ca") {
            opts.tls_client_ca = value();
        } else {
            usage_error("unknown argument " + std::string(arg));
        }
    }
    if (opts.tls_cert.empty() != opts.tls_key.empty())
        usage_error("--tls-cert and --tls-key go together");
    if (opts.tls_cert.empty() && (!opts.tls_client_ca.empty() || !opts.tls_port_file.empty()))
        usage_error("--tls-client-ca and --tls-port-file need --tls-cert and --tls-key");
    return opts;
}

void write_port_file(std::string const& path, unsigned short port) {
    std::string const tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << port << '\n';
        if (!out.flush())
            throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

net::awaitable<void> accept_loop(tcp::acceptor& acceptor,
                                 std::vector<std::unique_ptr<net::io_context>>& workers,
                                 execution_counts& counts, stream_releases& releases,
                                 attempt_log& attempts) {
    constexpr auto use_tuple = net::as_tuple(net::use_awaitable);
    net::steady_timer backoff(acceptor.get_executor());
    std::size_t next = 0;
    for (;;) {
        net::io_context& worker = *workers[next++ % workers.size()];
        auto [ec, socket] = co_await acceptor.async_accept(worker.get_executor(), use_tuple);
        if (ec == net::error::operation_aborted || !acceptor.is_open())
            co_return;
        if (ec) {
            // Out of descriptors and the like: wait a little instead of spinning.
            backoff.expires_after(std::chrono::milliseconds(10));
            co_await backoff.async_wait(use_tuple);
            continue;
        }
        net::co_spawn(worker,
                      onceproxy::test_upstream::run_session(tcp::socket(std::move(socket)), counts,
                                                            releases, attempts),
                      net::detached);
    }
}

} // namespace

int main(int argc, char** argv) {
    options const opts = parse_options(argc, argv);
    try {
        std::vector<std::unique_ptr<net::io_context>> workers;
        for (unsigned i = 0; i < opts.threads; ++i)
            workers.push_back(std::make_unique<net::io_context>(1));
        execution_counts counts;
        stream_releases releases;
        attempt_log attempts;

        tcp::endpoint const endpoint(net::ip::make_address(opts.host), opts.port);
        tcp::acceptor acceptor(*workers.front());
        acceptor.open(endpoint.protocol());
        acceptor.set_option(net::socket_base::reuse_address(true));
        acceptor.bind(endpoint);
        acceptor.listen(net::socket_base::max_listen_connections);
        tcp::endpoint const bound = acceptor.local_endpoint();

        if (!opts.port_file.empty())
            write_port_file(opts.port_file, bound.port());
        std::string const address = bound.address().is_v6()
                                        ? "[" + bound.address().to_string() + "]"
                                        : bound.address().to_string();
        std::printf("listening on %s:%u\n", address.c_str(), unsigned{bound.port()});
        std::fflush(stdout);

        // The TLS listener, relaying to the plain one (tls_front.hpp).
        std::optional<net::ssl::context> tls_ctx;
        std::optional<tcp::acceptor> tls_acceptor;
        if (!opts.tls_cert.empty()) {
            tls_ctx.emplace(onceproxy::test_upstream::make_tls_server_context(
                opts.tls_cert, opts.tls_key, opts.tls_client_ca));
            tcp::endpoint const tls_endpoint(net::ip::make_address(opts.tls_host), opts.tls_port);
            tls_acceptor.emplace(*workers.front());
            tls_acceptor->open(tls_endpoint.protocol());
            tls_acceptor->set_option(net::socket_base::reuse_address(true));
            tls_acceptor->bind(tls_endpoint);
            tls_acceptor->listen(net::socket_base::max_listen_connections);
            unsigned short const tls_port = tls_acceptor->local_endpoint().port();
            std::printf("tls listening on %s:%u\n", opts.tls_host.c_str(), unsigned{tls_port});
            if (!opts.tls_port_file.empty())
                write_port_file(opts.tls_port_file, tls_port);
            net::co_spawn(
                *workers.front(),
                onceproxy::test_upstream::tls_accept_loop(*tls_acceptor, *tls_ctx, bound.port()),
                net::detached);
        }

        net::signal_set signals(*workers.front(), SIGINT, SIGTERM);
        signals.async_wait([&](boost::system::error_code const&, int) {
            for (auto& worker : workers)
                worker->stop();
        });
        net::co_spawn(*workers.front(), accept_loop(acceptor, workers, counts, releases, attempts),
                      net::detached);

        std::vector<std::thread> threads;
        std::vector<net::executor_work_guard<net::io_context::executor_type>> guards;
        for (auto& worker : workers)
            guards.push_back(net::make_work_guard(*worker));
        for (std::size_t i = 1; i < workers.size(); ++i)
            threads.emplace_back([&worker = *workers[i]] { worker.run(); });
        workers.front()->run();
        for (auto& worker : workers)
            worker->stop();
        for (auto& thread : threads)
            thread.join();
        return 0;
    } catch (std::exception const& e) {
        std::fprintf(stderr, "onceproxy_test_upstream: %s\n", e.what());
        return 1;
    }
}
