// The plain path for a request that came over HTTP/2 (plain_relay::async_relay_h2): its head
// and body go to the route's HTTP/1.1 upstream as they arrive (a body of unknown length
// chunked, its trailers passed on as the HTTP/1.1 path passes them), the answer comes back on
// the stream piece by piece, each piece taken from the upstream only once the client's window
// took the one before (back-pressure both ways, memory bounded per stream).

#include "http/access_log.hpp"
#include "http/body_relay.hpp"
#include "http/exchange_runner.hpp"
#include "http/grpc_answer.hpp"
#include "http/plain_relay.hpp"
#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/upstream/h2_upstream.hpp"
#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_reader.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/field.hpp>

#include <algorithm>

namespace onceproxy::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using clock = std::chrono::steady_clock;

namespace {

using upstream::max_refused_attempts;

/// Request body bytes kept to send again when an HTTP/2 upstream refuses the stream
/// unprocessed; a longer body is not sent again (the refusal is the client's 502).
constexpr std::size_t resend_limit = 64 * 1024;

/// An HTTP/2 stream as the sink of a relayed body.
class stream_sink final : public body_sink {
public:
    explicit stream_sink(h2_stream& s) : s_(s) {}
    net::awaitable<bool> write(std::string_view piece) override { return s_.write_body(piece); }
    net::awaitable<bool> end(const bhttp::fields& trailers) override {
        s_.end_body(trailers);
        co_return true;
    }
    void cut() override { s_.cut(); }

private:
    h2_stream& s_;
};

/// A request's trailers as an HTTP/1.1 upstream gets them (the allowlist of the HTTP/1.1
/// path): only after a chunked body.
std::string request_tail(const bhttp::fields& trailers, std::span<const std::string_view> in_use) {
    return last_chunk(trailers, trailer_side::to_upstream, in_use);
}

} // namespace

struct plain_relay::h2_exchange {
    plain_relay& relay;
    h2_stream& client;
    request& req;
    const config::route_config& route;
    std::size_t route_index;
    const request_context& ctx;
    const config::upstream_config& up;
    std::unique_ptr<upstream::connection> conn;
    access_log_entry log;
    std::string request_id;
    std::string method;
    std::string target;
    /// The request body read so far, kept while it is at most resend_limit bytes: a stream the
    /// upstream refused unprocessed is sent again with it.
    std::string sent_body = {};
    bool body_resendable = true;
    bool body_read = false; ///< the client's body ended (failed or with its trailers)

    void finish(unsigned status) {
        auto& rm = *relay.route_series_[route_index];
        rm.counter(metrics::family::requests, metrics::outcome::passthrough).inc();
        rm.histogram(metrics::family::request_duration).observe(clock::now() - ctx.received);
        if (relay.cfg_->access_log) {
            log.route = route.name;
            log.method = method;
            log.target = target;
            log.status = status;
            log.outcome = metrics::outcome::passthrough;
            log.request_id = request_id;
            if (!write_access_log(log, ctx, req)) {
                relay.reg_.counter(metrics::family::access_log_dropped).inc();
            }
        }
    }

    /// To an HTTP/2 upstream: both bodies stream at once, each way at the pace of the other
    /// side's window (a gRPC stream goes both ways while it lasts).
    net::awaitable<void> relay_to_h2(upstream::h2_pool& pool, bool has_body,
                                     std::span<const std::string_view> in_use) {
        const auto up_start = clock::now();
        auto ex = co_await net::this_coro::executor;
        net::steady_timer pump_done(ex, clock::time_point::max());
        bool pumping = false;
        std::unique_ptr<upstream::h2_request> opened_req;
        response head;
        auto st = upstream::forward_status::connect_failed;
        // A request the upstream refused unprocessed (REFUSED_STREAM, or above the last stream
        // id of its GOAWAY: nginx sends one every 1000 requests) never ran: it goes again on
        // another stream, with the body bytes it was given when they were few enough to keep.
        for (int attempt = 0; attempt < max_refused_attempts; ++attempt) {
            auto opened = co_await pool.async_open(req, !has_body);
            if (!opened.req) {
                co_await fail(upstream_failure(opened.failure, relay.reg_, up.name));
                co_return;
            }
            opened_req = std::move(opened.req);
            if (has_body) {
                pumping = true;
                net::co_spawn(ex, pump_body(*opened_req, in_use), [&](std::exception_ptr) {
                    pumping = false;
                    pump_done.cancel();
                });
            }
            st = co_await opened_req->read_head(head, clock::now() + up.timeout);
            if (st == upstream::forward_status::ok) {
                break;
            }
            opened_req->reset();
            while (pumping) {
                co_await pump_done.async_wait(use_tuple);
            }
            const bool again = st == upstream::forward_status::connect_failed &&
                               (!has_body || body_resendable) && !client.body_failed();
            if (!again) {
                break;
            }
        }
        auto& upq = *opened_req;
        bool ok = st == upstream::forward_status::ok;
        if (!ok) {
            co_await fail(upstream_failure(st, relay.reg_, up.name));
            co_return;
        }
        relay.route_series_[route_index]
            ->histogram(metrics::family::upstream_duration)
            .observe(clock::now() - up_start);
        strip_hop_by_hop(head);
        const unsigned status = head.result_int();
        client.write_head(head, false);
        std::string piece;
        for (;;) {
            const bool more = co_await upq.read_body(piece, up.timeout);
            if (!more) {
                break;
            }
            const bool sent = co_await client.write_body(piece);
            if (!sent) {
                upq.reset();
                ok = false;
                break;
            }
        }
        if (ok && upq.failure() == upstream::forward_status::ok) {
            client.end_body(upq.trailers());
        } else if (ok) {
            relay.reg_
                .counter(metrics::family::upstream_errors, metrics::upstream_error::unavailable)
                .inc();
            client.cut();
        }
        if (pumping) {
            // The answer is complete while the client still sends: the rest is not wanted.
            client.cut();
            upq.reset();
        }
        while (pumping) {
            co_await pump_done.async_wait(use_tuple);
        }
        finish(status);
    }

    /// The request body from the client's stream to the upstream's, then its trailers (those
    /// that may travel to an upstream).
    net::awaitable<void> pump_body(upstream::h2_request& upq,
                                   std::span<const std::string_view> in_use) {
        if (!sent_body.empty()) {
            // Again, on a new stream: what the refused one was given first.
            const bool sent = co_await upq.send_body(sent_body, up.timeout);
            if (!sent) {
                co_return;
            }
        }
        std::string piece;
        while (!body_read) {
            const bool more = co_await client.read_body(piece);
            if (!more) {
                body_read = true;
                break;
            }
            if (body_resendable && sent_body.size() + piece.size() <= resend_limit) {
                sent_body += piece;
            } else if (body_resendable) {
                body_resendable = false;
                sent_body = std::string();
            }
            const bool sent = co_await upq.send_body(piece, up.timeout);
            if (!sent) {
                co_return;
            }
        }
        if (client.body_failed()) {
            upq.reset();
            co_return;
        }
        bhttp::fields allowed;
        for (const auto& f : client.request_trailers()) {
            const auto name = f.name_string();
            if (trailer_may_travel(name, trailer_side::to_upstream) &&
                std::find(in_use.begin(), in_use.end(), name) == in_use.end()) {
                allowed.insert(name, f.value());
            }
        }
        upq.end_body(allowed);
    }

    /// Nothing of an answer went out yet: `res` (a problem) is the answer.
    net::awaitable<void> fail(response res) {
        if (conn) {
            relay.fwd_.release(route.upstream_index, std::move(conn), false);
        }
        if (is_grpc_call(req)) {
            to_grpc_answer(res); // a gRPC client reads statuses, not problem+json
        } else {
            res.prepare_payload();
        }
        client.write_head(res, res.body().empty());
        if (!res.body().empty()) {
            const bool sent = co_await client.write_body(res.body());
            if (sent) {
                client.end_body({});
            }
        }
        finish(res.result_int());
    }
};

net::awaitable<void> plain_relay::async_relay_h2(h2_stream& client, request& req, bool has_body,
                                                 const config::route_config& route,
                                                 std::size_t route_index,
                                                 const request_context& ctx) {
    h2_exchange x{
        *this,   client, req, route, route_index, ctx, fwd_.upstream(route.upstream_index),
        nullptr, {},     {},  {},    {}};
    const auto& lim = cfg_->limits;
    if (cfg_->access_log) {
        x.method = req.method_string();
        x.target = req.target();
        x.request_id = ensure_request_id(req);
    }
    const bool head_request = req.method() == bhttp::verb::head;
    const auto in_use = std::span<const std::string_view>(fields_in_use_[route_index]);
    strip_hop_by_hop(req, in_use);
    add_forwarded(req, ctx.client_ip, ctx.tls ? "https" : "http", cfg_->trusted_proxies);
    req.version(11);
    req.keep_alive(true);
    // A body of unknown length goes chunked; a declared one as declared (the stream's DATA
    // must match it: nghttp2 checks content-length against the DATA it receives).
    const bool chunked = has_body && req.find(bhttp::field::content_length) == req.end();
    if (chunked) {
        req.set(bhttp::field::transfer_encoding, "chunked");
    }

    if (auto* pool = fwd_.h2(route.upstream_index)) {
        co_await x.relay_to_h2(*pool, has_body, in_use);
        co_return;
    }
    const auto up_start = clock::now();
    auto lent = co_await fwd_.async_acquire(route.upstream_index);
    if (!lent.conn) {
        co_await x.fail(upstream_failure(lent.failure, reg_, x.up.name));
        co_return;
    }
    x.conn = std::move(lent.conn);
    auto& conn = *x.conn;
    wire::serialize_head(req, conn.head);
    conn.dl.expires_after(x.up.timeout);
    auto [hec, hn] = co_await net::async_write(conn.stream, net::buffer(conn.head), use_tuple);
    (void)hn;
    if (hec) {
        co_await x.fail(upstream_failure(hn == 0 ? upstream::forward_status::connect_failed
                                                 : upstream::forward_status::reset_after_send,
                                         reg_, x.up.name));
        co_return;
    }
    // The body, each piece written upstream before the next is taken from the stream.
    if (has_body) {
        std::string piece;
        std::uint64_t sent = 0;
        const auto limit = route.limits.max_request_bytes;
        while (co_await client.read_body(piece)) {
            sent += piece.size();
            if (limit && sent > *limit) {
                co_await x.fail(read_failure_problem(bhttp::error::body_limit, "request body")
                                    .value_or(make_problem(problem_code::bad_request)));
                co_return;
            }
            const bool written =
                co_await write_piece(conn.stream, conn.dl, x.up.timeout, piece, chunked);
            if (!written) {
                co_await x.fail(upstream_failure(upstream::forward_status::reset_after_send, reg_));
                co_return;
            }
        }
        if (client.body_failed()) {
            if (client.body_timed_out()) {
                reg_.counter(metrics::family::client_timeouts, metrics::timeout_phase::body).inc();
                co_await x.fail(make_problem(problem_code::request_timeout));
            } else {
                fwd_.release(route.upstream_index, std::move(x.conn), false);
                x.finish(499); // reset by the client: nobody to answer
            }
            co_return;
        }
        if (chunked) {
            const bool ended =
                co_await write_piece(conn.stream, conn.dl, x.up.timeout,
                                     request_tail(client.request_trailers(), in_use), false);
            if (!ended) {
                co_await x.fail(upstream_failure(upstream::forward_status::reset_after_send, reg_));
                co_return;
            }
        }
    }

    // The answer: its head as soon as it is read, then its body piece by piece.
    std::optional<wire::response_parser> rp;
    for (;;) {
        auto& p = rp.emplace();
        p.header_limit(static_cast<std::uint32_t>(wire::max_header_section));
        p.trailer_limit(wire::max_header_section);
        const auto& rl = route.limits.max_response_bytes;
        p.body_limit(rl ? boost::optional<std::uint64_t>(*rl) : boost::none);
        p.skip(head_request);
        p.stream_body(relay_chunk);
        conn.dl.expires_after(x.up.timeout);
        auto ec = co_await wire::async_read(conn.stream, conn.buffer, p, wire::read_until::header,
                                            /*answer=*/true);
        if (ec) {
            co_await x.fail(upstream_failure(read_failure(ec, conn.dl.fired()), reg_, x.up.name));
            co_return;
        }
        const unsigned code = p.get().result_int();
        if (code == 101) {
            co_await x.fail(upstream_failure(upstream::forward_status::bad_response, reg_));
            co_return;
        }
        if (code >= 200) {
            break;
        }
    }
    route_series_[route_index]
        ->histogram(metrics::family::upstream_duration)
        .observe(clock::now() - up_start);
    auto& res = rp->get();
    const unsigned status = res.result_int();
    strip_hop_by_hop(res);
    const bool no_body = head_request || status == 204 || status == 304 || rp->is_done();
    if (!no_body && stage_buffered(*rp, conn.buffer)) {
        co_await x.fail(upstream_failure(upstream::forward_status::bad_response, reg_));
        co_return;
    }
    std::string first = std::move(res.body());
    res.body().clear();
    const bool whole = rp->is_done();
    client.write_head(
        res, no_body || (whole && first.empty() && rp->trailers().begin() == rp->trailers().end()));
    bool ok = true;
    if (!no_body) {
        if (!first.empty()) {
            ok = co_await client.write_body(first);
        }
        if (ok && !whole) {
            stream_sink sink(client);
            std::uint64_t relayed = 0;
            auto failure = upstream::forward_status::ok;
            const auto end = co_await relay_body(
                *rp, {conn, x.up.timeout, &fwd_, route.upstream_index}, sink, relayed, failure);
            ok = end == body_end::complete;
            if (!ok && failure != upstream::forward_status::ok) {
                reg_.counter(metrics::family::upstream_errors, metrics::upstream_error::unavailable)
                    .inc();
            }
        } else if (ok && (!first.empty() || rp->trailers().begin() != rp->trailers().end())) {
            client.end_body(rp->trailers());
        }
    }
    if (!ok) {
        client.cut();
    }
    fwd_.release(route.upstream_index, std::move(x.conn),
                 ok && rp->keep_alive() && !rp->need_eof());
    x.finish(status);
    (void)lim;
}

} // namespace onceproxy::http
