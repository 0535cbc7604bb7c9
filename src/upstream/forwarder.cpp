#include "onceproxy/upstream/forwarder.hpp"

#include "upstream/tls_client.hpp"

#include "onceproxy/config/upstream_tls.hpp"
#include "onceproxy/log/log.hpp"

#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_parser.hpp"
#include "onceproxy/wire/message_reader.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <sys/socket.h>

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

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

// A pooled connection the upstream closed while it sat idle shows EOF (or an error) to a
// non-blocking peek; unexpected bytes (a stray response) also make it unusable. (A readiness
// wait kept pending on idle connections was measured too: Asio re-arms epoll for it with one
// epoll_ctl per reuse, the same one system call as this peek, plus a cancellation.)
bool looks_alive(connection& c) {
    if (c.buffer.size() != 0) {
        return false;
    }
    char byte = 0;
    const auto n = ::recv(c.sock.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

} // namespace

struct forwarder::impl {
    /// Shared by the forwarders of successive configs (reloads) while the upstream's settings
    /// stay the same; used from the one worker executor only.
    struct pool {
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
        std::size_t open = 0; ///< idle + in use
        struct waiter {
            net::steady_timer* timer = nullptr;
            bool listed = true; ///< still in `waiters` (not yet woken by give_back)
        };
        std::list<waiter*> waiters;
        tcp::resolver::results_type endpoints;
    };

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
                auto rotated = std::make_shared<pool>(u);
                if (rotated->tls->loaded()) {
                    same = std::move(rotated);
                } else {
                    log::warn("upstream",
                              "upstream TLS files changed but do not load; the ones in use stay",
                              {{"upstream", u.name}});
                }
            }
            pools.push_back(same ? std::move(same) : std::make_shared<pool>(u));
        }
    }

    net::any_io_executor executor;
    std::shared_ptr<const config::config> cfg;
    wire::deadline_watch& watch;
    std::vector<std::shared_ptr<pool>> pools; ///< index = upstream index in `cfg`

    void give_back(pool& p, std::unique_ptr<connection> c, bool reusable) {
        if (reusable && c->buffer.size() == 0) {
            c->idle_since = clock::now();
            c->dl.disarm();
            p.idle.push_back(std::move(c));
        } else {
            --p.open;
        }
        wake_one(p); // a slot or a connection is free
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
        const auto deadline = clock::now() + p.cfg.connect_timeout;
        for (;;) {
            while (!p.idle.empty()) {
                auto c = std::move(p.idle.back());
                p.idle.pop_back();
                // Bytes left in the buffer (a stray answer) make a connection unusable; the
                // peek for a close is skipped when the caller can recover from one.
                if (clock::now() - c->idle_since < p.cfg.idle_timeout && c->buffer.size() == 0 &&
                    (!verify_idle || looks_alive(*c))) {
                    co_return acquired{std::move(c), true, forward_status::ok};
                }
                --p.open;
            }
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
        }
    }

    /// A new connection, TLS handshake included for https://; null on failure, with
    /// `failure` set to connect_failed or tls_failed.
    net::awaitable<std::unique_ptr<connection>> connect(pool& p, clock::time_point deadline,
                                                        forward_status& failure) {
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
        auto [ec, ep] = co_await net::async_connect(c->sock, p.endpoints, use_tuple);
        if (ec) {
            p.endpoints = {}; // resolve again next time: the address may have moved
            co_return nullptr;
        }
        c->sock.set_option(tcp::no_delay(true), ec);
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
                                                         bool verify_idle) {
    // No coroutine frame of its own.
    return impl_->acquire(*impl_->pools.at(upstream_index), verify_idle);
}

void forwarder::release(std::size_t upstream_index, std::unique_ptr<connection> c, bool reusable) {
    impl_->give_back(*impl_->pools.at(upstream_index), std::move(c), reusable);
}

const config::upstream_config& forwarder::upstream(std::size_t upstream_index) const {
    return impl_->pools.at(upstream_index)->cfg;
}

forwarder::forwarder(net::any_io_executor ex, std::shared_ptr<const config::config> cfg,
                     wire::deadline_watch& watch, const forwarder* previous)
    : impl_(std::make_unique<impl>(std::move(ex), std::move(cfg), watch,
                                   previous != nullptr ? previous->impl_.get() : nullptr)) {}

forwarder::~forwarder() = default;

void forwarder::close_idle() {
    for (auto& p : impl_->pools) {
        p->open -= p->idle.size();
        p->idle.clear();
    }
}

net::awaitable<forward_result> forwarder::async_forward(std::size_t upstream_index, request& req,
                                                        std::optional<std::size_t> max_response,
                                                        std::optional<std::size_t> hold) {
    auto& p = *impl_->pools.at(upstream_index);
    const bool head = req.method() == http::verb::head;
    for (int attempt = 0;; ++attempt) {
        auto a = co_await impl_->acquire(p);
        if (!a.conn) {
            co_return forward_result{a.failure, {}, nullptr};
        }
        auto& c = *a.conn;
        c.dl.expires_after(p.cfg.timeout); // the whole exchange, write and response
        wire::serialize_head(req, c.head);
        const std::array<net::const_buffer, 2> wire{net::buffer(c.head), net::buffer(req.body())};
        auto [wec, written] = co_await upstream::async_write(c, wire);
        if (wec) {
            const bool timed_out = c.dl.fired(); // read before give_back frees the connection
            const bool refused = !a.reused && tls_refused(c, wec);
            impl_->give_back(p, std::move(a.conn), false);
            if (refused) {
                co_return forward_result{forward_status::tls_failed, {}, nullptr};
            }
            if (written == 0) {
                // Nothing of the request left this process: a pooled connection that turned out
                // closed gets one fresh replacement; a fresh connection failing counts as down.
                if (a.reused && attempt == 0) {
                    continue;
                }
                co_return forward_result{forward_status::connect_failed, {}, nullptr};
            }
            co_return forward_result{timed_out ? forward_status::timeout_after_send
                                               : forward_status::reset_after_send,
                                     {},
                                     nullptr};
        }
        for (;;) {
            wire::response_parser parser;
            parser.header_limit(static_cast<std::uint32_t>(wire::max_header_section));
            parser.trailer_limit(wire::max_header_section);
            parser.body_limit(max_response ? boost::optional<std::uint64_t>(*max_response)
                                           : boost::none);
            parser.skip(head);
            // The answer is re-framed (and may be recorded): a coding such as gzip could not be
            // passed on, and dropping it would hand the client coded bytes as plain ones.
            parser.refuse_transfer_codings();
            if (hold) {
                // One byte more than `hold` tells a body that fits from one that does not.
                parser.stream_body(*hold + 1);
            }
            const auto rec = co_await upstream::async_read(c, parser, wire::read_until::message);
            if (rec == http::error::need_buffer) {
                // The body outgrew `hold`: the caller reads the rest from the connection.
                forward_result out{forward_status::ok, {}, nullptr};
                auto& m = parser.get();
                out.res.base() = std::move(m.base());
                out.res.body() = std::move(m.body());
                m.body().clear();
                out.rest = std::make_unique<unread_body>(std::move(a.conn), std::move(parser));
                co_return out;
            }
            if (rec) {
                const bool timed_out = c.dl.fired(); // read before give_back frees the connection
                const bool refused = !a.reused && tls_refused(c, rec);
                impl_->give_back(p, std::move(a.conn), false);
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
                co_return forward_result{s, {}, nullptr};
            }
            const unsigned code = parser.get().result_int();
            if (code >= 100 && code < 200 && code != 101) {
                continue; // interim response (RFC 9110 §15.2): the final one follows
            }
            const bool reusable = parser.keep_alive() && !parser.need_eof();
            // Trailer fields stay behind in the parser: the client gets the body re-framed with
            // a Content-Length, which carries none (RFC 9112 §7.1.2).
            forward_result out{forward_status::ok, parser.release(), nullptr};
            impl_->give_back(p, std::move(a.conn), reusable);
            co_return out;
        }
    }
}

} // namespace onceproxy::upstream
