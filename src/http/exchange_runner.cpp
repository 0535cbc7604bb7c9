#include "http/exchange_runner.hpp"

#include "http/random_id.hpp"

#include "onceproxy/core/exchange_fsm.hpp"
#include "onceproxy/core/fingerprint.hpp"
#include "onceproxy/core/idempotency_key.hpp"
#include "onceproxy/core/response_record.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/problem.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include <atomic>
#include <ctime>
#include <optional>
#include <vector>

namespace onceproxy::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using clock = std::chrono::steady_clock;

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

/// Exchanges still completing after their client was answered (drain waits for them).
std::atomic<std::size_t> background_count{0};

/// RFC 9110 §5.6.7 IMF-fixdate, for the fresh Date of a replay.
std::string http_date() {
    char buf[64];
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    const auto n = std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    return std::string(buf, n);
}

problem_code to_http(core::problem_code c) {
    switch (c) {
    case core::problem_code::missing_key:
        return problem_code::missing_key;
    case core::problem_code::invalid_key:
        return problem_code::invalid_key;
    case core::problem_code::payload_mismatch:
        return problem_code::payload_mismatch;
    case core::problem_code::in_progress:
        return problem_code::in_progress;
    case core::problem_code::store_unavailable:
        return problem_code::store_unavailable;
    case core::problem_code::response_not_replayable:
        return problem_code::response_not_replayable;
    case core::problem_code::upstream_unavailable:
        return problem_code::upstream_unavailable;
    case core::problem_code::upstream_timeout:
        return problem_code::upstream_timeout;
    case core::problem_code::upstream_outcome_unknown:
        return problem_code::upstream_outcome_unknown;
    case core::problem_code::upstream_bad_response:
        return problem_code::upstream_bad_response;
    }
    return problem_code::bad_request;
}

std::string_view problem_detail(core::problem_code c) {
    switch (c) {
    case core::problem_code::missing_key:
        return "this route requires an idempotency key";
    case core::problem_code::invalid_key:
        return "the idempotency key is malformed, too long, empty or repeated";
    case core::problem_code::payload_mismatch:
        return "this idempotency key was used with a different request";
    case core::problem_code::in_progress:
        return "a request with this idempotency key is still being processed; retry later";
    case core::problem_code::store_unavailable:
        return "the idempotency store cannot be reached; retry later";
    case core::problem_code::response_not_replayable:
        return "the response recorded for this key is too large to replay";
    case core::problem_code::upstream_unavailable:
        return "could not reach the upstream";
    case core::problem_code::upstream_timeout:
        return "the upstream did not answer in time";
    case core::problem_code::upstream_outcome_unknown:
        return "the upstream may or may not have processed this request; it will not be "
               "executed again under this key";
    case core::problem_code::upstream_bad_response:
        return "the request was sent to the upstream, but its answer was malformed or too large; "
               "the upstream may have processed it";
    }
    return "";
}

metrics::outcome to_metric(core::exchange_outcome o) {
    switch (o) {
    case core::exchange_outcome::stored:
        return metrics::outcome::stored;
    case core::exchange_outcome::replayed:
        return metrics::outcome::replayed;
    case core::exchange_outcome::in_progress:
        return metrics::outcome::in_progress;
    case core::exchange_outcome::mismatch:
        return metrics::outcome::mismatch;
    case core::exchange_outcome::missing_key:
        return metrics::outcome::missing_key;
    case core::exchange_outcome::invalid_key:
        return metrics::outcome::invalid_key;
    case core::exchange_outcome::released:
        return metrics::outcome::released;
    case core::exchange_outcome::held:
        return metrics::outcome::held;
    case core::exchange_outcome::outcome_unknown:
        return metrics::outcome::outcome_unknown;
    case core::exchange_outcome::not_replayable:
        return metrics::outcome::not_replayable;
    case core::exchange_outcome::lease_lost:
        return metrics::outcome::lease_lost;
    case core::exchange_outcome::record_failed:
        return metrics::outcome::record_failed;
    case core::exchange_outcome::store_error:
        return metrics::outcome::store_error;
    case core::exchange_outcome::passthrough:
        return metrics::outcome::passthrough;
    }
    return metrics::outcome::passthrough;
}

core::upstream_event to_event(const upstream::forward_result& r) {
    using upstream::forward_status;
    switch (r.status) {
    case forward_status::ok:
        return {core::upstream_result::response, r.res.result_int(), r.res.body().size()};
    case forward_status::connect_failed:
    case forward_status::pool_exhausted:
        return {core::upstream_result::not_sent, 0, 0};
    case forward_status::timeout_after_send:
        return {core::upstream_result::timed_out, 0, 0};
    case forward_status::reset_after_send:
        return {core::upstream_result::reset, 0, 0};
    case forward_status::response_too_large:
    case forward_status::bad_response:
        return {core::upstream_result::bad_response, 0, 0};
    }
    return {core::upstream_result::reset, 0, 0};
}

bool excluded(const config::idempotency_config& p, std::string_view name) {
    if (boost::beast::iequals(name, "date") || boost::beast::iequals(name, "content-length")) {
        return true; // regenerated on replay (SPEC §3.7)
    }
    if (!p.record_set_cookie && boost::beast::iequals(name, "set-cookie")) {
        return true; // a replayed cookie would hand the first caller's session to the key's holder
    }
    for (const auto& e : p.exclude_headers) {
        if (boost::beast::iequals(name, e)) {
            return true;
        }
    }
    return false;
}

std::vector<core::header_view> collect(const request& req, const std::vector<std::string>& names) {
    std::vector<core::header_view> out;
    for (const auto& n : names) {
        for (auto it = req.find(n); it != req.end() && boost::beast::iequals(it->name_string(), n);
             ++it) {
            out.emplace_back(n, it->value());
        }
    }
    return out;
}

/// The state shared by the exchange driver and its upstream call.
struct exchange_state {
    exchange_state(exchange_env& e, const config::route_config& r, std::size_t ri, request&& q,
                   net::any_io_executor ex)
        : env(e), route(r), route_index(ri), req(std::move(q)), fsm(r.idempotency), timer(ex) {}

    exchange_env& env;
    std::shared_ptr<const config::config> cfg_hold = env.cfg; ///< keeps `route` alive
    const config::route_config& route;
    std::size_t route_index;
    request req;
    core::exchange_fsm fsm;
    net::steady_timer timer; ///< the driver's wake-up; cancelled when the upstream answers
    std::string store_key;
    std::string fingerprint;
    std::string owner = random_hex_id();                     ///< fencing token of this attempt
    std::optional<upstream::forward_result> upstream_result; ///< set once the call ends
    bool upstream_pending = false;
    std::string claimed_record;         ///< completed claim: the record to replay
    std::optional<std::string> payload; ///< the encoded record, built once for all attempts
    clock::time_point upstream_started{};
    exchange_report report;
};

/// Builds the client-facing response of a respond action.
response respond_with(exchange_state& s, core::idempotency_status st) {
    // The response is moved out unless a later completion retry would still need its bytes.
    const bool keep = st == core::idempotency_status::unrecorded && !s.payload;
    response res = keep ? s.upstream_result->res : std::move(s.upstream_result->res);
    if (st != core::idempotency_status::none) {
        res.set("Idempotency-Status", core::to_string(st));
    }
    return res;
}

response replay_from(exchange_state& s) {
    auto rec = core::decode_record(s.claimed_record);
    if (!rec) {
        // The fsm only replays records the runner decoded at claim time.
        return make_problem(problem_code::store_unavailable, "stored record is unreadable", 11,
                            std::nullopt, 1u);
    }
    response res{static_cast<bhttp::status>(rec->status), 11};
    for (auto& [n, v] : rec->headers) {
        res.insert(n, v);
    }
    res.set(bhttp::field::date, http_date());
    res.set("Idempotency-Status", "replayed");
    if (s.route.idempotency.stripe_compat) {
        res.set("Idempotent-Replayed", "true");
    }
    res.body() = std::move(rec->body);
    res.prepare_payload();
    return res;
}

std::string build_payload(exchange_state& s, const core::action& a) {
    core::response_record rec;
    if (a.record == core::record_kind::outcome_unknown_problem) {
        auto p = make_problem(problem_code::upstream_outcome_unknown,
                              problem_detail(core::problem_code::upstream_outcome_unknown));
        rec.status = p.result_int();
        for (const auto& f : p) {
            if (!excluded(s.route.idempotency, f.name_string())) {
                rec.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
            }
        }
        rec.body = std::move(p.body());
        return core::encode_record(rec);
    }
    auto& res = s.upstream_result->res;
    rec.status = res.result_int();
    rec.replayable = a.replayable;
    for (const auto& f : res) {
        if (!excluded(s.route.idempotency, f.name_string())) {
            rec.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
        }
    }
    if (a.replayable) {
        rec.body = res.body();
    }
    return core::encode_record(rec);
}

const std::string& record_payload(exchange_state& s, const core::action& a) {
    if (!s.payload) {
        s.payload = build_payload(s, a);
    }
    return *s.payload;
}

core::fence_event to_fence(const store::result<store::fence_status>& r) {
    if (!r) {
        return core::fence_event::store_error;
    }
    return *r == store::fence_status::ok ? core::fence_event::ok : core::fence_event::not_owner;
}

net::awaitable<void> call_upstream(std::shared_ptr<exchange_state> s) {
    auto r = co_await s->env.fwd.async_forward(s->route.upstream_index, s->req,
                                               s->route.limits.max_response_bytes);
    s->report.upstream_ms =
        std::chrono::duration<double, std::milli>(clock::now() - s->upstream_started).count();
    s->env.reg.route(s->route_index).upstream_duration.observe(clock::now() - s->upstream_started);
    if (r.status == upstream::forward_status::ok) {
        // Once, here: both the record and the client response carry end-to-end headers only.
        strip_hop_by_hop(r.res);
    }
    s->upstream_result = std::move(r);
    s->upstream_pending = false;
    s->timer.cancel();
}

/// Does store-only actions until done (background completion retries after the client was
/// answered), and the whole exchange loop before that. Returns the client response when a
/// client-facing action comes up, or nullopt when the exchange ended without one.
net::awaitable<std::optional<response>> drive(std::shared_ptr<exchange_state> s, core::action a) {
    auto& st = *s->env.st;
    auto& rm = s->env.reg.route(s->route_index);
    for (;;) {
        const auto store_start = clock::now();
        auto store_done = [&] {
            const auto d = clock::now() - store_start;
            rm.store_duration.observe(d);
            s->report.store_ms += std::chrono::duration<double, std::milli>(d).count();
        };
        switch (a.kind) {
        case core::action_kind::claim: {
            // Named, then moved: g++ 12 destroys a braced temporary argument of a coroutine
            // twice inside a co_await expression.
            store::claim_request creq{s->store_key, s->fingerprint, s->owner, a.lease};
            auto r = co_await st.async_claim(std::move(creq));
            store_done();
            core::claim_event ev;
            if (!r) {
                s->env.reg.store_errors.fetch_add(1, std::memory_order_relaxed);
                ev.kind = core::claim_result_kind::store_error;
            } else {
                switch (r->status) {
                case store::claim_status::acquired:
                    ev.kind = core::claim_result_kind::acquired;
                    break;
                case store::claim_status::in_flight:
                    ev.kind = core::claim_result_kind::in_flight;
                    ev.remaining_lease = r->remaining_lease;
                    break;
                case store::claim_status::mismatch:
                    ev.kind = core::claim_result_kind::mismatch;
                    break;
                case store::claim_status::completed: {
                    auto rec = core::decode_record(r->record);
                    if (!rec) {
                        // The request did run (the record exists) but this version cannot
                        // read what was kept: never fail open into a second execution.
                        s->env.reg.store_errors.fetch_add(1, std::memory_order_relaxed);
                        ev.kind = core::claim_result_kind::completed;
                        ev.replayable = false;
                    } else {
                        ev.kind = core::claim_result_kind::completed;
                        ev.replayable = rec->replayable;
                        s->claimed_record = std::move(r->record);
                    }
                    break;
                }
                }
            }
            a = s->fsm.on_claim(ev, clock::now());
            break;
        }
        case core::action_kind::forward:
            s->upstream_pending = true;
            s->upstream_started = clock::now();
            net::co_spawn(s->timer.get_executor(), call_upstream(s), net::detached);
            [[fallthrough]];
        case core::action_kind::wait_until: {
            // Only a finished upstream call the fsm has not heard of yet cuts the wait short.
            // Any other wait (completion retry backoff after the upstream answered, re-claim
            // backoff) must sleep: an early tick returns the same wait_until, so skipping the
            // timer there spins the worker thread until the lease ends.
            const auto upstream_outcome_due = [&] {
                return s->upstream_result && s->fsm.current_state() == core::state::forwarding;
            };
            if (!upstream_outcome_due()) {
                s->timer.expires_at(a.wake_at);
                co_await s->timer.async_wait(use_tuple);
            }
            if (upstream_outcome_due()) {
                a = s->fsm.on_upstream(to_event(*s->upstream_result), clock::now());
            } else {
                a = s->fsm.on_tick(clock::now());
            }
            break;
        }
        case core::action_kind::extend_lease: {
            std::string k = s->store_key;
            std::string o = s->owner;
            auto r = co_await st.async_extend(std::move(k), std::move(o), a.lease);
            store_done();
            if (!r) {
                s->env.reg.store_errors.fetch_add(1, std::memory_order_relaxed);
            }
            a = s->fsm.on_extend(to_fence(r), clock::now());
            break;
        }
        case core::action_kind::complete: {
            std::string k = s->store_key;
            std::string o = s->owner;
            std::string payload = record_payload(*s, a);
            auto r =
                co_await st.async_complete(std::move(k), std::move(o), std::move(payload), a.ttl);
            store_done();
            if (!r) {
                s->env.reg.store_errors.fetch_add(1, std::memory_order_relaxed);
            }
            a = s->fsm.on_complete(to_fence(r), clock::now());
            break;
        }
        case core::action_kind::release: {
            std::string k = s->store_key;
            std::string o = s->owner;
            auto r = co_await st.async_release(std::move(k), std::move(o));
            store_done();
            if (!r) {
                s->env.reg.store_errors.fetch_add(1, std::memory_order_relaxed);
            }
            a = s->fsm.on_release(to_fence(r), clock::now());
            break;
        }
        case core::action_kind::replay:
            co_return replay_from(*s);
        case core::action_kind::respond:
            co_return respond_with(*s, a.status_header);
        case core::action_kind::reject: {
            std::optional<unsigned> retry;
            if (a.retry_after.count() > 0) {
                retry = static_cast<unsigned>(a.retry_after.count());
            }
            std::string_view detail = problem_detail(a.problem);
            if (a.problem == core::problem_code::upstream_unavailable && s->upstream_result &&
                !upstream::nothing_sent(s->upstream_result->status)) {
                detail = "the connection to the upstream failed after the request was sent; the "
                         "upstream may have processed it";
            }
            auto res = make_problem(
                to_http(a.problem), detail, 11,
                a.http_status ? std::optional<unsigned>(a.http_status) : std::nullopt, retry);
            if (a.status_header != core::idempotency_status::none) {
                res.set("Idempotency-Status", core::to_string(a.status_header));
            }
            co_return res;
        }
        case core::action_kind::passthrough: {
            s->upstream_started = clock::now();
            co_await call_upstream(s);
            if (s->upstream_result->status == upstream::forward_status::ok) {
                co_return respond_with(*s, core::idempotency_status::none);
            }
            co_return upstream_failure(s->upstream_result->status, s->env.reg);
        }
        case core::action_kind::done:
            co_return std::nullopt;
        }
    }
}

void finish(exchange_state& s) {
    if (auto o = s.fsm.outcome()) {
        s.report.outcome = to_metric(*o);
        s.env.reg.route(s.route_index)
            .outcomes[static_cast<std::size_t>(s.report.outcome)]
            .fetch_add(1, std::memory_order_relaxed);
    }
}

/// Background part: store-only actions after the client was answered.
net::awaitable<void> drive_background(std::shared_ptr<exchange_state> s, core::action a) {
    auto r = co_await drive(s, a);
    (void)r; // store-only by the fsm contract: no further client-facing action
    finish(*s);
    --background_count;
}

} // namespace

response upstream_failure(upstream::forward_status s, metrics::registry& reg) {
    using upstream::forward_status;
    switch (s) {
    case forward_status::timeout_after_send:
        reg.upstream_timeouts.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_timeout, "the upstream did not answer in time");
    case forward_status::response_too_large:
    case forward_status::bad_response:
        reg.upstream_errors.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_bad_response,
                            s == forward_status::response_too_large
                                ? "the upstream response exceeds max_response_bytes"
                                : "the upstream response could not be parsed");
    case forward_status::pool_exhausted:
        reg.upstream_errors.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_unavailable,
                            "no upstream connection available within connect_timeout");
    default:
        reg.upstream_errors.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_unavailable,
                            s == forward_status::connect_failed
                                ? "could not connect to the upstream"
                                : "the upstream closed the connection before a full response");
    }
}

std::size_t background_exchanges() noexcept {
    return background_count.load();
}

bool is_guarded(const config::route_config& route, std::string_view method) noexcept {
    return core::guards_method(route.idempotency, method);
}

net::awaitable<response> async_run_exchange(exchange_env& env, const config::route_config& route,
                                            std::size_t route_index, request& req,
                                            exchange_report& report) {
    const auto& pol = route.idempotency;
    auto ex = co_await net::this_coro::executor;
    auto s = std::make_shared<exchange_state>(env, route, route_index, std::move(req), ex);

    // Request facts: the key (header or natural), scope and fingerprint (SPEC §3.1, 3.3-3.5).
    core::request_facts facts;
    facts.guarded = true;
    std::optional<std::string> key;
    if (!pol.key.json_pointer.empty()) {
        key = core::extract_json_pointer(s->req.body(), pol.key.json_pointer);
        if (!key) {
            facts.key = core::key_presence::missing;
        } else if (key->empty() || key->size() > pol.key.max_length) {
            facts.key = core::key_presence::invalid;
        }
    } else {
        std::vector<std::string_view> lines;
        for (auto it = s->req.find(pol.key.header);
             it != s->req.end() && boost::beast::iequals(it->name_string(), pol.key.header); ++it) {
            lines.push_back(it->value());
        }
        if (lines.empty()) {
            facts.key = core::key_presence::missing;
        } else {
            auto parsed = core::parse_idempotency_key(lines, pol.key.syntax, pol.key.max_length);
            if (parsed.ok()) {
                key = std::move(parsed.key);
            } else {
                facts.key = core::key_presence::invalid;
            }
        }
        if (!pol.key.forward) {
            s->req.erase(pol.key.header);
        }
    }
    if (facts.key == core::key_presence::present) {
        const auto scope = collect(s->req, pol.scope_headers);
        s->store_key = core::store_key("", route.name, core::principal_hash(scope), *key);
        core::fingerprint_input fi;
        fi.method = s->req.method_string();
        fi.target = s->req.target();
        fi.headers = collect(s->req, pol.fingerprint_headers);
        fi.content_type = s->req[bhttp::field::content_type];
        fi.body = s->req.body();
        fi.json_canonical = pol.json_canonical;
        s->fingerprint = core::compute_fingerprint(fi);
        s->report.key_hash = s->store_key;
    }

    auto first = s->fsm.start(facts, clock::now());
    auto res = co_await drive(s, first);
    response out;
    if (res) {
        out = std::move(*res);
        auto next = s->fsm.on_responded(clock::now());
        if (next.kind != core::action_kind::done) {
            // Answered (e.g. unrecorded); completion retries go on without the client.
            report = s->report;
            report.outcome = metrics::outcome::store_error; // answered unrecorded, so far
            ++background_count;
            net::co_spawn(ex, drive_background(s, next), net::detached);
            co_return out;
        }
    } else {
        out = make_problem(problem_code::bad_request, "exchange ended without an answer");
    }
    finish(*s);
    report = s->report;
    co_return out;
}

} // namespace onceproxy::http
