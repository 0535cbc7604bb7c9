#include "http/plain_relay.hpp"

#include "http/access_log.hpp"
#include "http/body_pace.hpp"
#include "http/exchange_runner.hpp"
#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/http/raw_response_head.hpp"
#include "onceproxy/wire/coarse_clock.hpp"
#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_reader.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <optional>
#include <span>
#include <tuple>

namespace onceproxy::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using clock = std::chrono::steady_clock;

namespace {

/// While a body streams in, the client's read buffer may grow to `room` so each read takes a
/// relay piece; its header bound (max_size) is restored when the body is done.
class body_read_room {
public:
    body_read_room(beast::flat_buffer& b, std::size_t room) : b_(b), bound_(b.max_size()) {
        b_.max_size(std::max(bound_, room));
        b_.reserve(std::max(bound_, room));
    }
    ~body_read_room() { b_.max_size(bound_); }
    body_read_room(const body_read_room&) = delete;
    body_read_room& operator=(const body_read_room&) = delete;

private:
    beast::flat_buffer& b_;
    std::size_t bound_;
};

/// RFC 9110 §7.8: the client asks to switch protocols (`Connection: upgrade` + `Upgrade`).
/// Never to h2c (RFC 9113 §3.1 deprecates that upgrade): such a request is served as HTTP/1.1
/// with its Upgrade stripped, so a client cannot open an HTTP/2 tunnel to the upstream that
/// would carry further requests past the routes ("h2c smuggling").
bool wants_upgrade(const request& req) {
    const auto upgrade = req.find(bhttp::field::upgrade);
    if (upgrade == req.end()) {
        return false;
    }
    for (auto it = upgrade; it != req.end() && it->name() == bhttp::field::upgrade; ++it) {
        for (auto token : bhttp::token_list{it->value()}) {
            if (beast::iequals(token, "h2c")) {
                return false;
            }
        }
    }
    for (auto it = req.find(bhttp::field::connection);
         it != req.end() && it->name() == bhttp::field::connection; ++it) {
        for (auto token : bhttp::token_list{it->value()}) {
            if (beast::iequals(token, "upgrade")) {
                return true;
            }
        }
    }
    return false;
}

/// Copies `from` to `to` (the client and the upstream, each plain or TLS) until either fails
/// or stays idle past its deadline.
net::awaitable<void> pump(wire::stream& from, wire::deadline_watch::slot& from_dl, wire::stream& to,
                          wire::deadline_watch::slot& to_dl, clock::duration idle) {
    std::array<char, 16 * 1024> buf{};
    for (;;) {
        from_dl.expires_after(idle);
        auto [rec, n] = co_await from.async_read_some(net::buffer(buf), use_tuple);
        if (rec) {
            break;
        }
        to_dl.expires_after(idle);
        auto [wec, wn] = co_await net::async_write(to, net::const_buffer(buf.data(), n), use_tuple);
        (void)wn;
        if (wec) {
            break;
        }
    }
    // Closed together: whichever side ends, the other direction ends too.
    boost::system::error_code ignored;
    from.socket().shutdown(tcp::socket::shutdown_both, ignored);
    to.socket().shutdown(tcp::socket::shutdown_both, ignored);
    from.socket().cancel(ignored);
    to.socket().cancel(ignored);
}

/// A place among a route's open upgrades (limits.max_tunnels), held until the exchange ends.
class tunnel_place {
public:
    tunnel_place() = default;
    tunnel_place(const tunnel_place&) = delete;
    tunnel_place& operator=(const tunnel_place&) = delete;
    ~tunnel_place() {
        if (open_ != nullptr) {
            open_->fetch_sub(1, std::memory_order_relaxed);
        }
    }
    /// Takes a place if fewer than `max` are taken (`open` counts them, all workers).
    bool take(std::atomic<std::int64_t>& open, std::size_t max) {
        if (open.fetch_add(1, std::memory_order_relaxed) >= static_cast<std::int64_t>(max)) {
            open.fetch_sub(1, std::memory_order_relaxed);
            return false;
        }
        open_ = &open;
        return true;
    }

private:
    std::atomic<std::int64_t>* open_ = nullptr;
};

} // namespace

/// One streamed request: the client side, the lent upstream connection and what is known so far.
struct plain_relay::exchange {
    exchange(plain_relay& r, client_side c, wire::request_parser& p, const config::route_config& rt,
             std::size_t ri, const request_context& cx)
        : relay(r), client(c), parser(p), route(rt), route_index(ri), ctx(cx),
          up(r.fwd_.upstream(rt.upstream_index)) {}

    plain_relay& relay;
    client_side client;
    wire::request_parser& parser;
    const config::route_config& route;
    std::size_t route_index;
    const request_context& ctx;
    const config::upstream_config& up;
    std::unique_ptr<upstream::connection> conn;
    access_log_entry log;
    std::string request_id;
    bool head_request = false;
    bool upgrade = false;
    bool client_keep_alive = false;
    bool expect_continue = false;
    unsigned client_version = 11;
    bool response_started = false; ///< bytes of the answer reached the client
    bool client_gone = false;      ///< the client closed mid-request: nobody to answer
    /// The upstream stopped taking the body: it may have answered early (413, 401, ...).
    bool upstream_stopped_reading = false;
    bool body_done = false; ///< the whole request body left with the head
    /// The request may go once more if its reused connection turns out closed (send_again).
    bool resend_ok = false;
    bool conn_reused = false;       ///< `conn` came from the idle pool
    std::string tail;               ///< the end of a chunked body written with a head
    std::string transfer_coding;    ///< the Transfer-Encoding of a re-chunked answer
    std::optional<gather> outgoing; ///< the buffers of the head write in flight

    std::span<const std::string_view> in_use() const { return relay.fields_in_use_[route_index]; }

    /// Before anything is sent: the route's body limit, streaming mode, and the body bytes that
    /// arrived with the head staged (an answer when they already break the limit or the framing).
    std::optional<response> stage_request() {
        parser.stream_body(relay_chunk);
        if (expect_continue) {
            return std::nullopt; // the client waits for 100 Continue before sending its body
        }
        if (auto ec = stage_buffered(parser, client.buffer)) {
            return read_failure_problem(ec, "request body")
                .value_or(make_problem(problem_code::bad_request, "malformed request body"));
        }
        return std::nullopt;
    }

    const config::limits_config& limits() const { return relay.cfg_->limits; }

    /// Ends the exchange with `res` (a problem) when nothing of an answer was sent yet. The
    /// client connection stays usable only if its request was read whole.
    net::awaitable<bool> fail(response res) {
        if (conn) {
            relay.fwd_.release(route.upstream_index, std::move(conn), false);
        }
        if (response_started || client_gone) {
            finish(499); // too late or nobody to answer: cutting the connection is the answer
            co_return false;
        }
        const bool keep = client_keep_alive && parser.is_done() && !client.draining && !client.last;
        res.keep_alive(keep);
        client.dl.expires_after(limits().idle_timeout);
        wire::serialize_head(res, client.scratch);
        const std::array<net::const_buffer, 2> wire{net::buffer(client.scratch),
                                                    net::buffer(res.body())};
        auto [ec, n] = co_await wire::async_write_all(client.sock, wire);
        (void)n;
        finish(res.result_int());
        co_return keep && !ec;
    }

    void finish(unsigned status) {
        auto& rm = *relay.route_series_[route_index];
        rm.counter(metrics::family::requests, metrics::outcome::passthrough).inc();
        rm.histogram(metrics::family::request_duration).observe(clock::now() - ctx.received);
        if (relay.cfg_->access_log) {
            log.status = status;
            log.outcome = metrics::outcome::passthrough;
            log.request_id = request_id;
            if (!write_access_log(log, ctx, parser.get())) {
                relay.reg_.counter(metrics::family::access_log_dropped).inc();
            }
        }
    }

    /// The request head as the upstream gets it.
    void rewrite_head() {
        auto& req = parser.get();
        head_request = req.method() == bhttp::verb::head;
        client_version = req.version();
        client_keep_alive = req.keep_alive();
        upgrade = wants_upgrade(req);
        expect_continue = client_version >= 11 && !parser.is_done() &&
                          beast::iequals(first_value(req, bhttp::field::expect), "100-continue");
        const std::string upgrade_to(upgrade ? first_value(req, bhttp::field::upgrade) : "");
        if (relay.cfg_->access_log) {
            request_id = ensure_request_id(req);
        }
        strip_hop_by_hop(req, relay.fields_in_use_[route_index]);
        add_forwarded(req, ctx.client_ip, ctx.tls ? "https" : "http", relay.cfg_->trusted_proxies);
        // The proxy itself answers 100 Continue (below), once the upstream is connected.
        req.erase(bhttp::field::expect);
        req.version(11);
        if (parser.chunked()) {
            req.set(bhttp::field::transfer_encoding, "chunked");
        }
        if (upgrade) {
            req.set(bhttp::field::connection, "upgrade");
            req.set(bhttp::field::upgrade, upgrade_to);
        }
    }

    /// RFC 9112 §9.3.1: a request with a safe method (RFC 9110 §9.2.1) whose connection
    /// closed before any answer may be sent again. Only a request that is at hand whole: no
    /// body still to stream, no 100 Continue to give, nothing to tunnel.
    bool may_send_again() const {
        const auto m = parser.get().method();
        const bool safe = m == bhttp::verb::get || m == bhttp::verb::head ||
                          m == bhttp::verb::options || m == bhttp::verb::trace;
        return safe && parser.is_done() && !parser.chunked() && !expect_continue && !upgrade;
    }

    /// The answer head could not be read because `conn`, taken from the idle pool unchecked,
    /// was closed by the upstream before it answered anything (its keep-alive timeout ran out
    /// as the request left): the request may go again, once.
    bool stale_connection(upstream::forward_status failed, const wire::response_parser& rp) const {
        return resend_ok && conn_reused && failed == upstream::forward_status::reset_after_send &&
               !rp.got_some() && conn->buffer.size() == 0;
    }

    /// Sends the request once more, on a pooled connection checked for a close or a new one.
    net::awaitable<std::optional<upstream::forward_status>> send_again() {
        relay.fwd_.release(route.upstream_index, std::move(conn), false);
        resend_ok = false;
        co_return co_await send_head();
    }

    /// Connects (or reuses) and writes the head. A pooled connection found closed before any
    /// byte left gets one fresh replacement; nothing of the body has been read yet. A request
    /// that may be sent again takes a pooled connection without the check for a close (a
    /// system call per request): a closed one shows when the answer is read (send_again).
    net::awaitable<std::optional<upstream::forward_status>> send_head() {
        for (int attempt = 0;; ++attempt) {
            // An upgrade counts against the upstream's max_tunnels, apart from the slots of
            // ordinary requests: a tunnel may hold its connection for hours.
            auto lent =
                co_await relay.fwd_.async_acquire(route.upstream_index, !resend_ok, upgrade);
            if (!lent.conn) {
                co_return lent.failure;
            }
            conn = std::move(lent.conn);
            conn_reused = lent.reused;
            auto [ec, written] = co_await write_head_and_staged_body();
            if (!ec) {
                if (!resend_ok) {
                    parser.get().body().clear(); // kept for send_again otherwise
                }
                body_done = !tail.empty();
                co_return std::nullopt;
            }
            const bool timed_out = conn->dl.fired();
            relay.fwd_.release(route.upstream_index, std::move(conn), false);
            if (written == 0) {
                if (lent.reused && attempt == 0) {
                    continue;
                }
                co_return upstream::forward_status::connect_failed;
            }
            co_return timed_out ? upstream::forward_status::timeout_after_send
                                : upstream::forward_status::reset_after_send;
        }
    }

    /// The request head and the body bytes that came with it, in one write to `conn`. (Not a
    /// coroutine: the buffers live in the exchange, and the write is awaited by the caller.)
    net::awaitable<std::tuple<boost::system::error_code, std::size_t>>
    write_head_and_staged_body() {
        wire::serialize_head(parser.get(), conn->head);
        const auto& staged = parser.get().body();
        const bool chunked = parser.chunked();
        tail = chunked && parser.is_done() && !staged.empty()
                   ? last_chunk(parser.trailers(), trailer_side::to_upstream, in_use())
                   : std::string();
        outgoing.emplace(conn->head, staged, chunked, tail);
        conn->dl.expires_after(up.timeout);
        return wire::async_write_all(conn->stream, outgoing->buffers());
    }

    /// True when send_body has anything to do: a 100 Continue to give, or body bytes (or the
    /// end of a chunked body) still to send.
    bool body_to_send() const {
        return expect_continue || (!body_done && (!parser.is_done() || parser.chunked()));
    }

    /// Streams the request body: each read's bytes are written upstream before the next read,
    /// so a slow upstream slows the client down and nothing accumulates here.
    net::awaitable<std::optional<response>> send_body() {
        if (expect_continue) {
            // The upstream is connected and has the head: tell the client to send the body.
            static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
            if (!co_await write_piece(client.sock, client.dl, limits().idle_timeout, cont, false)) {
                co_return make_problem(problem_code::bad_request, "client went away");
            }
        }
        if (body_done) {
            co_return std::nullopt;
        }
        const bool chunked = parser.chunked();
        auto& body = parser.get().body();
        // Beast reads at most the buffer's free capacity (512 bytes at least): without room, a
        // large body would arrive a kilobyte per read. The header bound comes back afterwards.
        const body_read_room room(client.buffer, relay_chunk);
        const body_pace pace(wire::coarse_now(), limits().body_timeout, limits().min_body_rate);
        std::uint64_t received = 0;
        long_transfer_watch long_transfer(&relay.fwd_, route.upstream_index);
        while (!parser.is_done()) {
            client.dl.expires_after(limits().body_timeout);
            auto ec = co_await wire::async_read(client.sock, client.buffer, parser,
                                                wire::read_until::some);
            received += body.size();
            if (client.dl.fired() || (!ec && !pace.on_progress(received, wire::coarse_now()))) {
                relay.reg_.counter(metrics::family::client_timeouts, metrics::timeout_phase::body)
                    .inc();
                co_return make_problem(problem_code::request_timeout);
            }
            if (ec && ec != bhttp::error::need_buffer) {
                if (auto problem = read_failure_problem(ec, "request body")) {
                    co_return problem;
                }
                client_gone = true;
                co_return make_problem(problem_code::bad_request, "the client went away");
            }
            if (!body.empty()) {
                if (!co_await write_piece(conn->stream, conn->dl, up.timeout, body, chunked)) {
                    co_return upstream_stopped();
                }
                body.clear();
            }
            long_transfer.on_piece(*conn);
        }
        if (chunked) {
            const auto end = last_chunk(parser.trailers(), trailer_side::to_upstream, in_use());
            if (!co_await write_piece(conn->stream, conn->dl, up.timeout, end, false)) {
                co_return upstream_stopped();
            }
        }
        co_return std::nullopt;
    }

    /// The upstream stopped taking the request body (it may have answered early).
    response upstream_stopped() {
        upstream_stopped_reading = true;
        return upstream_failure(upstream::forward_status::reset_after_send, relay.reg_);
    }

    /// 101 Switching Protocols: the answer head goes to the client, then both connections
    /// become one byte tunnel until either side closes or stays idle past idle_timeout.
    net::awaitable<bool> tunnel(wire::response_parser& rp) {
        const auto& raw = conn->answer_fields;
        const std::array<added_field, 2> added{
            {{"Connection", "upgrade"}, {"Upgrade", raw.value_of(bhttp::field::upgrade)}}};
        serialize_raw_response_head(rp.get().version(), 101, raw, added, client.scratch);
        client.dl.expires_after(limits().idle_timeout);
        response_started = true;
        auto [ec, n] =
            co_await net::async_write(client.sock, net::buffer(client.scratch), use_tuple);
        (void)n;
        finish(101);
        if (ec) {
            relay.fwd_.release(route.upstream_index, std::move(conn), false);
            co_return false;
        }
        auto& reg = relay.reg_;
        reg.counter(metrics::family::tunnels_total).inc();
        reg.gauge(metrics::family::tunnels_open).inc();
        if (co_await flush_early_bytes()) {
            co_await pump_both_ways();
        }
        reg.gauge(metrics::family::tunnels_open).dec();
        relay.fwd_.release(route.upstream_index, std::move(conn), false);
        co_return false;
    }

    /// Bytes either side sent early (after its head) go first. False when a write failed.
    net::awaitable<bool> flush_early_bytes() {
        if (client.buffer.size() > 0) {
            conn->dl.expires_after(limits().idle_timeout);
            auto [wec, wn] =
                co_await net::async_write(conn->stream, client.buffer.data(), use_tuple);
            client.buffer.consume(wn);
            if (wec) {
                co_return false;
            }
        }
        if (conn->buffer.size() > 0) {
            client.dl.expires_after(limits().idle_timeout);
            auto [wec, wn] = co_await net::async_write(client.sock, conn->buffer.data(), use_tuple);
            conn->buffer.consume(wn);
            if (wec) {
                co_return false;
            }
        }
        co_return true;
    }

    /// The tunnel proper: one pump per direction; ends when both have.
    net::awaitable<void> pump_both_ways() {
        const auto idle = limits().idle_timeout;
        auto ex = co_await net::this_coro::executor;
        net::steady_timer other_done(ex, clock::time_point::max());
        bool other_running = true;
        net::co_spawn(ex, pump(client.sock, client.dl, conn->stream, conn->dl, idle),
                      [&](std::exception_ptr) {
                          other_running = false;
                          other_done.cancel();
                      });
        co_await pump(conn->stream, conn->dl, client.sock, client.dl, idle);
        while (other_running) {
            co_await other_done.async_wait(use_tuple);
        }
    }

    /// Reads the upstream's answer head (interim 1xx answers other than 101 are dropped: the
    /// proxy answered 100 Continue itself).
    net::awaitable<std::optional<upstream::forward_status>>
    read_response_head(std::optional<wire::response_parser>& parser_slot) {
        for (;;) {
            auto& rp = parser_slot.emplace();
            // The head is passed on, not looked up: its fields skip Beast's `fields`.
            rp.keep_raw_fields(&conn->answer_fields);
            rp.header_limit(static_cast<std::uint32_t>(wire::max_header_section));
            rp.trailer_limit(wire::max_header_section);
            const auto& lim = route.limits.max_response_bytes;
            rp.body_limit(lim ? boost::optional<std::uint64_t>(*lim) : boost::none);
            rp.skip(head_request);
            rp.stream_body(relay_chunk);
            conn->dl.expires_after(up.timeout);
            auto ec =
                co_await wire::async_read(conn->stream, conn->buffer, rp, wire::read_until::header,
                                          /*answer=*/true);
            if (ec) {
                if (!conn_reused && upstream::tls_refused(*conn, ec)) {
                    co_return upstream::forward_status::tls_failed;
                }
                if (conn->dl.fired()) {
                    co_return upstream::forward_status::timeout_after_send;
                }
                if (ec != bhttp::error::end_of_stream &&
                    ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category()) {
                    co_return upstream::forward_status::bad_response;
                }
                co_return upstream::forward_status::reset_after_send;
            }
            const unsigned code = rp.get().result_int();
            if (code >= 200 || code == 101) {
                co_return std::nullopt;
            }
        }
    }

    /// The answer head as the client gets it, written into client.scratch from the fields the
    /// upstream sent, and how its body travels.
    response_framing rewrite_response_head(const wire::response_parser& rp) {
        const auto& raw = conn->answer_fields;
        const unsigned code = rp.get().result_int();
        const bool length_known = !rp.chunked() && rp.content_length().has_value();
        const auto f = frame_response(code, head_request, length_known, client_version,
                                      client_keep_alive && !client.draining && !client.last);
        std::array<added_field, 3> added{};
        std::size_t n_added = 0;
        if (f.rechunk) {
            // The upstream's own codings (gzip, ...) stay ahead of the proxy's chunked.
            transfer_coding = transfer_codings(raw);
            transfer_coding.append(transfer_coding.empty() ? "" : ", ").append("chunked");
            added[n_added++] = {"Transfer-Encoding", transfer_coding};
            // Only a re-chunked body carries trailers on to the client.
            if (const auto names = raw.value_of(bhttp::field::trailer); !names.empty()) {
                added[n_added++] = {"Trailer", names};
            }
        }
        // What Beast's keep_alive() does to an HTTP/1.1 head whose Connection is stripped:
        // nothing to say for keep-alive, "close" otherwise.
        if (!f.keep) {
            added[n_added++] = {"Connection", "close"};
        }
        serialize_raw_response_head(11, code, raw, std::span(added.data(), n_added),
                                    client.scratch);
        return f;
    }

    /// Streams the answer: the head as soon as it is read, then each piece of body as it
    /// arrives (SSE and long polling see their events at once).
    net::awaitable<bool> relay_response(wire::response_parser& rp) {
        const unsigned status = rp.get().result_int();
        if (client_version < 11 && !head_request && rp.get().result_int() >= 200 &&
            !transfer_codings(conn->answer_fields).empty()) {
            // An HTTP/1.0 client knows no Transfer-Encoding (RFC 9112 §6.1): a coded body
            // could only reach it as if it were plain.
            co_return co_await fail(
                upstream_failure(upstream::forward_status::bad_response, relay.reg_));
        }
        const auto f = rewrite_response_head(rp);
        // The body bytes that came with the head go out with it (one write for a small answer).
        if (!f.no_body && stage_buffered(rp, conn->buffer)) {
            co_return co_await fail(
                upstream_failure(upstream::forward_status::bad_response, relay.reg_));
        }
        auto [ec, n] = co_await write_response_head(rp, f.rechunk);
        (void)n;
        rp.get().body().clear();
        if (ec) {
            co_return co_await abort_response(status);
        }
        if (!rp.is_done() && !co_await stream_response_body(rp, f.rechunk)) {
            co_return co_await abort_response(status);
        }
        relay.fwd_.release(route.upstream_index, std::move(conn),
                           rp.keep_alive() && !rp.need_eof());
        finish(status);
        co_return f.keep;
    }

    /// The answer head (in client.scratch, rewrite_response_head), the body bytes at hand and
    /// (for a whole chunked body) its end, in one write to the client (not a coroutine: the
    /// caller awaits the write).
    net::awaitable<std::tuple<boost::system::error_code, std::size_t>>
    write_response_head(wire::response_parser& rp, bool rechunk) {
        tail = rechunk && rp.is_done() ? last_chunk(rp.trailers(), trailer_side::to_client)
                                       : std::string();
        response_started = true;
        outgoing.emplace(client.scratch, rp.get().body(), rechunk, tail);
        client.dl.expires_after(limits().idle_timeout);
        return wire::async_write_all(client.sock, outgoing->buffers());
    }

    /// The rest of the answer's body, piece by piece, then its end when rechunked. False when
    /// either side failed.
    net::awaitable<bool> stream_response_body(wire::response_parser& rp, bool rechunk) {
        std::uint64_t relayed = 0;
        auto failure = upstream::forward_status::ok;
        connection_sink to(client.sock, client.dl, limits().idle_timeout, rechunk);
        const auto end = co_await relay_body(
            rp, {*conn, up.timeout, &relay.fwd_, route.upstream_index}, to, relayed, failure);
        co_return end == body_end::complete;
    }

    /// The answer broke off after its head reached the client: close both connections.
    net::awaitable<bool> abort_response(unsigned status) {
        client.sock.mark_cut(); // no close_notify: the close must not read as the body's end
        relay.reg_.counter(metrics::family::upstream_errors, metrics::upstream_error::unavailable)
            .inc();
        relay.fwd_.release(route.upstream_index, std::move(conn), false);
        finish(status);
        co_return false;
    }

    /// The upstream refused the rest of the body: it answers first and closes (RFC 9112
    /// §9.6). Its answer, if there is one, is passed on; the rest of the client's body is not
    /// read, so the client connection closes after the answer.
    net::awaitable<bool> answer_early(response failed) {
        client_keep_alive = false;
        std::optional<wire::response_parser> early;
        if (co_await read_response_head(early)) {
            co_return co_await fail(std::move(failed));
        }
        co_return co_await relay_response(*early);
    }
};

plain_relay::plain_relay(std::shared_ptr<const config::config> cfg, upstream::forwarder& fwd,
                         metrics::registry& reg,
                         const std::vector<std::vector<std::string_view>>& fields_in_use,
                         const std::vector<metrics::route_metrics*>& route_series)
    : cfg_(std::move(cfg)), fwd_(fwd), reg_(reg), fields_in_use_(fields_in_use),
      route_series_(route_series) {}

net::awaitable<bool> plain_relay::async_relay(client_side client, wire::request_parser& parser,
                                              const config::route_config& route,
                                              std::size_t route_index, const request_context& ctx) {
    exchange x(*this, client, parser, route, route_index, ctx);
    // The access log names the request as received (the head is rewritten below).
    std::string method;
    std::string target;
    if (cfg_->access_log) {
        method = parser.get().method_string();
        target = parser.get().target();
        x.log.route = route.name;
        x.log.method = method;
        x.log.target = target;
    }
    x.rewrite_head();
    if (auto refused = x.stage_request()) {
        co_return co_await x.fail(std::move(*refused));
    }
    tunnel_place place;
    if (x.upgrade && route.limits.max_tunnels &&
        !place.take(route_series_[route_index]->tunnels_open, *route.limits.max_tunnels)) {
        reg_.counter(metrics::family::tunnels_refused).inc();
        co_return co_await x.fail(make_problem(
            problem_code::upstream_tunnel_limit,
            "tunnel limit of route '" + route.name +
                "' reached: its limits.max_tunnels upgraded connections are open; retry later",
            {.retry_after_s = 1}));
    }
    x.resend_ok = x.may_send_again();
    const auto up_start = clock::now();
    if (auto failed = co_await x.send_head()) {
        co_return co_await x.fail(upstream_failure(*failed, reg_, x.up.name));
    }
    if (x.body_to_send()) {
        if (auto failed = co_await x.send_body()) {
            if (!x.upstream_stopped_reading) {
                co_return co_await x.fail(std::move(*failed));
            }
            co_return co_await x.answer_early(std::move(*failed));
        }
    }
    // The request went out whole: the answer, streamed or tunnelled.
    std::optional<wire::response_parser> rp;
    auto failed = co_await x.read_response_head(rp);
    if (failed && x.stale_connection(*failed, *rp)) {
        reg_.counter(metrics::family::upstream_resends).inc();
        failed = co_await x.send_again();
        if (!failed) {
            failed = co_await x.read_response_head(rp);
        }
    }
    if (failed) {
        co_return co_await x.fail(upstream_failure(*failed, reg_, x.up.name));
    }
    route_series_[route_index]
        ->histogram(metrics::family::upstream_duration)
        .observe(clock::now() - up_start);
    if (rp->get().result_int() == 101) {
        if (!x.upgrade) {
            co_return co_await x.fail(
                upstream_failure(upstream::forward_status::bad_response, reg_));
        }
        co_return co_await x.tunnel(*rp);
    }
    co_return co_await x.relay_response(*rp);
}

} // namespace onceproxy::http
