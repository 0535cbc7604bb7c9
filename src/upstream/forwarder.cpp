#include "onceproxy/upstream/forwarder.hpp"

#include "onceproxy/upstream/h2_upstream.hpp"
#include "upstream/tls_client.hpp"

#include "onceproxy/config/upstream_tls.hpp"
#include "onceproxy/log/log.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/wire/coarse_clock.hpp"
#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_parser.hpp"
#include "onceproxy/wire/message_reader.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <deque>
#include <list>
#include <vector>

namespace onceproxy::upstream {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using clock = std::chrono::steady_clock;

connection::connection(net::any_io_executor ex, wire::deadline_watch& watch)
    : stream(tcp::socket(std::move(ex))), dl(watch, stream.socket()),
      buffer(wire::read_buffer_limit(wire::max_header_section)) {}

connection::~connection() = default;

namespace {

// A pooled connection the upstream closed while it sat idle shows EOF (or an error) to a
// non-blocking peek; unexpected bytes (a stray response) also make it unusable. The idle watch
// (watch_idle) drops such a connection as soon as it happens; the peek covers a readiness not
// yet handled when the connection is taken.
bool looks_alive(connection& c) {
    if (c.buffer.size() != 0) {
        return false;
    }
    char byte = 0;
    const auto n = ::recv(c.stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/// A final status no forwarded request can get: 101 Switching Protocols (the forwarder never asks
/// for an upgrade), or one outside 100-599, which RFC 9110 §15 does not define. The request was
/// sent, so such an answer is unusable (issue 26): passed on, it went unrecorded and every
/// retry of a guarded request executed again.
bool unusable_status(unsigned code) {
    return code == 101 || code < 100 || code > 599;
}

} // namespace

/// How far forwarder::impl::run_call took a call.
enum class call_step {
    done,   ///< `out` holds how it ended
    retry,  ///< a pooled connection turned out closed before a byte was written: take another
    paused, ///< the checkpoint came first: the call's state is as run_call left it
};

struct forwarder::impl {
    /// Shared by the forwarders of successive configs (reloads) while the upstream's settings
    /// stay the same; used from the one worker executor only.
    struct pool : std::enable_shared_from_this<pool> {
        explicit pool(config::upstream_config c)
            : cfg(std::move(c)), tls_stamps(cfg.tls ? config::upstream_tls_stamps(cfg.tls_settings)
                                                    : std::array<config::file_stamp, 3>{}),
              tls(cfg.tls ? std::make_unique<tls_client>(cfg) : nullptr) {}
        const config::upstream_config cfg;
        /// The TLS files as they were when `tls` loaded them (stamped first: a change while
        /// loading only means one more rebuild).
        const std::array<config::file_stamp, 3> tls_stamps;
        /// https://: the TLS context and the session to resume; outlives the connections.
        const std::unique_ptr<tls_client> tls;
        std::vector<std::unique_ptr<connection>> idle;
        std::size_t open = 0; ///< idle + in use (ordinary exchanges; max_connections)
        /// Lent for upgrades and long transfers (max_tunnels), not counted in `open`.
        std::size_t tunnels = 0;
        struct waiter {
            net::steady_timer* timer = nullptr;
            bool listed = true; ///< still in `waiters` (not yet woken by give_back)
        };
        std::list<waiter*> waiters;
        tcp::resolver::results_type endpoints;
        /// protocol h2 or h2c: the multiplexed connections (the fields above stay unused).
        std::unique_ptr<h2_pool> h2;
    };

    /// The pool of `u`, on this worker.
    std::shared_ptr<pool> make_pool(const config::upstream_config& u) {
        auto p = std::make_shared<pool>(u);
        if (u.protocol != config::upstream_protocol::http1) {
            // The pool outlives none of its connections' users but owns h2: a raw pointer.
            p->h2 =
                std::make_unique<h2_pool>(executor, u,
                                          [raw = p.get(), ex = executor, &w = watch](
                                              clock::time_point deadline, forward_status& failure) {
                                              return connect_to(*raw, ex, w, deadline, failure);
                                          });
        }
        return p;
    }

    impl(net::any_io_executor ex, std::shared_ptr<const config::config> c, wire::deadline_watch& w,
         const impl* previous)
        : executor(std::move(ex)), cfg(std::move(c)), watch(w) {
        for (const auto& u : cfg->upstreams) {
            std::shared_ptr<pool> same;
            if (previous != nullptr) {
                for (const auto& p : previous->pools) {
                    if (p->cfg == u) {
                        same = p;
                        break;
                    }
                }
            }
            if (same && u.tls && same->tls_stamps != config::upstream_tls_stamps(u.tls_settings)) {
                // Rotated TLS files: new connections use them once they load; files that do not
                // (yet) load leave the pool in use as it is, and the next forwarder tries again.
                auto rotated = make_pool(u);
                if (rotated->tls->loaded()) {
                    same = std::move(rotated);
                } else {
                    log::warn("upstream",
                              "upstream TLS files changed but do not load; the ones in use stay",
                              {{"upstream", u.name}});
                }
            }
            pools.push_back(same ? std::move(same) : make_pool(u));
        }
    }

    net::any_io_executor executor;
    std::shared_ptr<const config::config> cfg;
    wire::deadline_watch& watch;
    std::vector<std::shared_ptr<pool>> pools; ///< index = upstream index in `cfg`

    /// Writes what is left of `call`'s request and reads its answer, until the answer (in
    /// `out`, as it was made: only what the outcome needs is set), a failure, or `checkpoint`
    /// (a plain connection only; `call` keeps its state).
    net::awaitable<call_step> run_call(paused_forward& call, request& req, forward_result& out,
                                       std::optional<clock::time_point> checkpoint);

    void give_back(pool& p, std::unique_ptr<connection> c, bool reusable) {
        if (c->tunnel) {
            // An upgrade that did not happen: the connection joins the ordinary ones only if an
            // ordinary slot is free.
            --p.tunnels;
            c->tunnel = false;
            if (!reusable || p.open >= p.cfg.max_connections) {
                return;
            }
            ++p.open;
        }
        if (reusable && c->buffer.size() == 0) {
            c->idle_since = wire::coarse_now(); // an idle age needs no precision
            c->dl.disarm();
            watch_idle(p, *c);
            p.idle.push_back(std::move(c));
        } else {
            --p.open;
        }
        wake_one(p); // a slot or a connection is free
    }

    /// Nginx's keep-alive close handler: while a connection sits in the pool, a read readiness
    /// means the upstream closed it or wrote bytes nobody asked for (a stray second answer,
    /// bytes after a 101). Either way it is closed and dropped from the pool at once, so no
    /// later request, safe requests that skip the peek included, reads them as its answer.
    ///
    /// On a plain connection the watch is a one-byte read in the upstream's turn
    /// (async_read_next): after an answer that drained the connection it costs no system call,
    /// where a wait for readiness re-arms the socket's registration (epoll_ctl) every time. A
    /// TLS connection keeps the wait: a cancelled TLS read could leave a record half read.
    static void watch_idle(pool& p, connection& c) {
        if (c.stream.is_tls()) {
            c.stream.socket().async_wait(
                tcp::socket::wait_read,
                [wp = p.weak_from_this(), conn = &c](const boost::system::error_code& ec) {
                    drop_if_idle(wp, conn, ec);
                });
            return;
        }
        c.stream.async_read_next(
            net::buffer(&c.watch_byte, 1),
            [wp = p.weak_from_this(), conn = &c](const boost::system::error_code& ec, std::size_t) {
                drop_if_idle(wp, conn, ec);
            });
    }

    /// The idle watch of `conn` fired: unless it was cancelled (taken from the pool, or
    /// closed), the connection is dropped from the pool if it is still there.
    static void drop_if_idle(const std::weak_ptr<pool>& wp, const connection* conn,
                             const boost::system::error_code& ec) {
        if (ec == net::error::operation_aborted) {
            return;
        }
        const auto sp = wp.lock();
        if (!sp) {
            return;
        }
        auto& idle = sp->idle;
        const auto it = std::find_if(idle.begin(), idle.end(),
                                     [conn](const auto& x) { return x.get() == conn; });
        if (it != idle.end()) {
            idle.erase(it); // closes it
            --sp->open;
            wake_one(*sp);
        }
    }

    /// The most recently pooled connection still fit for use, taken out of the pool with its
    /// watch cancelled; null when none is. Unfit ones are closed on the way.
    std::unique_ptr<connection> take_idle(pool& p, bool verify_idle) {
        while (!p.idle.empty()) {
            auto c = std::move(p.idle.back());
            p.idle.pop_back();
            boost::system::error_code ignored;
            c->stream.socket().cancel(ignored); // the idle watch
            // Bytes left in the buffer (a stray answer) make a connection unusable; the
            // peek for a close is skipped when the caller can recover from one.
            if (wire::coarse_now() - c->idle_since < p.cfg.idle_timeout && c->buffer.size() == 0 &&
                (!verify_idle || looks_alive(*c))) {
                return c;
            }
            --p.open;
        }
        return nullptr;
    }

    /// Wakes the oldest waiter, taking it off the list so two wake-ups reach two waiters.
    static void wake_one(pool& p) {
        if (!p.waiters.empty()) {
            auto* w = p.waiters.front();
            p.waiters.pop_front();
            w->listed = false;
            w->timer->cancel();
        }
    }

    using acquired = lent_connection;

    net::awaitable<acquired> acquire(pool& p, bool verify_idle = true) {
        if (auto c = take_idle(p, verify_idle)) {
            co_return acquired{std::move(c), true, forward_status::ok};
        }
        // Only a connect or a wait needs the deadline. Set from the coarse clock (never earlier
        // than the precise one); the check below stays precise, so no wait ends early.
        const auto deadline = wire::coarse_now() + p.cfg.connect_timeout;
        for (;;) {
            if (p.open < p.cfg.max_connections) {
                ++p.open;
                forward_status failure = forward_status::connect_failed;
                auto c = co_await connect(p, deadline, failure);
                if (!c) {
                    --p.open;
                    wake_one(p);
                    co_return acquired{nullptr, false, failure};
                }
                co_return acquired{std::move(c), false, forward_status::ok};
            }
            if (clock::now() >= deadline) {
                co_return acquired{nullptr, false, forward_status::pool_exhausted};
            }
            net::steady_timer timer(executor, deadline);
            pool::waiter me{&timer};
            auto it = p.waiters.insert(p.waiters.end(), &me);
            co_await timer.async_wait(use_tuple);
            if (me.listed) {
                p.waiters.erase(it);
            }
            if (auto c = take_idle(p, verify_idle)) {
                co_return acquired{std::move(c), true, forward_status::ok};
            }
        }
    }

    /// A connection for an upgrade, counted in `tunnels` (see forwarder::async_acquire): a
    /// pooled one moves over (its ordinary slot frees), else a new one; never a wait.
    net::awaitable<acquired> acquire_tunnel(pool& p) {
        if (p.tunnels >= p.cfg.max_tunnels) {
            co_return acquired{nullptr, false, forward_status::tunnel_limit};
        }
        ++p.tunnels;
        // An upgrade is never sent again: a pooled connection is checked for a close first.
        if (auto c = take_idle(p, true)) {
            --p.open;
            wake_one(p);
            c->tunnel = true;
            co_return acquired{std::move(c), true, forward_status::ok};
        }
        forward_status failure = forward_status::connect_failed;
        auto c = co_await connect(p, wire::coarse_now() + p.cfg.connect_timeout, failure);
        if (!c) {
            --p.tunnels;
            co_return acquired{nullptr, false, failure};
        }
        c->tunnel = true;
        co_return acquired{std::move(c), false, forward_status::ok};
    }

    net::awaitable<std::unique_ptr<connection>> connect(pool& p, clock::time_point deadline,
                                                        forward_status& failure) {
        return connect_to(p, executor, watch, deadline, failure);
    }

    /// A new connection, TLS handshake included for https://; null on failure, with
    /// `failure` set to connect_failed or tls_failed.
    static net::awaitable<std::unique_ptr<connection>>
    connect_to(pool& p, net::any_io_executor executor, wire::deadline_watch& watch,
               clock::time_point deadline, forward_status& failure) {
        if (p.endpoints.empty()) {
            tcp::resolver resolver(executor);
            auto [ec, results] =
                co_await resolver.async_resolve(p.cfg.host, std::to_string(p.cfg.port), use_tuple);
            if (ec) {
                co_return nullptr;
            }
            p.endpoints = std::move(results);
        }
        auto c = std::make_unique<connection>(executor, watch);
        c->dl.expires_at(deadline);
        auto [ec, ep] = co_await net::async_connect(c->stream.socket(), p.endpoints, use_tuple);
        if (ec) {
            p.endpoints = {}; // resolve again next time: the address may have moved
            co_return nullptr;
        }
        c->stream.socket().set_option(tcp::no_delay(true), ec);
        if (p.tls) {
            const auto why = co_await p.tls->handshake(*c);
            if (!why.empty()) {
                failure = forward_status::tls_failed;
                co_return nullptr;
            }
        }
        co_return c;
    }
};

net::awaitable<lent_connection> forwarder::async_acquire(std::size_t upstream_index,
                                                         bool verify_idle, bool tunnel) {
    // No coroutine frame of its own.
    auto& p = *impl_->pools.at(upstream_index);
    return tunnel ? impl_->acquire_tunnel(p) : impl_->acquire(p, verify_idle);
}

void forwarder::release(std::size_t upstream_index, std::unique_ptr<connection> c, bool reusable) {
    impl_->give_back(*impl_->pools.at(upstream_index), std::move(c), reusable);
}

void forwarder::move_to_long_transfers(std::size_t upstream_index, connection& c) {
    auto& p = *impl_->pools.at(upstream_index);
    if (c.tunnel || p.tunnels >= p.cfg.max_tunnels) {
        return;
    }
    c.tunnel = true;
    --p.open;
    ++p.tunnels;
    impl::wake_one(p); // its ordinary slot is free
}

const config::upstream_config& forwarder::upstream(std::size_t upstream_index) const {
    return impl_->pools.at(upstream_index)->cfg;
}

forwarder::forwarder(net::any_io_executor ex, std::shared_ptr<const config::config> cfg,
                     wire::deadline_watch& watch, const forwarder* previous)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(cfg), watch,
                                   previous != nullptr ? previous->impl_.get() : nullptr)) {}

forwarder::~forwarder() = default;

h2_pool* forwarder::h2(std::size_t upstream_index) const {
    return impl_->pools.at(upstream_index)->h2.get();
}

void forwarder::close_idle() {
    for (auto& p : impl_->pools) {
        if (p->h2) {
            p->h2->close_idle();
        }
        p->open -= p->idle.size();
        p->idle.clear();
    }
}

namespace {

/// A result that says only how the call ended.
forward_result ended(forward_status s) {
    forward_result r;
    r.status = s;
    return r;
}

/// What is left to write of a request whose first `written` bytes (head, then body) went out.
std::array<net::const_buffer, 2> unwritten(const std::string& head, const std::string& body,
                                           std::size_t written) {
    if (written < head.size()) {
        return {net::buffer(head.data() + written, head.size() - written), net::buffer(body)};
    }
    const auto in_body = std::min(written - head.size(), body.size());
    return {net::const_buffer(), net::buffer(body.data() + in_body, body.size() - in_body)};
}

/// A new parser for the next answer of `call` (the first, or the final one after an interim).
void start_answer(paused_forward& call) {
    auto& parser = call.parser.emplace();
    parser.header_limit(static_cast<std::uint32_t>(wire::max_header_section));
    parser.trailer_limit(wire::max_header_section);
    parser.body_limit(call.max_response ? boost::optional<std::uint64_t>(*call.max_response)
                                        : boost::none);
    parser.skip(call.head_request);
    // The answer is re-framed (and may be recorded): a coding such as gzip could not be passed
    // on, and dropping it would hand the client coded bytes as plain ones.
    parser.refuse_transfer_codings();
    parser.keep_raw_fields(call.answer_fields);
    if (call.hold) {
        // One byte more than `hold` tells a body that fits from one that does not.
        parser.stream_body(*call.hold + 1);
    }
}

} // namespace

net::awaitable<call_step> forwarder::impl::run_call(paused_forward& call, request& req,
                                                    forward_result& out,
                                                    std::optional<clock::time_point> checkpoint) {
    auto& p = *pools.at(call.upstream_index);
    auto& c = *call.conn;
    // A checkpoint is a deadline that pauses instead of failing: the watch cancels the
    // socket's operation, which loses nothing on a plain connection.
    const bool pausing = checkpoint && *checkpoint < call.deadline && !c.stream.is_tls();
    c.dl.expires_at(pausing ? *checkpoint : call.deadline);
    const auto paused = [&] {
        return pausing && c.dl.fired() && wire::coarse_now() < call.deadline;
    };
    if (!call.parser) {
        if (call.written == 0) {
            wire::serialize_head(req, c.head);
        }
        auto [wec, n] =
            co_await wire::async_write_all(c.stream, unwritten(c.head, req.body(), call.written));
        call.written += n;
        if (wec && paused()) {
            co_return call_step::paused;
        }
        if (wec) {
            const bool timed_out = c.dl.fired(); // read before give_back frees the connection
            const bool refused = !call.reused && tls_refused(c, wec);
            give_back(p, std::move(call.conn), false);
            if (refused) {
                out.status = forward_status::tls_failed;
            } else if (call.written == 0) {
                // Nothing of the request left this process: a pooled connection that turned out
                // closed gets one fresh replacement; a fresh connection failing counts as down.
                if (call.replaceable) {
                    co_return call_step::retry;
                }
                out.status = forward_status::connect_failed;
            } else {
                out.status = timed_out ? forward_status::timeout_after_send
                                       : forward_status::reset_after_send;
            }
            co_return call_step::done;
        }
        start_answer(call);
    }
    for (;;) {
        auto& parser = *call.parser;
        const auto rec = co_await wire::async_read(c.stream, c.buffer, parser,
                                                   wire::read_until::message, /*answer=*/true);
        if (rec == http::error::need_buffer) {
            if (unusable_status(parser.get().result_int())) {
                give_back(p, std::move(call.conn), false);
                out.status = forward_status::bad_response;
                co_return call_step::done;
            }
            // The body outgrew `hold`: the caller reads the rest from the connection.
            c.dl.expires_at(call.deadline); // the rest is read under the call's own deadline
            out.status = forward_status::ok;
            out.raw_fields = call.answer_fields != nullptr;
            auto& m = parser.get();
            out.res.base() = std::move(m.base());
            out.res.body() = std::move(m.body());
            m.body().clear();
            out.rest = std::make_unique<unread_body>(std::move(call.conn), std::move(parser));
            co_return call_step::done;
        }
        if (rec && paused()) {
            co_return call_step::paused;
        }
        if (rec) {
            const bool timed_out = c.dl.fired(); // read before give_back frees the connection
            const bool refused = !call.reused && tls_refused(c, rec);
            give_back(p, std::move(call.conn), false);
            forward_status s = forward_status::reset_after_send;
            if (refused) {
                s = forward_status::tls_failed;
            } else if (timed_out) {
                s = forward_status::timeout_after_send;
            } else if (rec == http::error::body_limit) {
                s = forward_status::response_too_large;
            } else if (rec != http::error::end_of_stream &&
                       rec.category() ==
                           http::make_error_code(http::error::bad_version).category()) {
                s = forward_status::bad_response;
            }
            out.status = s;
            co_return call_step::done;
        }
        const unsigned code = parser.get().result_int();
        if (code == 101) {
            // No upgrade was asked for (Upgrade is hop-by-hop, never forwarded here): what
            // follows on the connection is not HTTP, so it never goes back to the pool.
            give_back(p, std::move(call.conn), false);
            out.status = forward_status::bad_response;
            co_return call_step::done;
        }
        if (code >= 100 && code < 200) {
            start_answer(call); // interim response (RFC 9110 §15.2): the final one follows
            continue;
        }
        if (unusable_status(code)) {
            give_back(p, std::move(call.conn), false);
            out.status = forward_status::bad_response;
            co_return call_step::done;
        }
        const bool reusable = parser.keep_alive() && !parser.need_eof();
        // Trailer fields stay behind in the parser: the client gets the body re-framed with a
        // Content-Length, which carries none (RFC 9112 §7.1.2).
        out.status = forward_status::ok;
        out.raw_fields = call.answer_fields != nullptr;
        out.res = parser.release();
        give_back(p, std::move(call.conn), reusable);
        co_return call_step::done;
    }
}

net::awaitable<forward_result> forwarder::async_forward(
    std::size_t upstream_index, request& req, std::optional<std::size_t> max_response,
    std::optional<std::size_t> hold, std::optional<std::chrono::milliseconds> deadline,
    std::optional<clock::time_point> checkpoint, wire::raw_header_store* answer_fields) {
    auto& p = *impl_->pools.at(upstream_index);
    if (p.h2) {
        co_return co_await p.h2->async_forward(
            req, max_response, wire::coarse_now() + deadline.value_or(p.cfg.timeout));
    }
    for (int attempt = 0;; ++attempt) {
        auto a = co_await impl_->acquire(p);
        if (!a.conn) {
            co_return ended(a.failure);
        }
        paused_forward call;
        call.upstream_index = upstream_index;
        call.conn = std::move(a.conn);
        call.reused = a.reused;
        call.replaceable = a.reused && attempt == 0; // one fresh replacement at most
        call.head_request = req.method() == http::verb::head;
        call.max_response = max_response;
        call.hold = hold;
        call.deadline = wire::coarse_now() + deadline.value_or(p.cfg.timeout); // the whole call
        call.answer_fields = answer_fields;
        forward_result out;
        switch (co_await impl_->run_call(call, req, out, checkpoint)) {
        case call_step::done:
            co_return out;
        case call_step::retry:
            continue;
        case call_step::paused:
            out.paused = std::make_unique<paused_forward>(std::move(call));
            co_return out;
        }
    }
}

net::awaitable<forward_result> forwarder::async_resume(std::unique_ptr<paused_forward> call,
                                                       request& req) {
    call->replaceable = false; // no replacement once paused: a failure now is the call's own
    forward_result out;
    const auto step = co_await impl_->run_call(*call, req, out, std::nullopt);
    if (step != call_step::done) {
        out.status = forward_status::connect_failed; // not reached: no checkpoint, no reuse
    }
    co_return out;
}

bool forwarder::pausable(std::size_t upstream_index) const {
    const auto& p = *impl_->pools.at(upstream_index);
    return !p.h2 && !p.cfg.tls;
}

} // namespace onceproxy::upstream
