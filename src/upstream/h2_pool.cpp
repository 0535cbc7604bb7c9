#include "onceproxy/upstream/h2_upstream.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/h2/client_session.hpp"
#include "onceproxy/log/log.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include <algorithm>
#include <list>
#include <unordered_map>

namespace onceproxy::upstream {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using clock = std::chrono::steady_clock;

namespace {

/// A request's queued body bytes past which send_body waits for the upstream's window.
constexpr std::size_t send_high_water = 64 * 1024;
/// Frames gathered into one write, at most.
constexpr std::size_t max_gather = 256 * 1024;
/// Sends of a request the upstream refused unprocessed (REFUSED_STREAM, GOAWAY), at most.
constexpr int max_refused_attempts = 3;

} // namespace

/// One HTTP/2 connection to the upstream: its session, reader and writer, and its streams.
struct h2_conn : h2::client_events, std::enable_shared_from_this<h2_conn> {
    h2_conn(std::shared_ptr<h2_pool::impl> p, std::unique_ptr<connection> c);

    std::shared_ptr<h2_pool::impl> pool;
    std::unique_ptr<connection> conn;
    h2::client_session session;
    std::unordered_map<std::int32_t, std::shared_ptr<h2_request::state>> streams;
    net::steady_timer write_wake;
    std::string out;
    bool ended = false;  ///< no new streams; the connection is closing
    bool closed = false; ///< end() ran: the socket is closed
    /// The upstream's first bytes arrived: its preface, a SETTINGS frame, so its
    /// MAX_CONCURRENT_STREAMS is known. No stream is opened before (a new connection would
    /// otherwise take up to 100 streams an upstream allowing fewer must refuse).
    bool ready = false;
    clock::time_point idle_since = clock::now();
    clock::time_point last_read = clock::now();

    void kick() { write_wake.cancel(); }
    bool usable() const { return ready && !ended && session.can_open_stream(); }
    void start();
    net::awaitable<void> read_loop(std::shared_ptr<h2_conn> self);
    net::awaitable<void> write_loop(std::shared_ptr<h2_conn> self);
    net::awaitable<void> keepalive(std::shared_ptr<h2_conn> self);
    void end();

    void on_response(std::int32_t id, unsigned status, std::vector<h2::field>&& fields,
                     bool end_stream) override;
    void on_data(std::int32_t id, std::span<const char> bytes) override;
    void on_response_end(std::int32_t id, std::vector<h2::field>&& trailers) override;
    void on_stream_close(std::int32_t id, h2::error_code code, bool refused) override;
    void on_send_room(std::int32_t id) override;
    void on_goaway(std::int32_t, h2::error_code) override { kick(); }
    void on_ping_ack() override {}
};

struct h2_request::state {
    state(std::shared_ptr<h2_conn> c, std::int32_t i)
        : conn(std::move(c)), id(i),
          wake(conn->conn->stream.get_executor(), clock::time_point::max()) {}
    std::shared_ptr<h2_conn> conn;
    std::int32_t id;
    response head;
    bool got_head = false;
    std::string body;
    bool body_done = false;
    bhttp::fields trailers;
    bool closed = false;
    forward_status failure = forward_status::ok;
    net::steady_timer wake;

    void notify() { wake.cancel(); }
    /// Waits for notify() or `deadline`; true when the deadline passed.
    net::awaitable<bool> wait(clock::time_point deadline) {
        wake.expires_at(deadline);
        co_await wake.async_wait(use_tuple);
        co_return clock::now() >= deadline;
    }
    void fail(forward_status why) {
        if (failure == forward_status::ok) {
            failure = why;
        }
        if (!closed) {
            closed = true;
            conn->session.reset(id, h2::error_code::cancel);
            conn->kick();
        }
    }
};

std::vector<h2::field> h2_fields(const bhttp::fields& f, bool drop_host) {
    std::vector<h2::field> out;
    for (const auto& field : f) {
        if (!(drop_host && field.name() == bhttp::field::host)) {
            out.push_back({std::string(field.name_string()), std::string(field.value())});
        }
    }
    return out;
}

struct h2_pool::impl : std::enable_shared_from_this<impl> {
    impl(net::any_io_executor e, const config::upstream_config& c, connector cn)
        : ex(std::move(e)), cfg(c), connect(std::move(cn)), room(ex, clock::time_point::max()) {}
    net::any_io_executor ex;
    config::upstream_config cfg;
    connector connect;
    std::list<std::shared_ptr<h2_conn>> conns;
    std::size_t connecting = 0;
    net::steady_timer room; ///< waiters for a stream slot or a connection

    h2::client_limits limits() const {
        h2::client_limits l;
        return l;
    }
    void notify_room() { room.cancel(); }
    void forget(h2_conn* c) {
        conns.remove_if([c](const auto& p) { return p.get() == c; });
        notify_room();
    }
    h2_conn* with_room() {
        h2_conn* best = nullptr;
        for (auto& c : conns) {
            if (c->usable() &&
                (best == nullptr || c->session.open_streams() < best->session.open_streams())) {
                best = c.get();
            }
        }
        return best;
    }
};

h2_conn::h2_conn(std::shared_ptr<h2_pool::impl> p, std::unique_ptr<connection> c)
    : pool(std::move(p)), conn(std::move(c)), session(*this, pool->limits(), clock::now()),
      write_wake(conn->stream.get_executor(), clock::time_point::max()) {
    conn->dl.disarm();
}

void h2_conn::start() {
    auto self = shared_from_this();
    const auto ex = conn->stream.get_executor();
    net::co_spawn(ex, read_loop(self), net::detached);
    net::co_spawn(ex, write_loop(self), net::detached);
    net::co_spawn(ex, keepalive(self), net::detached);
}

net::awaitable<void> h2_conn::read_loop(std::shared_ptr<h2_conn> /*self: kept alive*/) {
    std::array<char, 16 * 1024> buf{};
    while (!ended) {
        auto [ec, n] = co_await conn->stream.async_read_some(net::buffer(buf), use_tuple);
        if (ec) {
            break;
        }
        last_read = clock::now();
        const bool ok = session.receive(std::span<const char>(buf.data(), n), last_read);
        kick();
        if (!ready) {
            ready = true;
            pool->notify_room();
        }
        if (!ok) {
            break;
        }
    }
    end();
}

net::awaitable<void> h2_conn::write_loop(std::shared_ptr<h2_conn> /*self: kept alive*/) {
    for (;;) {
        out.clear();
        for (auto o = session.take_output(); !o.empty(); o = session.take_output()) {
            out.append(o.data(), o.size());
            if (out.size() >= max_gather) {
                break;
            }
        }
        if (!out.empty()) {
            conn->dl.expires_after(pool->cfg.timeout);
            auto [ec, n] = co_await net::async_write(conn->stream, net::buffer(out), use_tuple);
            (void)n;
            conn->dl.disarm();
            if (ec) {
                break;
            }
            continue;
        }
        if (ended || (!session.wants_read() && !session.wants_write())) {
            break;
        }
        write_wake.expires_at(clock::time_point::max());
        co_await write_wake.async_wait(use_tuple);
    }
    end();
}

/// Idle connections close after idle_timeout; a silent connection with streams waiting is
/// PINGed, and cut when the answer does not come within the same interval.
net::awaitable<void> h2_conn::keepalive(std::shared_ptr<h2_conn> /*self: kept alive*/) {
    const auto interval = std::min<clock::duration>(
        std::max<clock::duration>(pool->cfg.idle_timeout / 2, std::chrono::seconds(1)),
        std::chrono::seconds(30));
    net::steady_timer t(conn->stream.get_executor());
    while (!ended) {
        t.expires_after(std::min<clock::duration>(interval, std::chrono::seconds(1)));
        co_await t.async_wait(use_tuple);
        if (ended) {
            break;
        }
        const auto now = clock::now();
        if (streams.empty()) {
            if (now - idle_since >= pool->cfg.idle_timeout) {
                session.shutdown();
                kick();
                ended = true;
                pool->forget(this);
            }
            continue;
        }
        const auto sent = session.ping_sent();
        const auto ack = session.last_ping_ack();
        const bool waiting = sent && (!ack || *ack < *sent);
        if (waiting && now - *sent >= interval) {
            log::warn("upstream", "HTTP/2 upstream connection did not answer a PING; closed",
                      {{"upstream", pool->cfg.name}});
            session.terminate(h2::error_code::no_error);
            kick();
            boost::system::error_code ignored;
            conn->stream.socket().close(ignored);
            break;
        }
        if (!waiting && now - last_read >= interval) {
            session.ping(now);
            kick();
        }
    }
}

void h2_conn::end() {
    // Once: by the reader (the upstream closed, or the session ended) or the writer (after its
    // last bytes, a GOAWAY of ours included). The socket closes here in every case, so the other
    // loop ends too and a drain's event loop runs out of work.
    const bool first = !closed;
    closed = true;
    ended = true;
    if (first) {
        session.terminate(h2::error_code::no_error); // open streams close (refused when unsent)
        for (auto& [id, st] : streams) {
            if (!st->closed) {
                st->closed = true;
                if (st->failure == forward_status::ok && !st->body_done) {
                    st->failure = forward_status::reset_after_send;
                }
            }
            st->notify();
        }
        streams.clear();
    }
    boost::system::error_code ignored;
    conn->stream.socket().close(ignored);
    write_wake.cancel();
    pool->forget(this);
}

void h2_conn::on_response(std::int32_t id, unsigned status, std::vector<h2::field>&& fields,
                          bool end_stream) {
    auto it = streams.find(id);
    if (it == streams.end()) {
        return;
    }
    auto& st = *it->second;
    st.head.result(status);
    st.head.version(11);
    for (auto& f : fields) {
        st.head.insert(f.name, f.value);
    }
    st.got_head = true;
    st.body_done = end_stream;
    st.notify();
}

void h2_conn::on_data(std::int32_t id, std::span<const char> bytes) {
    if (auto it = streams.find(id); it != streams.end()) {
        it->second->body.append(bytes.data(), bytes.size());
        it->second->notify();
    }
}

void h2_conn::on_response_end(std::int32_t id, std::vector<h2::field>&& trailers) {
    if (auto it = streams.find(id); it != streams.end()) {
        for (auto& f : trailers) {
            it->second->trailers.insert(f.name, f.value);
        }
        it->second->body_done = true;
        it->second->notify();
    }
}

void h2_conn::on_stream_close(std::int32_t id, h2::error_code code, bool refused) {
    if (auto it = streams.find(id); it != streams.end()) {
        auto& st = *it->second;
        st.closed = true;
        if (refused) {
            st.failure = forward_status::connect_failed; // never processed: nothing was sent
        } else if (!st.body_done && st.failure == forward_status::ok) {
            st.failure = code == h2::error_code::protocol_error ? forward_status::bad_response
                                                                : forward_status::reset_after_send;
        }
        st.notify();
        streams.erase(it);
    }
    if (streams.empty()) {
        idle_since = clock::now();
    }
    pool->notify_room();
    kick();
}

void h2_conn::on_send_room(std::int32_t id) {
    if (auto it = streams.find(id); it != streams.end()) {
        it->second->notify();
    }
}

h2_request::h2_request(std::shared_ptr<state> s) : s_(std::move(s)) {}

h2_request::~h2_request() {
    reset();
}

net::awaitable<bool> h2_request::send_body(std::string_view piece, clock::duration timeout) {
    auto& s = *s_;
    if (s.closed) {
        co_return false;
    }
    s.conn->session.push_body(s.id, piece);
    s.conn->kick();
    while (!s.closed && s.conn->session.queued(s.id) > send_high_water) {
        const bool late = co_await s.wait(clock::now() + timeout);
        if (late && !s.closed && s.conn->session.queued(s.id) > send_high_water) {
            s.fail(forward_status::timeout_after_send);
        }
    }
    co_return !s.closed || (s.got_head && s.failure == forward_status::ok);
}

void h2_request::end_body(const bhttp::fields& trailers) {
    auto& s = *s_;
    if (!s.closed) {
        s.conn->session.end_body(s.id, h2_fields(trailers));
        s.conn->kick();
    }
}

net::awaitable<forward_status> h2_request::read_head(response& head, clock::time_point deadline) {
    auto& s = *s_;
    while (!s.got_head) {
        if (s.closed) {
            co_return s.failure == forward_status::ok ? forward_status::reset_after_send
                                                      : s.failure;
        }
        const bool late = co_await s.wait(deadline);
        if (late && !s.got_head && !s.closed) {
            s.fail(forward_status::timeout_after_send);
        }
    }
    head = std::move(s.head);
    co_return forward_status::ok;
}

net::awaitable<bool> h2_request::read_body(std::string& out, clock::duration timeout) {
    auto& s = *s_;
    for (;;) {
        if (!s.body.empty()) {
            out.swap(s.body);
            s.body.clear();
            if (!s.closed || s.conn->streams.contains(s.id)) {
                s.conn->session.consume(s.id, out.size());
                s.conn->kick();
            }
            co_return true;
        }
        if (s.body_done) {
            co_return false;
        }
        if (s.closed) {
            if (s.failure == forward_status::ok) {
                s.failure = forward_status::reset_after_send;
            }
            co_return false;
        }
        const bool late = co_await s.wait(clock::now() + timeout);
        if (late && s.body.empty() && !s.body_done && !s.closed) {
            s.fail(forward_status::timeout_after_send);
        }
    }
}

net::awaitable<bool> h2_request::refused_unprocessed(clock::time_point deadline) {
    auto& s = *s_;
    while (!s.got_head && !s.closed) {
        const bool late = co_await s.wait(deadline);
        if (late) {
            break;
        }
    }
    co_return !s.got_head && s.closed && s.failure == forward_status::connect_failed;
}

forward_status h2_request::failure() const {
    return s_->failure;
}

const bhttp::fields& h2_request::trailers() const {
    return s_->trailers;
}

void h2_request::reset() {
    if (s_ && !s_->closed && !(s_->body_done && s_->got_head)) {
        s_->fail(forward_status::reset_after_send);
    }
}

h2_pool::h2_pool(net::any_io_executor ex, const config::upstream_config& cfg, connector c)
    : impl_(std::make_shared<impl>(std::move(ex), cfg, std::move(c))) {}

h2_pool::~h2_pool() {
    auto conns = impl_->conns; // end() takes each off the list
    for (auto& c : conns) {
        c->session.shutdown();
        c->kick();
        c->ended = true;
        boost::system::error_code ignored;
        c->conn->stream.socket().cancel(ignored);
    }
    impl_->conns.clear();
}

net::awaitable<h2_opened> h2_pool::async_open(const request& head, bool end_stream) {
    auto& p = *impl_;
    auto keep = impl_;
    const auto deadline = clock::now() + p.cfg.connect_timeout;
    for (;;) {
        if (auto* c = p.with_room()) {
            const auto authority = head[bhttp::field::host];
            auto fields = h2_fields(head, true);
            // Trailers are read and passed on (a gRPC server refuses a call without it); the
            // client's own TE went with the hop-by-hop fields.
            if (head[bhttp::field::te] != "trailers") {
                fields.push_back({"te", "trailers"});
            }
            const auto id = c->session.submit_request(
                head.method_string(), p.cfg.tls ? "https" : "http",
                authority.empty() ? std::string_view(p.cfg.host) : std::string_view(authority),
                head.target(), std::move(fields), end_stream);
            if (id) {
                auto st = std::make_shared<h2_request::state>(c->shared_from_this(), *id);
                c->streams.emplace(*id, st);
                c->kick();
                co_return h2_opened{std::make_unique<h2_request>(std::move(st))};
            }
        }
        const bool settling = std::any_of(p.conns.begin(), p.conns.end(),
                                          [](const auto& c) { return !c->ready && !c->ended; });
        if (p.connecting == 0 && !settling && p.conns.size() < p.cfg.max_connections) {
            ++p.connecting;
            auto failure = forward_status::connect_failed;
            auto c = co_await p.connect(deadline, failure);
            --p.connecting;
            if (!c) {
                p.notify_room();
                co_return h2_opened{nullptr, failure};
            }
            auto hc = std::make_shared<h2_conn>(keep, std::move(c));
            p.conns.push_back(hc);
            hc->start();
            p.notify_room();
            continue;
        }
        if (clock::now() >= deadline) {
            co_return h2_opened{nullptr, forward_status::pool_exhausted};
        }
        p.room.expires_at(std::min(deadline, clock::now() + std::chrono::milliseconds(50)));
        co_await p.room.async_wait(use_tuple);
    }
}

net::awaitable<forward_result> h2_pool::async_forward(request& req,
                                                      std::optional<std::size_t> max_response,
                                                      clock::time_point deadline) {
    forward_result r;
    for (int attempt = 0; attempt < max_refused_attempts; ++attempt) {
        const bool has_body = !req.body().empty();
        auto opened = co_await async_open(req, !has_body);
        if (!opened.req) {
            r.status = opened.failure;
            co_return r;
        }
        auto& q = *opened.req;
        if (has_body) {
            const auto budget = deadline - clock::now();
            const bool sent = co_await q.send_body(req.body(), budget);
            if (sent) {
                q.end_body();
            }
        }
        auto st = co_await q.read_head(r.res, deadline);
        if (st == forward_status::connect_failed && attempt + 1 < max_refused_attempts) {
            continue; // refused unprocessed (REFUSED_STREAM, GOAWAY): safe to send again
        }
        if (st != forward_status::ok) {
            r.status = st;
            co_return r;
        }
        std::string piece;
        for (;;) {
            const bool more = co_await q.read_body(piece, deadline - clock::now());
            if (!more) {
                break;
            }
            r.res.body() += piece;
            if (max_response && r.res.body().size() > *max_response) {
                q.reset();
                r.status = forward_status::response_too_large;
                co_return r;
            }
        }
        if (q.failure() != forward_status::ok) {
            r.status = q.failure() == forward_status::connect_failed
                           ? forward_status::reset_after_send
                           : q.failure();
            co_return r;
        }
        r.trailers = q.trailers();
        r.status = forward_status::ok;
        co_return r;
    }
    r.status = forward_status::connect_failed;
    co_return r;
}

void h2_pool::close_idle() {
    auto conns = impl_->conns;
    for (auto& c : conns) {
        if (c->streams.empty()) {
            c->session.shutdown();
            c->kick();
            c->ended = true;
            impl_->forget(c.get());
        }
    }
}

} // namespace onceproxy::upstream
