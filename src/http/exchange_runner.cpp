#include "http/exchange_runner.hpp"

#include "http/body_relay.hpp"
#include "http/exchange_translation.hpp"
#include "http/grpc_answer.hpp"
#include "http/http_date.hpp"
#include "http/random_id.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/core/exchange_fsm.hpp"
#include "onceproxy/core/grpc.hpp"
#include "onceproxy/core/request_facts.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/loop_guard.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/wire/coarse_clock.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <iterator>
#include <optional>
#include <vector>

namespace onceproxy::http {

namespace net = boost::asio;
using clock = std::chrono::steady_clock;

namespace {

/// The upstream's timeout and late_answer_timeout, as the engine sees them (issue 26), the
/// timeout capped by the client's own deadline (gRPC's grpc-timeout; 0: none).
core::upstream_deadlines deadlines_of(const config::upstream_config& up,
                                      std::chrono::milliseconds client_deadline) {
    const auto timeout =
        client_deadline.count() > 0 ? std::min(up.timeout, client_deadline) : up.timeout;
    return {timeout, up.late_answer_timeout, up.connect_timeout, client_deadline};
}

/// A gRPC call's grpc-timeout, 0 when it has none (or a malformed one).
std::chrono::milliseconds client_deadline_of(const request& req, bool grpc_call) {
    if (!grpc_call) {
        return std::chrono::milliseconds{0};
    }
    const auto v = req["grpc-timeout"];
    return v.empty() ? std::chrono::milliseconds{0}
                     : core::parse_grpc_timeout(v).value_or(std::chrono::milliseconds{0});
}

/// Now, in milliseconds since the Unix epoch (a claim's created_ms), from the coarse wall clock
/// (a few milliseconds early at most).
std::int64_t unix_millis() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               wire::coarse_wall_now().time_since_epoch())
        .count();
}

/// The state shared by the exchange driver and its upstream call.
struct exchange_state {
    exchange_state(std::shared_ptr<exchange_env> e, const config::route_config& r, std::size_t ri,
                   request&& q, net::any_io_executor ex, stream_target t,
                   std::shared_ptr<buffer_reservation> h)
        : env_hold(std::move(e)), route(r), route_index(ri), req(std::move(q)),
          grpc_call(is_grpc_call(req)), client_deadline(client_deadline_of(req, grpc_call)),
          fsm(r.idempotency, {},
              deadlines_of(env.fwd->upstream(r.upstream_index), client_deadline)),
          executor(std::move(ex)), target(t), held(std::move(h)) {}

    std::shared_ptr<exchange_env> env_hold; ///< keeps the config (and `route`) alive
    exchange_env& env = *env_hold;
    const config::route_config& route;
    std::size_t route_index;
    request req;
    bool grpc_call; ///< a gRPC call: its grpc-status decides, its answers are gRPC answers
    /// The client's own deadline (grpc-timeout), 0 when it sent none: caps the upstream wait.
    std::chrono::milliseconds client_deadline;
    core::exchange_fsm fsm;
    net::any_io_executor executor; ///< the worker's, where the exchange and its tasks run
    /// The driver's wake-up, made when the driver first waits (a replay never does);
    /// cancelled when the upstream answers.
    std::optional<net::steady_timer> timer;
    std::string store_key;
    std::string fingerprint;
    const hex_id owner_id = random_hex_chars();              ///< fencing token of this attempt
    std::optional<upstream::forward_result> upstream_result; ///< set once the call ends
    /// The upstream answer's header fields as received (upstream_result->raw_fields): an
    /// HTTP/1.1 client's answer and the record are written from them, never looked up.
    wire::raw_header_store answer_fields;
    /// The upstream call, paused at the engine's wake-up until resumed beside the driver.
    std::unique_ptr<upstream::paused_forward> paused_call;
    /// An upstream outcome the fsm has not heard of yet (the call's, or a streamed body's end),
    /// and when it happened.
    std::optional<core::upstream_event> upstream_due;
    clock::time_point upstream_due_at{};
    /// When the engine last heard of something. A step taken at once after it, with nothing
    /// waited for in between, is dated by it rather than by another clock reading.
    clock::time_point last_event{};
    stream_target target;
    /// The request body and the held upstream answer, counted in limits.max_buffered_bytes
    /// until the exchange and the client connection are both done with them.
    std::shared_ptr<buffer_reservation> held;
    bool streamed = false; ///< the answer's head went to the client (written by the exchange)
    /// An HTTP/1.1 client's whole answer, its head serialised in the client's scratch buffer
    /// and its body held here (the record, or the upstream's answer): written once the
    /// exchange has counted its outcome, so a scrape after the answer sees it counted.
    struct pending_answer {
        unsigned status = 0;
        std::string_view body;
        bool keep = false;
    };
    std::optional<pending_answer> pending;
    std::string claimed_record; ///< completed claim: the record to replay
    /// claimed_record decoded (viewing it), when it decodes.
    std::optional<core::response_record_view> claimed_view;
    std::string holder; ///< who the store charges the record to (derived_request)
    /// The last claim's created_ms (the acquiring one's when a record is made): stored beside
    /// the record and bound into its sealed form.
    std::int64_t created_ms = 0;
    std::optional<std::string> payload; ///< the encoded record, built once for all attempts
    store::record_kind payload_kind = store::record_kind::kept; ///< set with `payload`
    /// The record's Idempotency-Expires, fixed once (see record_expiry); from a claim, the
    /// found record's.
    std::string expires;
    clock::time_point upstream_started{};
    exchange_report report;
    /// Store operations issued (claim, complete, release; one Redis round trip each), lease
    /// renewals aside: metrics::family::store_round_trips.
    std::uint64_t round_trips = 0;

    metrics::route_metrics& metrics() { return *env.route_series[route_index]; }
    std::optional<upstream::forward_status> upstream_status() const {
        return upstream_result ? std::optional(upstream_result->status) : std::nullopt;
    }
    std::string_view upstream_name() const { return env.fwd->upstream(route.upstream_index).name; }
    std::string_view owner() const { return {owner_id.data(), owner_id.size()}; }
    /// Records an upstream outcome for the driver, and wakes it if it waits.
    void upstream_ended(core::upstream_event ev, clock::time_point at);
};

/// Times one store operation into the route's histogram and the access-log report, and counts
/// a failure. done() returns when the operation ended: the time the engine hears of it at.
class store_op {
public:
    /// `start`: when the operation is issued (the exchange's last event's time when nothing
    /// was done in between).
    explicit store_op(exchange_state& s, clock::time_point start = clock::now())
        : s_(s), start_(start) {}
    /// `ec`: the operation's error, empty when it succeeded.
    clock::time_point done(const boost::system::error_code& ec) {
        return done(ec ? std::optional(store_error_cause_of(ec)) : std::nullopt);
    }
    template <class T>
    clock::time_point done(const store::result<T>& r) {
        return done(r ? boost::system::error_code() : r.error());
    }
    clock::time_point done(std::optional<metrics::store_error_cause> failed) {
        const auto now = clock::now();
        const auto d = now - start_;
        s_.metrics().histogram(metrics::family::store_duration).observe(d);
        s_.report.store_ms += std::chrono::duration<double, std::milli>(d).count();
        if (failed) {
            s_.env.reg.counter(metrics::family::store_errors, *failed).inc();
        }
        s_.last_event = now;
        return now;
    }

private:
    exchange_state& s_;
    clock::time_point start_;
};

// --- one coroutine per engine action; each returns the engine's next action -----------------

net::awaitable<core::action> do_claim(exchange_state& s, core::action a) {
    store_op op(s, s.last_event); // issued as the engine decided (start, or a wait's end)
    // Named, then passed: g++ 12 destroys a braced temporary argument of a coroutine twice
    // inside a co_await expression. Views of the state's strings, which outlive the claim.
    s.created_ms = unix_millis();
    const store::claim_request creq{s.store_key, s.fingerprint, s.owner(),
                                    a.lease,     s.holder,      s.created_ms};
    ++s.round_trips;
    auto r = co_await s.env.st->async_claim(creq);
    if (r && r->round_trips > 1) {
        s.round_trips += r->round_trips - 1;
    }
    auto t = to_claim_event(std::move(r), s.claimed_record, s.env.cipher.get(), s.store_key,
                            s.fingerprint);
    const auto ended =
        op.done(t.store_error  ? std::optional(store_error_cause_of(t.error))
                : t.unreadable ? std::optional(metrics::store_error_cause::unreadable)
                               : std::nullopt);
    if (t.open_failure) {
        s.metrics().counter(metrics::family::record_decrypt_failures, *t.open_failure).inc();
    }
    s.claimed_view = std::move(t.view);
    s.expires = std::move(t.expires);
    co_return s.fsm.on_claim(t.event, ended);
}

/// Ends the driver's wait (do_wait), if it is waiting.
void wake(exchange_state& s) {
    if (s.timer) {
        s.timer->cancel();
    }
}

void exchange_state::upstream_ended(core::upstream_event ev, clock::time_point at) {
    upstream_due = ev;
    upstream_due_at = at;
    wake(*this);
}

/// The upstream call's outcome: timed, counted in the buffer budget, and handed to the driver.
void upstream_answered(exchange_state& s, upstream::forward_result&& r) {
    const auto ended = clock::now();
    const auto took = ended - s.upstream_started;
    s.report.upstream_ms = std::chrono::duration<double, std::milli>(took).count();
    s.metrics().histogram(metrics::family::upstream_duration).observe(took);
    if (r.status == upstream::forward_status::ok) {
        // Once, here: both the record and the client response carry end-to-end headers only
        // (fields kept as received are filtered as they are written).
        if (!r.raw_fields) {
            strip_hop_by_hop(r.res);
        }
        // Counted, never refused: the upstream has acted, its answer must get through.
        if (s.held) {
            s.held->force_grow_to(s.held->bytes() + r.res.body().size());
        }
    }
    const auto ev = to_upstream_event(r, s.grpc_call);
    s.upstream_result = std::move(r);
    s.upstream_ended(ev, ended);
}

/// The upstream answer's fields as received, when they were kept so (else its `res` has them).
const wire::raw_header_store* raw_fields_of(const exchange_state& s) {
    return s.upstream_result && s.upstream_result->raw_fields ? &s.answer_fields : nullptr;
}

/// `deadline`: the bound on the call instead of the upstream's timeout (late answers).
/// `checkpoint`: when the call pauses if its answer is not in yet (pausable upstreams); it is
/// then left in paused_call, for resume_upstream.
net::awaitable<void> call_upstream(std::shared_ptr<exchange_state> s,
                                   std::optional<std::chrono::milliseconds> deadline,
                                   std::optional<clock::time_point> checkpoint) {
    // A body longer than max_record_bytes is not held: it cannot be replayed anyway, so it
    // streams to the client instead (issue 8).
    const auto hold = s->target.client.whole_answer
                          ? std::nullopt
                          : std::optional<std::size_t>(s->route.idempotency.max_record_bytes);
    if (!s->target.upstream_proto.empty()) {
        ready_for_upstream(s->req, s->target.client_ip, s->target.upstream_proto,
                           s->env.cfg->trusted_proxies);
        s->target.upstream_proto = {}; // once, however often the request is sent
    }
    auto max_response = s->route.limits.max_response_bytes;
    if (s->target.client.whole_answer && !max_response) {
        max_response = s->env.cfg->limits.max_response_bytes; // held whole: bounded
    }
    // An HTTP/1.1 client's answer is written from the fields as received; an HTTP/2 stream's
    // and a gRPC call's are looked up (answer_whole, grpc_status_of).
    auto* const fields =
        s->target.client.whole_answer || s->grpc_call ? nullptr : &s->answer_fields;
    auto r = co_await s->env.fwd->async_forward(s->route.upstream_index, s->req, max_response, hold,
                                                deadline, checkpoint, fields);
    if (r.paused) {
        s->paused_call = std::move(r.paused);
        co_return;
    }
    upstream_answered(*s, std::move(r));
}

/// The paused upstream call, gone on with beside the driver until its answer.
net::awaitable<void> resume_upstream(std::shared_ptr<exchange_state> s) {
    auto r = co_await s->env.fwd->async_resume(std::move(s->paused_call), s->req);
    upstream_answered(*s, std::move(r));
}

/// When the record being written stops being replayed, as the IMF-fixdate its answers state:
/// now + the route's ttl, fixed the first time it is asked for, so the first answer and the
/// record say the same. It is asked for when the record is built or, for a streamed answer,
/// when its head leaves (before the body ends and the record is completed): either way no
/// later than the store starts the record's ttl, so it never promises more than the store
/// keeps.
const std::string& record_expiry(exchange_state& s) {
    if (s.expires.empty()) {
        // Formatted once per second of expiry per worker thread rather than per record.
        thread_local std::chrono::sys_seconds formatted_for{};
        thread_local std::string text;
        // The coarse wall clock is never later than the precise one: no later expiry either.
        const auto at = std::chrono::floor<std::chrono::seconds>(wire::coarse_wall_now() +
                                                                 s.route.idempotency.ttl);
        if (text.empty() || at != formatted_for) {
            text = imf_fixdate(at);
            formatted_for = at;
        }
        s.expires = text;
    }
    return s.expires;
}

/// Whether the client connection may carry another request after this answer: the client
/// asked for keep-alive, the worker is not draining and the connection's cap is not reached.
bool client_may_keep(const stream_target& t) {
    return t.keep_alive && !t.client.draining && !t.client.last;
}

/// Writes the pending answer (if any): its head from the client's scratch buffer, then its
/// body. The server has nothing left to write (the answer counts as streamed); the connection
/// carries on if the answer says so and the write succeeded.
net::awaitable<void> write_pending_answer(exchange_state& s) {
    if (!s.pending) {
        co_return;
    }
    const auto a = *s.pending;
    s.pending.reset();
    auto& client = s.target.client;
    s.streamed = true;
    s.report.streamed = true;
    s.report.streamed_status = a.status;
    client.dl.expires_after(s.env.cfg->limits.idle_timeout);
    const std::array<net::const_buffer, 2> answer{net::buffer(client.scratch),
                                                  net::buffer(a.body.data(), a.body.size())};
    auto [ec, n] = co_await wire::async_write_all(client.sock, answer);
    (void)n;
    if (ec) {
        client.sock.mark_cut();
    }
    s.report.keep = a.keep && !ec;
}

/// The first write of a streamed answer: its head (with `st`, framed by `f`) and the body bytes
/// held, which are freed once sent (the record keeps no body: memory stays flat). False when
/// the client could not be written to.
net::awaitable<bool> write_answer_start(exchange_state& s, core::idempotency_status st,
                                        const response_framing& f) {
    auto& res = s.upstream_result->res;
    auto& client = s.target.client;
    // Only a head that says `stored` speaks for a record (one released or unrecorded does not).
    const std::string_view expires =
        st == core::idempotency_status::stored ? std::string_view(record_expiry(s)) : "";
    serialize_answer_head(res, st, expires, f.rechunk, std::nullopt, f.keep, client.scratch,
                          raw_fields_of(s));
    s.streamed = true;
    s.report.streamed_status = res.result_int();
    const gather first(client.scratch, f.no_body ? std::string_view() : res.body(), f.rechunk, {});
    client.dl.expires_after(s.env.cfg->limits.idle_timeout);
    auto [ec, n] = co_await wire::async_write_all(client.sock, first.buffers());
    (void)n;
    res.body() = std::string();
    if (ec) {
        client.sock.mark_cut();
    }
    co_return !ec;
}

/// Passes on an answer too large to hold: its head (with `st`) and the body bytes held go to
/// the client in one write, then the rest of the body is relayed piece by piece, the client's
/// pace setting the upstream's. Returns how the body ended, as the engine's event: a client
/// that hung up leaves the upstream connection closed and the answer counted as complete (its
/// head is what gets recorded, as not replayable); an upstream that broke off is an unknown
/// outcome and the client connection is cut, the only way left to tell it.
net::awaitable<core::upstream_event> relay_answer(exchange_state& s, core::idempotency_status st) {
    const unsigned status = s.upstream_result->res.result_int();
    std::uint64_t bytes = s.upstream_result->res.body().size();
    auto rest = std::move(s.upstream_result->rest);
    auto& rp = rest->parser;
    auto& t = s.target;
    const auto f =
        frame_response(status, t.head_request, !rp.chunked() && rp.content_length().has_value(),
                       t.client_version, client_may_keep(t));
    auto end = body_end::client_failed;
    auto failure = upstream::forward_status::ok;
    if (co_await write_answer_start(s, st, f)) {
        rp.stream_body(relay_chunk);
        const auto& up = s.env.fwd->upstream(s.route.upstream_index);
        connection_sink to(t.client.sock, t.client.dl, s.env.cfg->limits.idle_timeout, f.rechunk);
        end = co_await relay_body(
            rp, {*rest->conn, up.timeout, s.env.fwd.get(), s.route.upstream_index}, to, bytes,
            failure);
    }
    const bool reusable = end == body_end::complete && rp.keep_alive() && !rp.need_eof();
    s.env.fwd->release(s.route.upstream_index, std::move(rest->conn), reusable);
    s.report.keep = end == body_end::complete && f.keep;
    switch (end) {
    case body_end::complete:
        break;
    case body_end::client_failed:
        // The effect happened and its head is known: record it; nobody is left to answer.
        s.fsm.on_client_gone();
        break;
    case body_end::upstream_failed:
        s.env.reg
            .counter(metrics::family::upstream_errors,
                     failure == upstream::forward_status::timeout_after_send
                         ? metrics::upstream_error::timeout
                         : metrics::upstream_error::unavailable)
            .inc();
        co_return to_upstream_event(failure, 0, 0);
    }
    co_return core::upstream_event{core::upstream_result::response, status,
                                   static_cast<std::size_t>(bytes)};
}

/// Completion of a task run beside the driver (the upstream call, the stream relay). An
/// exception escaping one is a bug: it is logged and counted, and it still ends the driver's
/// wait as an answer that broke off after the request was sent (an unknown outcome), so the
/// exchange is never left extending its lease with nobody to answer (issue 26, item 7b).
auto side_task_end(std::shared_ptr<exchange_state> s, const char* what) {
    return [s = std::move(s), what](std::exception_ptr e) {
        if (!e) {
            return;
        }
        report_exception(e, what, s->env.reg.counter(metrics::family::internal_errors));
        if (!s->upstream_due) {
            s->upstream_ended(to_upstream_event(upstream::forward_status::reset_after_send, 0, 0),
                              clock::now()); // wakes the driver
        } else {
            wake(*s);
        }
    };
}

/// stream: the body is relayed beside the driver, which goes on ticking the lease; its end is
/// the upstream outcome the driver waits for.
void start_stream(const std::shared_ptr<exchange_state>& s, core::idempotency_status st) {
    net::co_spawn(
        s->executor,
        [](std::shared_ptr<exchange_state> self,
           core::idempotency_status status) -> net::awaitable<void> {
            auto ev = co_await relay_answer(*self, status);
            self->upstream_ended(ev, clock::now());
        }(s, st),
        side_task_end(s, "stream relay"));
}

/// The bound on the upstream call. With late answers on, the call is bounded by
/// late_answer_timeout: the engine itself answers the client's 504 at the upstream's timeout
/// and waits on for the call (issue 26).
std::optional<std::chrono::milliseconds> call_deadline(const exchange_state& s) {
    const auto& up = s.env.fwd->upstream(s.route.upstream_index);
    if (s.fsm.awaits_late_answers()) {
        return up.late_answer_timeout;
    }
    if (s.client_deadline.count() > 0 && s.client_deadline < up.timeout) {
        return s.client_deadline; // the client waits no longer (grpc-timeout)
    }
    return std::nullopt;
}

/// The engine's next action on an upstream outcome it has not heard of yet, if one is due.
/// Only a finished upstream call cuts a wait short. Any other wait (completion retry backoff
/// after the upstream answered, re-claim backoff) must sleep: an early tick returns the same
/// wait_until, so skipping the timer there spins the worker thread until the lease ends.
std::optional<core::action> upstream_outcome(exchange_state& s) {
    if (!s.upstream_due || s.fsm.current_state() != core::state::forwarding) {
        return std::nullopt;
    }
    const auto ev = *s.upstream_due;
    s.upstream_due.reset();
    s.last_event = s.upstream_due_at; // the engine hears of it when it happened
    return s.fsm.on_upstream(ev, s.last_event);
}

/// forward, wait_until: sleeps until `wake_at` unless the upstream call ends first.
net::awaitable<core::action> do_wait(exchange_state& s, core::action a) {
    if (auto next = upstream_outcome(s)) {
        co_return *next;
    }
    if (!s.timer) {
        s.timer.emplace(s.executor);
    }
    s.timer->expires_at(a.wake_at);
    co_await s.timer->async_wait(use_tuple);
    if (auto next = upstream_outcome(s)) {
        co_return *next;
    }
    s.last_event = clock::now();
    co_return s.fsm.on_tick(s.last_event);
}

/// forward: the upstream call, while the driver goes on ticking the lease. On a pausable
/// upstream the call is awaited here until its answer or the engine's next wake-up (a lease
/// extension, the client's 504), where it pauses and goes on beside the driver: a call answered
/// before then needs neither a task of its own nor a timer. Other calls run beside the driver
/// from the start.
net::awaitable<core::action> do_forward(std::shared_ptr<exchange_state> s, core::action a) {
    s->upstream_started = s->last_event; // forwarded as the engine decided
    const auto deadline = call_deadline(*s);
    if (!s->env.fwd->pausable(s->route.upstream_index)) {
        net::co_spawn(s->executor, call_upstream(s, deadline, std::nullopt),
                      side_task_end(s, "upstream call"));
        co_return co_await do_wait(*s, a);
    }
    std::exception_ptr failed;
    try {
        co_await call_upstream(s, deadline, a.wake_at);
    } catch (...) {
        failed = std::current_exception();
    }
    if (failed) {
        side_task_end(s, "upstream call")(failed); // as if the call had run beside the driver
    } else if (s->paused_call) {
        net::co_spawn(s->executor, resume_upstream(s), side_task_end(s, "upstream call"));
    }
    if (auto next = upstream_outcome(*s)) {
        co_return *next; // answered before the engine's wake-up: no wait
    }
    co_return co_await do_wait(*s, a);
}

net::awaitable<core::action> do_extend(exchange_state& s, core::action a) {
    store_op op(s);
    auto r = co_await s.env.st->async_extend(s.store_key, s.owner(), a.lease);
    const auto ended = op.done(r);
    co_return s.fsm.on_extend(to_fence_event(r), ended);
}

net::awaitable<core::action> do_complete(exchange_state& s, core::action a) {
    if (!s.payload) {
        const response* res = s.upstream_result ? &s.upstream_result->res : nullptr;
        s.payload = record_payload(a, res, s.route.idempotency, record_expiry(s),
                                   s.env.cipher.get(), {s.store_key, s.fingerprint, s.created_ms},
                                   res != nullptr ? &s.upstream_result->trailers : nullptr,
                                   raw_fields_of(s));
        s.payload_kind = record_kind_of(a, res);
    }
    store_op op(s);
    // Named, then passed: see do_claim. What do_claim's request wrote.
    const store::claimed_lease claimed{s.fingerprint, s.created_ms};
    ++s.round_trips;
    auto r = co_await s.env.st->async_complete(s.store_key, s.owner(), *s.payload, a.ttl,
                                               s.payload_kind, claimed);
    const auto ended = op.done(r);
    co_return s.fsm.on_complete(to_fence_event(r), ended);
}

net::awaitable<core::action> do_release(exchange_state& s) {
    store_op op(s);
    ++s.round_trips;
    auto r = co_await s.env.st->async_release(s.store_key, s.owner());
    const auto ended = op.done(r);
    co_return s.fsm.on_release(to_fence_event(r), ended);
}

/// The upstream response held whole, with the Idempotency-Status of the action.
response answer_whole(exchange_state& s, core::idempotency_status st) {
    // Moved out unless a later completion retry would still need its bytes for the record.
    const bool keep = st == core::idempotency_status::unrecorded && !s.payload;
    response res = keep ? s.upstream_result->res : std::move(s.upstream_result->res);
    s.report.trailers = keep ? s.upstream_result->trailers : std::move(s.upstream_result->trailers);
    set_idempotency_status(res, st);
    set_idempotency_expires(res, st == core::idempotency_status::stored ? s.expires : "");
    return res;
}

/// respond: the upstream response, with the Idempotency-Status of the action. An answer too
/// large to hold streams (one the engine did not record: released, or the lease lost), or
/// already streamed (the stream action): nothing left to write then. An HTTP/1.1 client's
/// answer held whole is left pending, its head serialised from the upstream's (no edits of its
/// header map) and its body sent from where it is held; an HTTP/2 stream gets answer_whole's.
/// Nullopt: the exchange writes (or wrote) the answer itself.
net::awaitable<std::optional<response>> do_respond(exchange_state& s, core::idempotency_status st) {
    if (!s.streamed && s.upstream_result->rest) {
        co_await relay_answer(s, st);
    }
    if (s.streamed) {
        co_return std::nullopt;
    }
    if (s.target.client.whole_answer) {
        co_return answer_whole(s, st);
    }
    const auto& res = s.upstream_result->res;
    const unsigned status = res.result_int();
    // Held whole, so its length is known: never re-chunked, never close-delimited.
    const auto f = frame_response(status, s.target.head_request, true, s.target.client_version,
                                  client_may_keep(s.target));
    serialize_answer_head(res, st, st == core::idempotency_status::stored ? s.expires : "", false,
                          f.no_body ? std::nullopt : std::optional(res.body().size()), f.keep,
                          s.target.client.scratch, raw_fields_of(s));
    s.pending = exchange_state::pending_answer{status, res.body(), f.keep};
    co_return std::nullopt;
}

/// reject: the problem answer. One that speaks for a record carries its expiry too: the
/// recorded upstream.outcome_unknown (`stored`), and the 409 of a record kept without its body
/// (the key stays consumed until then, after which a retry executes again).
response reject_with_expiry(exchange_state& s, const core::action& a) {
    auto res = reject_response(a, s.upstream_status(), s.upstream_name());
    if (a.status_header == core::idempotency_status::stored ||
        a.problem == problem_code::response_not_replayable) {
        set_idempotency_expires(res, s.expires);
    }
    return res;
}

/// The Date of a replay, formatted once a second per worker thread rather than per replay.
std::string_view replay_date() {
    thread_local std::time_t formatted_at = -1;
    thread_local std::string text;
    const std::time_t now = std::time(nullptr);
    if (now != formatted_at) {
        text = http_date(static_cast<std::int64_t>(now));
        formatted_at = now;
    }
    return text;
}

/// replay: the record's answer. An HTTP/1.1 client's is left pending, its head serialised from
/// the record and its body sent from where the record keeps it (nullopt: the server has nothing
/// left to write); an HTTP/2 stream gets replay_response's, as does a record that does not
/// decode (its problem answer).
std::optional<response> do_replay(exchange_state& s) {
    const bool stripe = s.route.idempotency.stripe_compat;
    auto& t = s.target;
    if (t.client.whole_answer || !s.claimed_view) {
        s.claimed_view.reset();
        return replay_response(std::move(s.claimed_record), stripe, replay_date(),
                               &s.report.trailers);
    }
    const auto& rec = *s.claimed_view;
    const bool keep = client_may_keep(t);
    const auto body =
        serialize_replay_head(rec, stripe, replay_date(), keep, t.head_request, t.client.scratch);
    s.pending = exchange_state::pending_answer{rec.status, body, keep};
    return std::nullopt;
}

/// passthrough (fail-open, or an optional route without a key): forward unprotected.
net::awaitable<std::optional<response>> do_passthrough(std::shared_ptr<exchange_state> s) {
    s->upstream_started = clock::now();
    co_await call_upstream(s, std::nullopt, std::nullopt);
    if (s->upstream_result->status == upstream::forward_status::ok) {
        co_return co_await do_respond(*s, core::idempotency_status::none);
    }
    co_return upstream_failure(s->upstream_result->status, s->env.reg, s->upstream_name());
}

/// How drive ended: at a client-facing action (`answered`, with the response to write unless
/// the exchange writes it itself: pending or streamed), or done.
struct driven {
    bool answered = false;
    std::optional<response> res;
};

/// Carries out the engine's actions until a client-facing one or done. After the client was
/// answered only store actions remain (background completion retries), so the same loop serves
/// both parts.
net::awaitable<driven> drive(std::shared_ptr<exchange_state> s, core::action a) {
    for (;;) {
        switch (a.kind) {
        case core::action_kind::claim:
            a = co_await do_claim(*s, a);
            break;
        case core::action_kind::forward:
            a = co_await do_forward(s, a);
            break;
        case core::action_kind::stream:
            start_stream(s, a.status_header);
            a = co_await do_wait(*s, a);
            break;
        case core::action_kind::wait_until:
            a = co_await do_wait(*s, a);
            break;
        case core::action_kind::extend_lease:
            a = co_await do_extend(*s, a);
            break;
        case core::action_kind::complete:
            a = co_await do_complete(*s, a);
            break;
        case core::action_kind::release:
            a = co_await do_release(*s);
            break;
        case core::action_kind::replay:
            co_return driven{true, do_replay(*s)};
        case core::action_kind::respond: {
            auto res = co_await do_respond(*s, a.status_header);
            co_return driven{true, std::move(res)};
        }
        case core::action_kind::reject:
            if (s->streamed) {
                co_return driven{true, {}}; // the body broke off: the cut connection says so
            }
            co_return driven{true, reject_with_expiry(*s, a)};
        case core::action_kind::passthrough: {
            auto res = co_await do_passthrough(s);
            co_return driven{true, std::move(res)};
        }
        case core::action_kind::done:
            co_return driven{};
        }
    }
}

/// The one place an exchange's outcome is counted: when the engine calls it final.
void finish(exchange_state& s) {
    if (s.upstream_result && s.upstream_result->rest) {
        // A late answer too large to hold was recorded head-only; nobody reads the rest.
        s.env.fwd->release(s.route.upstream_index, std::move(s.upstream_result->rest->conn), false);
        s.upstream_result->rest.reset();
    }
    if (auto late = s.fsm.late()) {
        s.env.reg.counter(metrics::family::late_answers, *late).inc();
    }
    if (auto o = s.fsm.outcome()) {
        s.report.outcome = *o;
        s.metrics().counter(metrics::family::requests, *o).inc();
        s.metrics().counter(metrics::family::store_round_trips, *o).add(s.round_trips);
    }
}

/// Observe mode: counts and logs what enforcement would have done with a request that went to
/// the upstream instead. The key appears only as its store key (a hash), never as sent.
void note_observation(exchange_state& s) {
    const auto o = s.fsm.observed();
    if (!o) {
        return;
    }
    s.metrics().counter(metrics::family::observed, *o).inc();
    constexpr std::string_view msg = "enforcement would have acted; forwarded";
    const std::string_view would = core::to_string(*o);
    if (s.store_key.empty()) { // no usable key: nothing to identify it by
        log::info("observe", msg, {{"route", s.route.name}, {"would", would}});
        return;
    }
    log::info("observe", msg,
              {{"route", s.route.name}, {"would", would}, {"key_hash", s.store_key}});
}

/// Background part: store-only actions after the client was answered. The token keeps the
/// worker's drain waiting until the record is complete or released.
net::awaitable<void> drive_background(std::shared_ptr<exchange_state> s, core::action a,
                                      [[maybe_unused]] task_tracker::token held) {
    auto r = co_await drive(s, a);
    (void)r; // store-only by the fsm contract: no further client-facing action
    finish(*s);
}

/// The neutral view of `req` the engine derives its facts from; `lines` holds the header views.
core::request_view view_of(const request& req, std::vector<core::header_view>& lines) {
    lines.clear();
    lines.reserve(static_cast<std::size_t>(std::distance(req.begin(), req.end())));
    for (const auto& f : req) {
        lines.emplace_back(f.name_string(), f.value());
    }
    return {req.method_string(), req.target(), lines, req.body(), {}};
}

} // namespace

response upstream_failure(upstream::forward_status s, metrics::registry& reg,
                          std::string_view upstream_name) {
    using metrics::family;
    (s == upstream::forward_status::timeout_after_send
         ? reg.counter(family::upstream_errors, metrics::upstream_error::timeout)
     : s == upstream::forward_status::tunnel_limit
         ? reg.counter(family::tunnels_refused)
         : reg.counter(family::upstream_errors, metrics::upstream_error::unavailable))
        .inc();
    return upstream_failure_problem(s, upstream_name);
}

bool is_guarded(const config::route_config& route, std::string_view method,
                std::string_view path) noexcept {
    if (!core::guards_method(route.idempotency, method)) {
        return false;
    }
    const auto& streaming = route.match.streaming;
    if (streaming.empty()) {
        return true;
    }
    const auto slash = path.rfind('/');
    const auto name = slash == std::string_view::npos ? path : path.substr(slash + 1);
    return std::find(streaming.begin(), streaming.end(), name) == streaming.end();
}

net::awaitable<std::optional<response>>
async_run_exchange(std::shared_ptr<exchange_env> env, const config::route_config& route,
                   std::size_t route_index, request& req, exchange_report& report,
                   stream_target target, std::shared_ptr<buffer_reservation> held) {
    const auto& pol = route.idempotency;
    auto ex = co_await net::this_coro::executor;
    auto s = std::make_shared<exchange_state>(std::move(env), route, route_index, std::move(req),
                                              ex, target, std::move(held));

    // Request facts: the key (header or natural), scope and fingerprint (SPEC §3.1, 3.3-3.5).
    // The header views, in a buffer the worker thread reuses: used only until the facts are
    // derived, before the exchange first suspends.
    thread_local std::vector<core::header_view> lines;
    auto view = view_of(s->req, lines);
    std::string subject;
    if (pol.principal == config::principal_source::client_cert) {
        subject = target.client.sock.verified_peer_subject();
        view.client_cert_subject = subject;
    }
    view.client_address = target.client_ip;
    auto derived = core::derive_request_facts(pol, route.name, view);
    lines.clear(); // the views point into s->req, which the erase below may change
    if (lines.capacity() > 256) {
        lines = {}; // a request with very many fields does not pin the memory to the thread
    }
    if (pol.key.json_pointer.empty() && !pol.key.forward) {
        s->req.erase(pol.key.header);
    }
    s->store_key = std::move(derived.store_key);
    s->fingerprint = std::move(derived.fingerprint);
    s->holder = std::move(derived.holder);
    if (s->env.cfg->access_log) {
        s->report.key_hash = s->store_key; // read by the access log only
    }

    s->last_event = clock::now();
    auto first = s->fsm.start(derived.facts, s->last_event);
    auto ended = co_await drive(s, first);
    auto& res = ended.res;
    note_observation(*s);
    s->report.streamed = s->streamed;
    if (!ended.answered) {
        if (!s->streamed) { // else the client hung up mid-stream and the record is done
            res = no_answer_problem();
        }
    } else if (auto next = s->fsm.on_responded(clock::now());
               next.kind != core::action_kind::done) {
        // Answered (e.g. unrecorded); completion retries go on without the client, and the
        // outcome is counted when they end.
        co_await write_pending_answer(*s);
        report = s->report;
        // So far: answered unrecorded, or answered 504 with the late answer still awaited.
        report.outcome = s->fsm.current_state() == core::state::forwarding
                             ? core::outcome::held
                             : core::outcome::store_error;
        auto token = s->env.tracker.enter();
        net::co_spawn(ex, drive_background(s, next, std::move(token)), net::detached);
        co_return std::move(res);
    }
    finish(*s);
    co_await write_pending_answer(*s); // counted first: a scrape after the answer sees it
    report = std::move(s->report);
    co_return std::move(res);
}

} // namespace onceproxy::http
