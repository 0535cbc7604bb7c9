#include "http/h2_connection.hpp"

#include "http/buffer_budget.hpp"
#include "http/grpc_answer.hpp"
#include "http/h2_stream.hpp"
#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/h2/server_session.hpp"
#include "onceproxy/http/handler.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/loop_guard.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/upstream/h2_upstream.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include <charconv>
#include <span>
#include <string>
#include <unordered_map>

namespace onceproxy::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using clock = std::chrono::steady_clock;

namespace {

constexpr std::string_view preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A stream's queued answer bytes past which write_body waits for the client's window.
constexpr std::size_t send_high_water = 64 * 1024;
/// Frames gathered into one write, at most.
constexpr std::size_t max_gather = 256 * 1024;

/// The request an HTTP/2 stream carries, as the request paths read one: the pseudo-header
/// fields become the request line, :authority the Host field (RFC 9113 §8.3.1).
request to_request(h2::request_head& head) {
    request req;
    req.method_string(head.method);
    req.target(head.path);
    req.version(11);
    bool has_host = false;
    std::string cookie;
    for (auto& f : head.fields) {
        if (f.name == "cookie") {
            // HTTP/2 may split Cookie into one field per crumb; HTTP/1.1 wants one field,
            // joined with "; " (RFC 9113 §8.2.3).
            cookie.append(cookie.empty() ? "" : "; ").append(f.value);
            continue;
        }
        has_host = has_host || f.name == "host";
        req.insert(f.name, f.value);
    }
    if (!cookie.empty()) {
        req.set(bhttp::field::cookie, cookie);
    }
    if (!head.authority.empty()) {
        // :authority wins over a Host field that disagrees (§8.3.1).
        req.set(bhttp::field::host, head.authority);
    } else if (!has_host) {
        req.set(bhttp::field::host, "");
    }
    return req;
}

std::optional<std::uint64_t> declared_length(const request& req) {
    const auto v = first_value(req, bhttp::field::content_length);
    if (v.empty()) {
        return std::nullopt;
    }
    std::uint64_t n = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) {
        return std::nullopt;
    }
    return n;
}

} // namespace

preface_match match_preface(std::string_view first_bytes) noexcept {
    const auto n = std::min(first_bytes.size(), preface.size());
    if (first_bytes.substr(0, n) != preface.substr(0, n)) {
        return preface_match::no;
    }
    return n == preface.size() ? preface_match::yes : preface_match::partial;
}

struct h2_connection::impl : h2::events, std::enable_shared_from_this<impl> {
    struct stream_state;

    impl(const std::shared_ptr<handler>& cur, metrics::registry& r, const bool& dr, wire::stream& s,
         wire::deadline_watch::slot& d, beast::flat_buffer& b, request_context c)
        : current(cur), reg(r), draining(dr), stream(s), dl(d), in(b), ctx(std::move(c)),
          write_wake(s.get_executor(), clock::time_point::max()),
          done_wake(s.get_executor(), clock::time_point::max()) {
        ctx.protocol = "HTTP/2";
    }

    const std::shared_ptr<handler>& current;
    metrics::registry& reg;
    const bool& draining;
    wire::stream& stream;
    wire::deadline_watch::slot& dl;
    beast::flat_buffer& in;
    request_context ctx;
    std::unique_ptr<h2::server_session> session;
    std::unordered_map<std::int32_t, std::shared_ptr<stream_state>> streams;
    net::steady_timer write_wake; ///< the writer waits on it for output
    net::steady_timer done_wake;  ///< run() waits on it for the reader and the streams
    std::string out;              ///< the frames being written
    bool writing = false;
    bool reader_running = false;
    bool ended = false; ///< the connection is done: no more reads or writes
    bool any_request = false;
    std::size_t tasks = 0; ///< stream coroutines running

    const config::limits_config& limits() const { return current->config().limits; }

    /// There is output for the writer.
    void kick() { write_wake.cancel(); }

    /// The connection's deadline: a write within idle_timeout; with no stream open, the next
    /// request within header_timeout (the first) or idle_timeout; none while streams are
    /// served (each stream has its own).
    void rearm() {
        if (writing || ended) {
            return;
        }
        if (!streams.empty() || tasks > 0) {
            dl.disarm();
            return;
        }
        dl.expires_after(any_request ? limits().idle_timeout : limits().header_timeout);
    }

    // h2::events
    void on_request(std::int32_t id, h2::request_head&& head, bool end_stream) override;
    void on_data(std::int32_t id, std::span<const char> bytes) override;
    void on_request_end(std::int32_t id, std::vector<h2::field>&& trailers) override;
    void on_stream_close(std::int32_t id, h2::error_code code) override;
    void on_send_room(std::int32_t id) override;

    stream_state* find(std::int32_t id) {
        auto it = streams.find(id);
        return it == streams.end() ? nullptr : it->second.get();
    }

    net::awaitable<void> read_loop(std::shared_ptr<impl> /*self: kept alive*/);
    net::awaitable<void> write_loop();
    net::awaitable<void> serve(std::shared_ptr<impl> self, std::shared_ptr<stream_state> st);
    net::awaitable<void> answer(stream_state& st, response res, bool head_request,
                                const bhttp::fields& trailers = {});
    void end_connection();
};

/// One request stream: what arrived of its request, and the h2_stream the paths answer on.
struct h2_connection::impl::stream_state final : h2_stream {
    stream_state(impl& c, std::int32_t i)
        : conn(c), id(i), wake(c.stream.get_executor(), clock::time_point::max()) {}

    impl& conn; ///< outlives the stream's coroutine (which holds the connection)
    std::int32_t id;
    h2::request_head head;
    bool end_stream = false;
    const config::limits_config* lim = nullptr; ///< the stream's config (its handler's)
    std::string body;                           ///< request body bytes not yet read
    bool body_done = false;
    bhttp::fields trailers;
    bool closed = false;
    bool failed = false;
    bool timed_out = false;
    bool grpc = false; ///< a gRPC call: the proxy's own answers are gRPC statuses
    net::steady_timer wake;

    void notify() { wake.cancel(); }
    /// Waits for notify() or `deadline`; true when the deadline passed.
    net::awaitable<bool> wait(clock::time_point deadline) {
        wake.expires_at(deadline);
        co_await wake.async_wait(use_tuple);
        co_return clock::now() >= deadline;
    }

    net::awaitable<bool> read_body(std::string& out) override {
        for (;;) {
            if (!body.empty()) {
                out.swap(body);
                body.clear();
                if (!closed) {
                    conn.session->consume(id, out.size());
                    conn.kick();
                }
                co_return true;
            }
            if (body_done) {
                co_return false;
            }
            if (closed) {
                failed = true;
                co_return false;
            }
            // (Awaited into a variable: GCC 12 miscompiles a co_await inside && or ?:.)
            const bool late = co_await wait(clock::now() + lim->body_timeout);
            if (late && body.empty() && !body_done && !closed) {
                failed = timed_out = true;
                co_return false;
            }
        }
    }
    bool body_failed() const override { return failed; }
    bool body_timed_out() const override { return timed_out; }
    const bhttp::fields& request_trailers() const override { return trailers; }

    void write_head(const response& res, bool end) override {
        if (closed) {
            return;
        }
        conn.session->submit_response(id, res.result_int(), upstream::h2_fields(res.base()), end);
        conn.kick();
    }
    net::awaitable<bool> write_body(std::string_view piece) override {
        if (closed) {
            co_return false;
        }
        conn.session->push_body(id, piece);
        conn.kick();
        while (!closed && conn.session->queued(id) > send_high_water) {
            // A client that opens no window for idle_timeout is cut (a zero-window stall).
            const bool late = co_await wait(clock::now() + lim->idle_timeout);
            if (late && !closed && conn.session->queued(id) > send_high_water) {
                reset(h2::error_code::cancel);
                co_return false;
            }
        }
        co_return !closed;
    }
    void end_body(const bhttp::fields& t) override {
        if (closed) {
            return;
        }
        conn.session->end_body(id, upstream::h2_fields(t));
        conn.kick();
    }
    void cut() override { reset(h2::error_code::internal_error); }
    void reset(h2::error_code code) {
        if (!closed) {
            conn.session->reset(id, code);
            conn.kick();
        }
    }
};

void h2_connection::impl::on_request(std::int32_t id, h2::request_head&& head, bool end_stream) {
    any_request = true;
    auto st = std::make_shared<stream_state>(*this, id);
    st->head = std::move(head);
    st->end_stream = end_stream;
    st->body_done = end_stream;
    streams.emplace(id, st);
    ++tasks;
    dl.disarm();
    net::co_spawn(stream.get_executor(), serve(shared_from_this(), st),
                  [this, self = shared_from_this()](std::exception_ptr e) {
                      report_exception(e, "HTTP/2 stream",
                                       reg.counter(metrics::family::internal_errors));
                      --tasks;
                      done_wake.cancel();
                      rearm();
                  });
}

void h2_connection::impl::on_data(std::int32_t id, std::span<const char> bytes) {
    if (auto* st = find(id)) {
        st->body.append(bytes.data(), bytes.size());
        st->notify();
    } else {
        session->consume(id, bytes.size()); // a stream already answered: dropped
    }
}

void h2_connection::impl::on_request_end(std::int32_t id, std::vector<h2::field>&& trailers) {
    if (auto* st = find(id)) {
        for (auto& f : trailers) {
            st->trailers.insert(f.name, f.value);
        }
        st->body_done = true;
        st->notify();
    }
}

void h2_connection::impl::on_stream_close(std::int32_t id, h2::error_code) {
    if (auto it = streams.find(id); it != streams.end()) {
        it->second->closed = true;
        it->second->notify();
        streams.erase(it);
    }
    kick(); // a drain may be done now
}

void h2_connection::impl::on_send_room(std::int32_t id) {
    if (auto* st = find(id)) {
        st->notify();
    }
}

net::awaitable<void> h2_connection::impl::read_loop(std::shared_ptr<impl> /*self: kept alive*/) {
    for (;;) {
        if (in.size() > 0) {
            const auto d = in.data();
            const bool ok = session->receive(
                std::span(static_cast<const char*>(d.data()), d.size()), clock::now());
            in.consume(in.size());
            kick();
            if (!ok) {
                break;
            }
        }
        if (ended || !session->wants_read()) {
            break;
        }
        rearm();
        const auto room = std::min<std::size_t>(16 * 1024, in.max_size() - in.size());
        auto [ec, n] = co_await stream.async_read_some(in.prepare(room), use_tuple);
        if (ec) {
            if (dl.fired() && streams.empty() && tasks == 0) {
                // Idle past its deadline: GOAWAY first (RFC 9113 §9.1), whose last stream id
                // tells a client whose request crossed it that it was not processed.
                session->terminate(h2::error_code::no_error);
            }
            break;
        }
        in.commit(n);
    }
    reader_running = false;
    ended = true;
    kick();
    done_wake.cancel();
}

net::awaitable<void> h2_connection::impl::write_loop() {
    for (;;) {
        out.clear();
        for (auto o = session->take_output(); !o.empty(); o = session->take_output()) {
            out.append(o.data(), o.size());
            if (out.size() >= max_gather) {
                break;
            }
        }
        if (!out.empty()) {
            writing = true;
            dl.expires_after(limits().idle_timeout); // a client that reads nothing is cut
            auto [ec, n] = co_await net::async_write(stream, net::buffer(out), use_tuple);
            (void)n;
            writing = false;
            if (ec) {
                break;
            }
            rearm();
            continue;
        }
        if (ended || (!session->wants_read() && !session->wants_write())) {
            break;
        }
        write_wake.expires_at(clock::time_point::max());
        co_await write_wake.async_wait(use_tuple);
    }
}

void h2_connection::impl::end_connection() {
    ended = true;
    for (auto& [id, st] : streams) {
        st->closed = true;
        st->notify();
    }
    streams.clear();
    boost::system::error_code ignored;
    stream.socket().cancel(ignored); // the reader, if it still waits
}

net::awaitable<void> h2_connection::impl::answer(stream_state& st, response res, bool head_request,
                                                 const bhttp::fields& trailers) {
    if (st.grpc) {
        to_grpc_answer(res); // the proxy's own problems as gRPC statuses
    }
    const unsigned status = res.result_int();
    const bool bodiless = status == 204 || status == 304 || status < 200;
    if (st.grpc) {
        // gRPC frames its messages itself; the answer carries no length the upstream did not
        // send (a replay's is the record's, made afresh).
        res.erase(bhttp::field::content_length);
    } else if (!bodiless && !head_request) {
        res.content_length(res.body().size());
    }
    const bool no_body = head_request || bodiless || res.body().empty();
    const bool has_trailers = !head_request && !bodiless && trailers.begin() != trailers.end();
    st.write_head(res, no_body && !has_trailers);
    if (!no_body) {
        const bool sent = co_await st.write_body(res.body());
        if (!sent) {
            co_return;
        }
    } else if (!has_trailers) {
        co_return;
    }
    st.end_body(trailers);
}

net::awaitable<void> h2_connection::impl::serve(std::shared_ptr<impl> /*self: kept alive*/,
                                                std::shared_ptr<stream_state> st) {
    auto h = current; // the stream runs on the config it started on
    reg.counter(metrics::family::client_requests, metrics::protocol::h2).inc();
    st->lim = &h->config().limits;
    request_context rc = ctx;
    rc.received = clock::now();
    if (st->head.too_large) {
        reg.unrouted().counter(metrics::family::requests, metrics::outcome::rejected).inc();
        co_await answer(*st, make_problem(problem_code::header_too_large), false);
        co_return;
    }
    if (st->head.method == "CONNECT") {
        // Neither a tunnel nor WebSocket over HTTP/2 (RFC 8441): refused, cleanly.
        reg.unrouted().counter(metrics::family::requests, metrics::outcome::rejected).inc();
        co_await answer(*st,
                        make_problem(problem_code::bad_request,
                                     "CONNECT is not supported over HTTP/2", {.status = 501}),
                        false);
        co_return;
    }
    auto req = to_request(st->head);
    const bool head_request = req.method() == bhttp::verb::head;
    st->grpc = is_grpc_call(req);
    auto a = h->admit(req, declared_length(req));
    if (a.refusal) {
        reg.unrouted().counter(metrics::family::requests, metrics::outcome::rejected).inc();
        co_await answer(*st, std::move(*a.refusal), head_request);
        co_return;
    }
    if (a.route != nullptr && !h->reads_whole(*a.route, req)) {
        co_await h->async_relay_h2(*st, req, !st->end_stream, *a.route, a.route_index, rc);
        co_return;
    }
    // Answered whole (no route, a guarded method, or an egress route): the body is read whole
    // first, bounded by the route's limit and limits.max_buffered_bytes as on HTTP/1.1.
    auto held = std::make_shared<buffer_reservation>(
        reg.gauge(metrics::family::buffered_bytes).cell(),
        reg.gauge(metrics::family::buffered_bytes_limit).cell());
    std::string piece;
    while (co_await st->read_body(piece)) {
        req.body() += piece;
        if (a.body_limit && req.body().size() > *a.body_limit) {
            st->reset(h2::error_code::cancel); // the rest is not wanted
            co_await answer(*st,
                            read_failure_problem(bhttp::error::body_limit, "request body")
                                .value_or(make_problem(problem_code::request_too_large)),
                            head_request);
            co_return;
        }
        if (!held->try_grow_to(req.body().size())) {
            reg.counter(metrics::family::buffered_refusals).inc();
            co_await answer(*st, make_problem(problem_code::memory_limit, {.retry_after_s = 1}),
                            head_request);
            co_return;
        }
    }
    if (st->body_failed()) {
        if (st->body_timed_out()) {
            reg.counter(metrics::family::client_timeouts, metrics::timeout_phase::body).inc();
            co_await answer(*st, make_problem(problem_code::request_timeout), head_request);
            st->reset(h2::error_code::cancel);
        }
        co_return; // reset by the client: nobody to answer
    }
    std::string scratch;
    beast::flat_buffer unused;
    client_side cs{stream, unused, dl, scratch, draining, false, true};
    auto handled = co_await h->async_handle(req, a.route, a.route_index, rc, cs, held);
    // A stream's answer is always returned whole (its client_side asks for it): never streamed.
    co_await answer(*st, std::move(*handled.res), head_request, handled.trailers);
}

h2_connection::h2_connection(const std::shared_ptr<handler>& current, metrics::registry& reg,
                             const bool& draining, wire::stream& stream,
                             wire::deadline_watch::slot& dl, beast::flat_buffer& in,
                             request_context ctx)
    : impl_(std::make_shared<impl>(current, reg, draining, stream, dl, in, std::move(ctx))) {}

h2_connection::~h2_connection() = default;

net::awaitable<void> h2_connection::run() {
    auto self = impl_;
    auto& m = *impl_;
    const auto& cfg = m.current->config();
    h2::limits l;
    l.max_concurrent_streams = cfg.http2.max_concurrent_streams;
    l.max_header_bytes = cfg.limits.max_header_bytes;
    m.session = std::make_unique<h2::server_session>(m, l, clock::now());
    m.reader_running = true;
    net::co_spawn(m.stream.get_executor(), m.read_loop(self), [self](std::exception_ptr e) {
        report_exception(e, "HTTP/2 reader", self->reg.counter(metrics::family::internal_errors));
    });
    co_await m.write_loop();
    m.end_connection();
    switch (m.session->ended()) {
    case h2::end_reason::protocol_error:
        m.reg.counter(metrics::family::http2_goaways, metrics::goaway_reason::protocol_error).inc();
        break;
    case h2::end_reason::rapid_reset:
        m.reg.counter(metrics::family::http2_goaways, metrics::goaway_reason::rapid_reset).inc();
        break;
    case h2::end_reason::control_flood:
        m.reg.counter(metrics::family::http2_goaways, metrics::goaway_reason::control_flood).inc();
        break;
    case h2::end_reason::header_flood:
        m.reg.counter(metrics::family::http2_goaways, metrics::goaway_reason::header_flood).inc();
        break;
    case h2::end_reason::none:
    case h2::end_reason::peer_closed:
        break;
    }
    while (m.reader_running || m.tasks > 0) {
        m.done_wake.expires_at(clock::time_point::max());
        co_await m.done_wake.async_wait(use_tuple);
    }
}

void h2_connection::on_cancel(net::cancellation_type t) {
    auto& m = *impl_;
    if ((t & net::cancellation_type::terminal) != net::cancellation_type::none) {
        boost::system::error_code ignored;
        m.stream.socket().close(ignored);
        return;
    }
    if (m.session && !m.ended) {
        m.session->shutdown();
        m.kick();
    }
}

} // namespace onceproxy::http
