#include "onceproxy/http/server.hpp"

#include "http/plain_relay.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/loop_guard.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <sys/socket.h>

#include <array>
#include <cstdio>
#include <list>

namespace onceproxy::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

/// The upstream's Transfer-Encoding is hop-by-hop and stripped, and the body is buffered whole:
/// without a Content-Length a keep-alive client could not tell where the body ends. Responses
/// that never carry a body (HEAD, 1xx, 204, 304) keep their headers as they are.
void frame_body(response& res, bool head_request) {
    const unsigned status = res.result_int();
    if (head_request || status < 200 || status == 204 || status == 304 ||
        res.has_content_length() || res.chunked()) {
        return;
    }
    res.content_length(res.body().size());
}

} // namespace

struct server::impl : std::enable_shared_from_this<impl> {
    struct session_entry {
        tcp::socket* stream = nullptr;
        bool busy = false; ///< a request is being read or answered
    };

    impl(net::io_context& c, std::shared_ptr<const config::config> cf, handler& hd,
         metrics::registry& r, wire::deadline_watch& w)
        : ioc(c), cfg(std::move(cf)), h(hd), reg(r), watch(w), acceptor(c) {}

    net::io_context& ioc;
    std::shared_ptr<const config::config> cfg;
    handler& h;
    metrics::registry& reg;
    wire::deadline_watch& watch;
    tcp::acceptor acceptor;
    bool draining = false;
    std::list<session_entry> sessions;

    /// Completion of a spawned coroutine: an exception is a bug; log it, count it, go on.
    auto log_failure(const char* what) {
        return [this, self = shared_from_this(), what](std::exception_ptr e) {
            report_exception(e, what, reg.internal_errors);
        };
    }

    net::awaitable<void> accept_loop() {
        auto self = shared_from_this();
        accept_backoff backoff;
        while (acceptor.is_open()) {
            auto [ec, sock] = co_await acceptor.async_accept(use_tuple);
            if (ec) {
                if (ec == net::error::operation_aborted || !acceptor.is_open()) {
                    co_return;
                }
                // Out of descriptors or a transient error: back off instead of spinning, and
                // go on accepting (the connection waits in the kernel's backlog meanwhile).
                reg.accept_errors_proxy.fetch_add(1, std::memory_order_relaxed);
                net::steady_timer t(ioc, backoff.on_error("proxy", ec));
                co_await t.async_wait(use_tuple);
                continue;
            }
            backoff.reset();
            if (static_cast<std::uint64_t>(reg.open_connections.load(std::memory_order_relaxed)) >=
                reg.connection_limit.load(std::memory_order_relaxed)) {
                reg.connections_refused.fetch_add(1, std::memory_order_relaxed);
                net::co_spawn(ioc, refuse(std::move(sock)), log_failure("refused connection"));
                continue;
            }
            net::co_spawn(ioc, session(std::move(sock)), log_failure("session"));
        }
    }

    /// Over limits.max_connections: a 503 problem, then the connection closes. The client's
    /// first bytes are read and dropped for a moment so the close does not reset the answer away.
    net::awaitable<void> refuse(tcp::socket sock) {
        wire::deadline_watch::slot dl(watch, sock);
        dl.expires_after(std::chrono::seconds(1));
        auto res =
            make_problem(problem_code::connection_limit,
                         "the proxy is at its connection limit; retry later", 11, std::nullopt, 1u);
        res.keep_alive(false);
        auto [wec, wn] = co_await bhttp::async_write(sock, res, use_tuple);
        (void)wn;
        boost::system::error_code ignored;
        if (!wec) {
            sock.shutdown(tcp::socket::shutdown_send, ignored);
            std::array<char, 4096> sink{};
            for (int i = 0; i < 16; ++i) {
                auto [rec, rn] = co_await sock.async_read_some(net::buffer(sink), use_tuple);
                (void)rn;
                if (rec) {
                    break;
                }
            }
        }
        sock.close(ignored);
    }

    net::awaitable<void> send_problem_and_close(tcp::socket& stream, wire::deadline_watch::slot& dl,
                                                problem_code code, std::string_view detail,
                                                std::optional<unsigned> status = std::nullopt) {
        auto res = make_problem(code, detail, 11, status);
        res.keep_alive(false);
        dl.expires_after(cfg->limits.idle_timeout);
        co_await bhttp::async_write(stream, res, use_tuple);
        reg.unrouted().count(metrics::outcome::rejected);
    }

    /// Answers a request that could not be read (unless the client went away) and closes.
    net::awaitable<void> send_read_failure(tcp::socket& stream, wire::deadline_watch::slot& dl,
                                           const boost::system::error_code& ec,
                                           std::string_view what) {
        if (auto res = read_failure_problem(ec, what)) {
            res->keep_alive(false);
            dl.expires_after(cfg->limits.idle_timeout);
            co_await bhttp::async_write(stream, *res, use_tuple);
            reg.unrouted().count(metrics::outcome::rejected);
        }
    }

    net::awaitable<void> session(tcp::socket sock) {
        auto self = shared_from_this();
        reg.open_connections.fetch_add(1, std::memory_order_relaxed);
        request_context ctx;
        ctx.tls = false;
        {
            boost::system::error_code ec;
            auto ep = sock.remote_endpoint(ec);
            ctx.client_ip = ec ? "unknown" : ep.address().to_string();
            sock.set_option(tcp::no_delay(true), ec);
        }
        tcp::socket stream(std::move(sock));
        wire::deadline_watch::slot dl(watch, stream);
        auto entry = sessions.insert(sessions.end(), session_entry{&stream, false});
        struct cleanup {
            impl* self;
            std::list<session_entry>::iterator it;
            ~cleanup() {
                self->sessions.erase(it);
                self->reg.open_connections.fetch_sub(1, std::memory_order_relaxed);
            }
        } guard{this, entry};

        const auto& limits = cfg->limits;
        // Bounded: a header, a chunk-size line or a trailer section that does not fit is a
        // read error (buffer_overflow), never unbounded memory (see message_parser.hpp).
        beast::flat_buffer buffer(wire::read_buffer_limit(limits.max_header_bytes));
        std::string wire_head; // serialised response head, reused for every response
        bool first = true;
        while (!draining) {
            entry->busy = false;
            if (buffer.size() == 0) {
                // Waiting for the next request: the idle deadline (header deadline for the
                // first request of a connection).
                dl.expires_after(first ? limits.header_timeout : limits.idle_timeout);
                auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), use_tuple);
                if (ec) {
                    break;
                }
                buffer.commit(n);
            }
            entry->busy = true;
            first = false;
            ctx.received = std::chrono::steady_clock::now();

            wire::request_parser parser;
            parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
            parser.body_limit(boost::none); // the route's limit, set once the route is known
            parser.trailer_limit(limits.max_header_bytes);
            dl.expires_after(limits.header_timeout);
            auto [hec, hn] = co_await bhttp::async_read_header(stream, buffer, parser, use_tuple);
            (void)hn;
            if (hec) {
                co_await send_read_failure(stream, dl, hec, "request");
                break;
            }
            if (const auto why = refuse_request_head(parser.get()); !why.empty()) {
                // Refused before any of the body is read or anything is sent upstream.
                co_await send_problem_and_close(stream, dl, problem_code::bad_request, why);
                break;
            }
            const auto expect = parser.get()[bhttp::field::expect];
            if (!parser.is_done() && !expect.empty() && !beast::iequals(expect, "100-continue")) {
                // RFC 9110 §10.1.1: 417 Expectation Failed; counted like every refusal.
                co_await send_problem_and_close(stream, dl, problem_code::bad_request,
                                                "unsupported Expect value", 417u);
                break;
            }
            std::size_t route_index = 0;
            const auto* route = h.route_for(parser.get(), route_index);
            const auto body_limit = route != nullptr
                                        ? route->limits.max_request_bytes
                                        : std::optional<std::size_t>(limits.max_request_bytes);
            if (body_limit && parser.content_length().value_or(0) > *body_limit) {
                co_await send_problem_and_close(stream, dl, problem_code::request_too_large,
                                                "request body exceeds max_request_bytes");
                break;
            }
            parser.body_limit(body_limit ? boost::optional<std::uint64_t>(*body_limit)
                                         : boost::none);
            if (route != nullptr && h.streams(*route, parser.get().method_string())) {
                // The plain path: streamed both ways, nothing buffered whole.
                const bool keep =
                    co_await h.async_relay(client_side{stream, buffer, dl, wire_head, draining},
                                           parser, *route, route_index, ctx);
                if (!keep) {
                    break;
                }
                continue;
            }
            if (!parser.is_done()) {
                if (!expect.empty() && parser.get().version() >= 11) {
                    static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
                    auto [wec, wn] = co_await net::async_write(
                        stream, net::buffer(cont.data(), cont.size()), use_tuple);
                    (void)wn;
                    if (wec) {
                        break;
                    }
                }
                dl.expires_after(limits.idle_timeout);
                auto [bec, bn] = co_await bhttp::async_read(stream, buffer, parser, use_tuple);
                (void)bn;
                if (bec) {
                    co_await send_read_failure(stream, dl, bec, "request body");
                    break;
                }
            }
            // Trailer fields stay in the parser: the body is forwarded re-framed with a
            // Content-Length, which carries no trailer (RFC 9112 §7.1.2 lets a recipient that
            // removes the chunked coding discard them), and nothing of them may reach the
            // header the route, key, scope and fingerprint are read from (RFC 9110 §6.5.1).
            auto req = parser.release();
            const bool keep_alive = req.keep_alive();
            const bool head = req.method() == bhttp::verb::head;
            dl.disarm(); // the upstream side has its own deadlines
            auto res = co_await h.async_handle(req, ctx);
            frame_body(res, head);
            const bool keep = keep_alive && !draining;
            res.keep_alive(keep);
            dl.expires_after(limits.idle_timeout); // a client that reads nothing is dropped
            wire::serialize_head(res, wire_head);
            const std::array<net::const_buffer, 2> wire{net::buffer(wire_head),
                                                        net::buffer(res.body())};
            auto [wec, wn] = co_await net::async_write(stream, wire, use_tuple);
            (void)wn;
            if (wec || !keep) {
                break;
            }
        }
        boost::system::error_code ignored;
        stream.shutdown(tcp::socket::shutdown_send, ignored);
    }
};

server::server(net::io_context& ioc, std::shared_ptr<const config::config> cfg, handler& h,
               metrics::registry& reg, wire::deadline_watch& watch)
    : impl_(std::make_shared<impl>(ioc, std::move(cfg), h, reg, watch)) {}

server::~server() = default;

void server::listen(unsigned short port_override) {
    auto& a = impl_->acceptor;
    const auto& l = impl_->cfg->listen;
    tcp::endpoint ep(net::ip::make_address(l.host), port_override ? port_override : l.port);
    a.open(ep.protocol());
    a.set_option(tcp::acceptor::reuse_address(true));
    int one = 1;
    ::setsockopt(a.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    a.bind(ep);
    a.listen(net::socket_base::max_listen_connections);
}

unsigned short server::port() const {
    return impl_->acceptor.local_endpoint().port();
}

void server::start() {
    net::co_spawn(impl_->ioc, impl_->accept_loop(), impl_->log_failure("accept loop"));
}

void server::drain() {
    impl_->draining = true;
    boost::system::error_code ec;
    impl_->acceptor.close(ec);
    for (auto& s : impl_->sessions) {
        if (!s.busy) {
            s.stream->cancel(ec); // idle keep-alive connection: close it now
        }
    }
}

std::size_t server::active_sessions() const {
    return impl_->sessions.size();
}

void server::close_all() {
    boost::system::error_code ec;
    for (auto& s : impl_->sessions) {
        s.stream->close(ec);
    }
}

} // namespace onceproxy::http
