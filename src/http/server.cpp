#include "onceproxy/http/server.hpp"

#include "http/h2_connection.hpp"

#include "http/body_pace.hpp"
#include "http/buffer_budget.hpp"
#include "http/plain_relay.hpp"
#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/config/route_table.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/loop_guard.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/http/request_target.hpp"
#include "onceproxy/http/tls_source.hpp"
#include "onceproxy/wire/coarse_clock.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_parser.hpp"
#include "onceproxy/wire/message_reader.hpp"
#include "onceproxy/wire/stream.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/write.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <list>
#include <memory>
#include <optional>

namespace onceproxy::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

static_assert(wire::max_header_section == config::limits_config::max_header_bytes_cap,
              "the parsers must accept every header section limits.max_header_bytes allows");

namespace {

/// How long the close_notify of a closing TLS connection may take to be written (a client
/// that reads nothing).
constexpr std::chrono::milliseconds tls_shutdown_timeout{1'000};

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

/// The read step's verdict on one request head.
struct read_verdict {
    /// The head is read and acceptable; `route` is its route (nullptr: none matches).
    bool accepted = false;
    /// Not accepted: the answer to send before closing, or nothing when the client went away.
    std::optional<response> rejection;
    const config::route_config* route = nullptr;
    std::size_t route_index = 0;

    static read_verdict reject(std::optional<response> r) {
        read_verdict v;
        v.rejection = std::move(r);
        return v;
    }
};

} // namespace

struct server::impl : std::enable_shared_from_this<impl> {
    impl(net::io_context& c, std::shared_ptr<const config::config> cf, std::shared_ptr<handler> hd,
         counted m, wire::deadline_watch& w, task_tracker& t, std::shared_ptr<tls_source> ts)
        : ioc(c), cfg(std::move(cf)), h(std::move(hd)), reg(m.reg), worker(m.worker), watch(w),
          tracker(t), acceptor(c), tls_acceptor(c), tls(std::move(ts)) {}

    net::io_context& ioc;
    std::shared_ptr<const config::config> cfg; ///< the start config: the listen address
    std::shared_ptr<handler> h;                ///< the current config's request path
    metrics::registry& reg;
    std::size_t worker; ///< the worker this server runs on (family::worker_connections)
    wire::deadline_watch& watch;
    task_tracker& tracker;           ///< every session is joined by the worker's drain
    tcp::acceptor acceptor;          ///< `listen`: plain, or TLS when tls.listen is unset
    tcp::acceptor tls_acceptor;      ///< tls.listen, when set
    std::shared_ptr<tls_source> tls; ///< the certificate new TLS connections get; null: no TLS
    bool draining = false;
    struct connection;
    /// The worker's open sessions: the drain reaches each of them (connection::on_cancel;
    /// total: idle connections end; terminal: the drain deadline cuts every connection).
    std::list<connection*> connections;

    /// Completion of a spawned coroutine: an exception is a bug; log it, count it, go on.
    auto log_failure(const char* what) {
        return [this, self = shared_from_this(), what](std::exception_ptr e) {
            report_exception(e, what, reg.counter(metrics::family::internal_errors));
        };
    }

    /// Accepts on `from` (a TLS listener when `with_tls`).
    net::awaitable<void> accept_loop(tcp::acceptor& from, bool with_tls) {
        auto self = shared_from_this();
        accept_backoff backoff;
        while (from.is_open()) {
            auto [ec, sock] = co_await from.async_accept(use_tuple);
            if (ec) {
                if (ec == net::error::operation_aborted || !from.is_open()) {
                    co_return;
                }
                // Out of descriptors or a transient error: back off instead of spinning, and
                // go on accepting (the connection waits in the kernel's backlog meanwhile).
                reg.counter(metrics::family::accept_errors, metrics::listener::proxy).inc();
                net::steady_timer t(ioc, backoff.on_error("proxy", ec));
                co_await t.async_wait(use_tuple);
                continue;
            }
            backoff.reset();
            if (reg.gauge(metrics::family::open_connections).value() >=
                reg.gauge(metrics::family::connection_limit).value()) {
                reg.counter(metrics::family::connections_refused).inc();
                if (with_tls) {
                    // No handshake for a connection that is not served: it is closed.
                    boost::system::error_code ignored;
                    sock.close(ignored);
                    continue;
                }
                net::co_spawn(ioc, refuse(std::move(sock), tracker.enter()),
                              log_failure("refused connection"));
                continue;
            }
            net::co_spawn(
                ioc, session(std::move(sock), with_tls ? tls->current() : nullptr, tracker.enter()),
                log_failure("session"));
        }
    }

    /// Over limits.max_connections: a 503 problem, then the connection closes. The client's
    /// first bytes are read and dropped for a moment so the close does not reset the answer away.
    net::awaitable<void> refuse(tcp::socket sock, [[maybe_unused]] task_tracker::token held) {
        wire::deadline_watch::slot dl(watch, sock);
        dl.expires_after(std::chrono::seconds(1));
        auto res =
            make_problem(problem_code::connection_limit,
                         "the proxy is at its connection limit; retry later", {.retry_after_s = 1});
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

    /// `tls_ctx`: the connection is TLS, served with this context; null: plain.
    net::awaitable<void> session(tcp::socket sock, std::shared_ptr<net::ssl::context> tls_ctx,
                                 [[maybe_unused]] task_tracker::token held);
};

/// One client connection: its socket, read buffer and deadline, and the steps of its loop.
struct server::impl::connection {
    connection(impl& s, tcp::socket sock, std::shared_ptr<net::ssl::context> tls_ctx)
        : srv(s), stream(tls_ctx ? wire::stream(std::move(sock), std::move(tls_ctx))
                                 : wire::stream(std::move(sock))),
          dl(s.watch, stream.socket()),
          // Bounded: a header, a chunk-size line or a trailer section that does not fit is a
          // read error (buffer_overflow), never unbounded memory (see message_parser.hpp).
          buffer(wire::read_buffer_limit(s.h->config().limits.max_header_bytes)),
          listed(s.connections.insert(s.connections.end(), this)) {
        srv.reg.gauge(metrics::family::open_connections).inc();
        srv.reg.worker_connections_add(srv.worker, 1);
        boost::system::error_code ec;
        auto ep = stream.socket().remote_endpoint(ec);
        ctx.client_ip = ec ? "unknown" : ep.address().to_string();
        ctx.tls = stream.is_tls();
        stream.socket().set_option(tcp::no_delay(true), ec);
    }
    ~connection() {
        boost::system::error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
        srv.connections.erase(listed);
        srv.reg.gauge(metrics::family::open_connections).dec();
        srv.reg.worker_connections_add(srv.worker, -1);
    }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    impl& srv;
    wire::stream stream;
    wire::deadline_watch::slot dl;
    beast::flat_buffer buffer;
    std::list<connection*>::iterator listed; ///< in srv.connections, for the drain
    h2_connection* h2 = nullptr;             ///< set while the connection speaks HTTP/2
    bool busy = false;                       ///< a request is being read or answered
    request_context ctx;
    std::string wire_head; ///< serialised response head, reused for every response
    std::optional<wire::request_parser> parser;
    bool first = true;      ///< no request read yet
    std::size_t served = 0; ///< requests accepted on this connection
    /// The request path the current request runs on, taken when its first bytes arrive and
    /// held until it is answered (a reload meanwhile does not change it); none while idle, so
    /// an idle connection does not keep a replaced config alive.
    std::shared_ptr<handler> h;

    /// The worker's drain. total: a connection waiting for its next request stops waiting and
    /// ends (nothing is lost); one whose request is being read or answered goes on, and closes
    /// after its response. terminal (the drain deadline passed): the client side is cut, every
    /// operation on it fails from now on, while the exchange behind it goes on recording or
    /// releasing its key.
    void on_cancel(net::cancellation_type t) {
        if (h2 != nullptr) {
            h2->on_cancel(t);
            return;
        }
        boost::system::error_code ignored;
        if ((t & net::cancellation_type::terminal) != net::cancellation_type::none) {
            stream.socket().close(ignored);
        } else if (!busy) {
            stream.socket().cancel(ignored);
        }
    }

    /// What the client speaks: HTTP/2 when ALPN chose h2 (TLS) or the connection starts with
    /// the HTTP/2 preface (plain; read here, it stays in `buffer` for the session), per listener
    /// (http2.tls, http2.cleartext); else HTTP/1.1. `nothing`: the client went away (or stayed
    /// silent past header_timeout) before its first bytes.
    enum class speaks { http1, h2, nothing };
    net::awaitable<speaks> protocol() {
        const auto& h2cfg = srv.cfg->http2;
        if (stream.is_tls()) {
            co_return h2cfg.tls&& stream.alpn() == "h2" ? speaks::h2 : speaks::http1;
        }
        if (!h2cfg.cleartext) {
            co_return speaks::http1;
        }
        dl.expires_after(limits().header_timeout);
        for (;;) {
            const auto d = buffer.data();
            const auto m =
                match_preface(std::string_view(static_cast<const char*>(d.data()), d.size()));
            if (m != preface_match::partial) {
                co_return m == preface_match::yes ? speaks::h2 : speaks::http1;
            }
            auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), use_tuple);
            if (ec) {
                // Gone before a whole request: nothing to answer. (And no second read: after
                // an end of file, it would wait for an event the socket already gave.)
                co_return speaks::nothing;
            }
            buffer.commit(n);
        }
    }

    /// The current request's limits; while idle, the newest config's.
    const config::limits_config& limits() const { return (h ? *h : *srv.h).config().limits; }

    /// The read step: waits for the next request (the header deadline for a connection's first
    /// request, the idle deadline afterwards), reads its head and checks and routes it (the
    /// body is not read yet: its limit is the route's, known only now). Not accepted: the
    /// connection ends, after the rejection if there is one (none: the client closed or went
    /// away).
    net::awaitable<read_verdict> read_request() {
        busy = false;
        h.reset();
        if (buffer.size() == 0) {
            dl.expires_after(first ? limits().header_timeout : limits().idle_timeout);
            // The client's turn: after a request read whole, the read waits for its next bytes
            // rather than first finding nothing (async_read_next).
            auto [ec, n] = co_await stream.async_read_next(buffer.prepare(4096), use_tuple);
            if (ec) {
                co_return read_verdict{};
            }
            buffer.commit(n);
        }
        busy = true;
        h = srv.h;
        first = false;
        ctx.received = std::chrono::steady_clock::now();
        auto& p = parser.emplace();
        p.header_limit(static_cast<std::uint32_t>(limits().max_header_bytes));
        p.body_limit(boost::none); // the route's limit, set once the route is known
        p.trailer_limit(limits().max_header_bytes);
        dl.expires_after(limits().header_timeout);
        if (auto ec = co_await wire::async_read(stream, buffer, p, wire::read_until::header)) {
            if (dl.fired()) {
                srv.reg.counter(metrics::family::client_timeouts, metrics::timeout_phase::header)
                    .inc();
            }
            co_return read_verdict::reject(read_failure_problem(ec, "request"));
        }
        co_return check_head(p);
    }

    /// Refusals decided from the head alone, before any of the body is read or anything is
    /// sent upstream; then the route and its body limit.
    read_verdict check_head(wire::request_parser& p) const {
        const auto& head = p.get();
        const auto expect = first_value(head, bhttp::field::expect);
        if (!p.is_done() && !expect.empty() && !beast::iequals(expect, "100-continue") &&
            refuse_request_head(head).empty()) {
            return read_verdict::reject(make_problem(problem_code::bad_request,
                                                     "unsupported Expect value", {.status = 417}));
        }
        const auto declared = p.content_length();
        auto a =
            h->admit(p.get(), declared ? std::optional<std::uint64_t>(*declared) : std::nullopt);
        if (a.refusal) {
            return read_verdict::reject(std::move(a.refusal));
        }
        p.body_limit(a.body_limit ? boost::optional<std::uint64_t>(*a.body_limit) : boost::none);
        read_verdict v;
        v.accepted = true;
        v.route = a.route;
        v.route_index = a.route_index;
        return v;
    }

    /// The write step: frames `res` (Content-Length, keep-alive) and writes it. True when the
    /// connection may carry the next request.
    net::awaitable<bool> write_response(response& res, bool head_request, bool keep) {
        frame_body(res, head_request);
        res.keep_alive(keep);
        dl.expires_after(limits().idle_timeout); // a client that reads nothing is dropped
        wire::serialize_head(res, wire_head);
        const std::array<net::const_buffer, 2> wire{net::buffer(wire_head),
                                                    net::buffer(res.body())};
        auto [ec, n] = co_await wire::async_write_all(stream, wire);
        (void)n;
        co_return !ec && keep;
    }

    /// A request refused at the read step: its answer (if the client is still there), counted
    /// as a rejection of no route; the connection then closes.
    net::awaitable<void> reject(std::optional<response> res) {
        if (!res) {
            co_return; // the client went away: nobody to answer
        }
        co_await write_response(*res, false, false);
        srv.reg.unrouted().counter(metrics::family::requests, metrics::outcome::rejected).inc();
    }

    /// The answer to a body that does not fit limits.max_buffered_bytes (counted).
    response buffer_refusal() const {
        srv.reg.counter(metrics::family::buffered_refusals).inc();
        return make_problem(problem_code::memory_limit, {.retry_after_s = 1});
    }

    /// Reads the rest of a body that is buffered whole, each read within body_timeout, the
    /// whole at min_body_rate and within max_body_time (body_pace), its bytes held in `held`.
    /// An answer when it failed (nullopt and a false verdict: the client went away).
    net::awaitable<std::optional<std::optional<response>>>
    read_whole_body(wire::request_parser& p, buffer_reservation& held) {
        // The coarse clock (wire/coarse_clock.hpp): the pace's bounds are seconds. The time a
        // read ended is also when the next one starts (nothing waits in between).
        auto now = wire::coarse_now();
        const body_pace pace(now, limits().body_timeout, limits().min_body_rate,
                             limits().max_body_time);
        while (!p.is_done()) {
            dl.expires_at(pace.read_deadline(now));
            const auto ec = co_await wire::async_read(stream, buffer, p, wire::read_until::some);
            now = wire::coarse_now();
            if (dl.fired() || (!ec && !pace.on_progress(p.get().body().size(), now))) {
                srv.reg.counter(metrics::family::client_timeouts, metrics::timeout_phase::body)
                    .inc();
                co_return make_problem(problem_code::request_timeout);
            }
            if (ec) {
                co_return read_failure_problem(ec, "request body");
            }
            if (!held.try_grow_to(p.get().body().size())) {
                co_return buffer_refusal(); // a chunked body outgrew the budget
            }
        }
        co_return std::nullopt;
    }

    /// A request the handler answers whole (no route, or a guarded method): its body is read
    /// whole first; `route` and `route_index` are the read step's. True when the connection
    /// may carry the next request.
    net::awaitable<bool> serve_whole(const config::route_config* route, std::size_t route_index) {
        auto& p = *parser;
        // The body counts against limits.max_buffered_bytes until the answer is written (the
        // exchange holds it further while it goes on): a declared length at once, before any
        // of it is read or 100 Continue invites it, a chunked body as it grows (issue 26).
        auto held = std::make_shared<buffer_reservation>(
            srv.reg.gauge(metrics::family::buffered_bytes).cell(),
            srv.reg.gauge(metrics::family::buffered_bytes_limit).cell());
        if (!held->try_grow_to(std::max<std::size_t>(
                static_cast<std::size_t>(p.content_length().value_or(0)), p.get().body().size()))) {
            co_await reject(buffer_refusal());
            co_return false;
        }
        if (!p.is_done()) {
            if (!first_value(p.get(), bhttp::field::expect).empty() && p.get().version() >= 11) {
                static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
                auto [wec, wn] = co_await net::async_write(
                    stream, net::buffer(cont.data(), cont.size()), use_tuple);
                (void)wn;
                if (wec) {
                    co_return false;
                }
            }
            if (auto res = co_await read_whole_body(p, *held)) {
                co_await reject(std::move(*res));
                co_return false;
            }
        }
        // Trailer fields stay in the parser: the body is forwarded re-framed with a
        // Content-Length, which carries no trailer (RFC 9112 §7.1.2 lets a recipient that
        // removes the chunked coding discard them), and nothing of them may reach the
        // header the route, key, scope and fingerprint are read from (RFC 9110 §6.5.1).
        auto req = p.release();
        const bool keep_alive = req.keep_alive();
        const bool head = req.method() == bhttp::verb::head;
        dl.disarm(); // the upstream side has its own deadlines
        auto out = co_await h->async_handle(
            req, route, route_index, ctx,
            client_side{stream, buffer, dl, wire_head, srv.draining, last()}, held);
        if (out.streamed) {
            co_return out.keep && !srv.draining; // written already, by the exchange or the stream
        }
        co_return co_await write_response(*out.res, head, keep_alive && !srv.draining && !last());
    }

    /// This connection's request cap is reached: the answer says Connection: close.
    bool last() const { return served >= limits().max_requests_per_connection; }

    /// Serves one accepted request: streamed both ways on the plain path, else whole. (Not a
    /// coroutine itself: one frame fewer per request.)
    net::awaitable<bool> serve(const read_verdict& v) {
        ++served;
        srv.reg.counter(metrics::family::client_requests, metrics::protocol::http1).inc();
        if (v.route != nullptr && h->streams(*v.route, parser->get())) {
            return h->async_relay(client_side{stream, buffer, dl, wire_head, srv.draining, last()},
                                  *parser, *v.route, v.route_index, ctx);
        }
        return serve_whole(v.route, v.route_index);
    }
};

net::awaitable<void> server::impl::session(tcp::socket sock,
                                           std::shared_ptr<net::ssl::context> tls_ctx,
                                           [[maybe_unused]] task_tracker::token held) {
    auto self = shared_from_this();
    connection c(*this, std::move(sock), std::move(tls_ctx));
    if (c.stream.is_tls()) {
        // The handshake is part of the first request's head: within header_timeout.
        c.dl.expires_after(c.limits().header_timeout);
        const auto ec = co_await c.stream.async_handshake(wire::stream::role::server);
        if (ec) {
            reg.counter(metrics::family::tls_handshake_failures).inc();
            co_return;
        }
        c.ctx.client_cert_subject = c.stream.verified_peer_subject();
    }
    const auto spoken = co_await c.protocol();
    if (spoken == connection::speaks::nothing) {
        co_return;
    }
    if (spoken == connection::speaks::h2) {
        reg.counter(metrics::family::client_connections, metrics::protocol::h2).inc();
        h2_connection h2c(h, reg, draining, c.stream, c.dl, c.buffer, c.ctx);
        c.h2 = &h2c;
        co_await h2c.run();
        c.h2 = nullptr;
        if (c.stream.is_tls()) {
            c.dl.expires_after(
                std::min<std::chrono::milliseconds>(c.limits().idle_timeout, tls_shutdown_timeout));
            co_await c.stream.async_shutdown();
        }
        co_return;
    }
    reg.counter(metrics::family::client_connections, metrics::protocol::http1).inc();
    while (!draining) {
        auto verdict = co_await c.read_request();
        if (!verdict.accepted) {
            co_await c.reject(std::move(verdict.rejection));
            break;
        }
        if (!co_await c.serve(verdict)) {
            break;
        }
    }
    if (c.stream.is_tls()) {
        // close_notify before the close, also after an idle or header timeout and at a drain
        // (a connection the drain closed skips it; one reset fails it at once).
        c.dl.expires_after(
            std::min<std::chrono::milliseconds>(c.limits().idle_timeout, tls_shutdown_timeout));
        co_await c.stream.async_shutdown();
    }
}

server::server(net::io_context& ioc, std::shared_ptr<const config::config> cfg,
               std::shared_ptr<handler> h, counted metrics, wire::deadline_watch& watch,
               task_tracker& tracker, std::shared_ptr<tls_source> tls)
    : impl_(std::make_shared<impl>(ioc, std::move(cfg), std::move(h), metrics, watch, tracker,
                                   std::move(tls))) {}

server::~server() = default;

namespace {

void open_listener(tcp::acceptor& a, const config::endpoint& l, unsigned short port_override) {
    tcp::endpoint ep(net::ip::make_address(l.host), port_override ? port_override : l.port);
    a.open(ep.protocol());
    a.set_option(tcp::acceptor::reuse_address(true));
    int one = 1;
    ::setsockopt(a.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    a.bind(ep);
    a.listen(net::socket_base::max_listen_connections);
}

} // namespace

void server::listen(unsigned short port_override, unsigned short tls_port_override) {
    const auto& cfg = *impl_->cfg;
    open_listener(impl_->acceptor, cfg.listen, port_override);
    if (cfg.tls && cfg.tls->listen && impl_->tls) {
        open_listener(impl_->tls_acceptor, *cfg.tls->listen, tls_port_override);
    }
}

unsigned short server::port() const {
    return impl_->acceptor.local_endpoint().port();
}

unsigned short server::tls_port() const {
    if (impl_->tls_acceptor.is_open()) {
        return impl_->tls_acceptor.local_endpoint().port();
    }
    return impl_->tls ? port() : 0;
}

void server::start() {
    const bool listen_is_tls = impl_->tls && !impl_->tls_acceptor.is_open();
    net::co_spawn(impl_->ioc, impl_->accept_loop(impl_->acceptor, listen_is_tls),
                  impl_->log_failure("accept loop"));
    if (impl_->tls_acceptor.is_open()) {
        net::co_spawn(impl_->ioc, impl_->accept_loop(impl_->tls_acceptor, true),
                      impl_->log_failure("TLS accept loop"));
    }
}

void server::drain() {
    impl_->draining = true;
    boost::system::error_code ec;
    impl_->acceptor.close(ec);
    impl_->tls_acceptor.close(ec);
    for (auto* c : impl_->connections) {
        c->on_cancel(net::cancellation_type::total); // idle keep-alive connections end now
    }
}

void server::set_handler(std::shared_ptr<handler> h) {
    impl_->h = std::move(h);
}

void server::cut_connections() {
    for (auto* c : impl_->connections) {
        c->on_cancel(net::cancellation_type::terminal);
    }
}

} // namespace onceproxy::http
