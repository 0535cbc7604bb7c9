#include "http/exchange_translation.hpp"

#include "http/http_date.hpp"
#include "onceproxy/core/grpc.hpp"
#include "onceproxy/http/raw_response_head.hpp"
#include "onceproxy/store/error.hpp"
#include "onceproxy/wire/head_writer.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include <charconv>
#include <iterator>
#include <optional>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;

core::upstream_event to_upstream_event(upstream::forward_status status, unsigned http_status,
                                       std::size_t body_bytes) noexcept {
    using upstream::forward_status;
    switch (status) {
    case forward_status::ok:
        return {core::upstream_result::response, http_status, body_bytes};
    case forward_status::connect_failed:
    case forward_status::pool_exhausted:
    case forward_status::tls_failed:
    case forward_status::tunnel_limit:
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

core::upstream_event to_upstream_event(const upstream::forward_result& r, bool grpc_call) noexcept {
    auto ev = to_upstream_event(r.status, r.res.result_int(), r.res.body().size());
    if (r.status == upstream::forward_status::ok && r.rest) {
        ev.kind = core::upstream_result::streaming; // the rest of the body is still coming
    }
    if (grpc_call && ev.kind == core::upstream_result::response) {
        ev.grpc_status = grpc_status_of(r.res, r.trailers);
    }
    return ev;
}

unsigned grpc_status_of(const response& res, const bhttp::fields& trailers) noexcept {
    // In the trailers; in the head of a trailers-only answer.
    for (const auto* in : {&trailers, static_cast<const bhttp::fields*>(&res.base())}) {
        if (const auto it = in->find("grpc-status"); it != in->end()) {
            return core::parse_grpc_status(it->value())
                .value_or(static_cast<unsigned>(core::grpc_status::unknown));
        }
    }
    // None at all: what a gRPC client makes of the HTTP status (200 without one: UNKNOWN).
    return static_cast<unsigned>(core::grpc_status_of_http(res.result_int()));
}

metrics::store_error_cause store_error_cause_of(const boost::system::error_code& ec) noexcept {
    using metrics::store_error_cause;
    if (ec.category() != store::store_category()) {
        return store_error_cause::other;
    }
    switch (static_cast<store::errc>(ec.value())) {
    case store::errc::unavailable:
        return store_error_cause::unavailable;
    case store::errc::timeout:
        return store_error_cause::timeout;
    case store::errc::not_replicated:
        return store_error_cause::not_replicated;
    case store::errc::store_full:
        return store_error_cause::store_full;
    case store::errc::holder_full:
        return store_error_cause::holder_full;
    case store::errc::auth_failed:
        return store_error_cause::auth_failed;
    case store::errc::tls_failed:
        return store_error_cause::tls_failed;
    case store::errc::protocol:
    case store::errc::script_missing:
        return store_error_cause::protocol;
    }
    return store_error_cause::other;
}

claim_translation to_claim_event(store::result<store::claim_result>&& r, std::string& record,
                                 const core::record_cipher* cipher, std::string_view store_key,
                                 std::string_view fingerprint) {
    claim_translation out;
    record.clear();
    if (!r) {
        out.store_error = true;
        out.error = r.error();
        out.event.kind = core::claim_result_kind::store_error;
        return out;
    }
    switch (r->status) {
    case store::claim_status::acquired:
        out.event.kind = core::claim_result_kind::acquired;
        break;
    case store::claim_status::in_flight:
        out.event.kind = core::claim_result_kind::in_flight;
        out.event.remaining_lease = r->remaining_lease;
        break;
    case store::claim_status::mismatch:
        out.event.kind = core::claim_result_kind::mismatch;
        break;
    case store::claim_status::completed: {
        out.event.kind = core::claim_result_kind::completed;
        if (cipher != nullptr || core::is_sealed(r->record)) {
            core::record_open_failure why{};
            const core::record_binding bound{store_key, fingerprint, r->created_ms};
            auto plain = core::open_stored_record(std::move(r->record), cipher, bound, &why);
            if (!plain) {
                // Not replayed (it may be another key's record, or altered) and not executed
                // again (the request may have run): answered as a record kept without its body.
                out.unreadable = true;
                out.open_failure = why;
                out.event.replayable = false;
                break;
            }
            r->record = std::move(*plain);
        }
        record = std::move(r->record);
        out.view = core::decode_record_view(record);
        if (!out.view) {
            // The request did run (the record exists) but this version cannot read what was
            // kept: never fail open into a second execution.
            record.clear();
            out.unreadable = true;
            out.event.replayable = false;
        } else {
            out.event.replayable = out.view->replayable;
            out.expires = std::string(record_expires(*out.view));
        }
        break;
    }
    }
    return out;
}

core::fence_event to_fence_event(const store::result<store::fence_status>& r) noexcept {
    if (!r) {
        return core::fence_event::store_error;
    }
    return *r == store::fence_status::ok ? core::fence_event::ok : core::fence_event::not_owner;
}

bool excluded_from_record(const config::idempotency_config& policy,
                          std::string_view name) noexcept {
    return excluded_from_record(policy, boost::beast::http::string_to_field(name), name);
}

bool excluded_from_record(const config::idempotency_config& policy, boost::beast::http::field code,
                          std::string_view name) noexcept {
    using boost::beast::iequals;
    using boost::beast::http::field;
    if (code == field::date || code == field::content_length) {
        return true; // regenerated on replay (SPEC §3.7)
    }
    if (code == field::unknown && iequals(name, idempotency_expires)) {
        return true; // the proxy's to state: the record carries its own, added by record_payload
    }
    if (!policy.record_set_cookie && code == field::set_cookie) {
        return true; // a replayed cookie would hand the first caller's session to the key's holder
    }
    for (const auto& e : policy.exclude_headers) {
        if (iequals(name, e)) {
            return true;
        }
    }
    return false;
}

namespace {

/// record_of's parts as views into `res`, its fields from `raw` when given (hop-by-hop ones
/// left out).
core::response_record_view record_view_of(const response& res,
                                          const config::idempotency_config& policy, bool replayable,
                                          const wire::raw_header_store* raw = nullptr) {
    core::response_record_view rec;
    rec.status = res.result_int();
    rec.replayable = replayable;
    // One allocation: every field, and the Idempotency-Expires record_payload adds.
    if (raw != nullptr) {
        rec.headers.reserve(raw->size() + 1);
        for_each_end_to_end(*raw, [&](const wire::raw_header_store::field_line& f) {
            if (!excluded_from_record(policy, f.name, f.name_string)) {
                rec.headers.emplace_back(f.name_string, f.value);
            }
        });
    } else {
        rec.headers.reserve(static_cast<std::size_t>(std::distance(res.begin(), res.end())) + 1);
        for (const auto& f : res) {
            if (!excluded_from_record(policy, f.name(), f.name_string())) {
                rec.headers.emplace_back(f.name_string(), f.value());
            }
        }
    }
    if (replayable) {
        rec.body = res.body();
    }
    return rec;
}

} // namespace

core::response_record record_of(const response& res, const config::idempotency_config& policy,
                                bool replayable) {
    const auto v = record_view_of(res, policy, replayable);
    core::response_record rec;
    rec.status = v.status;
    rec.replayable = v.replayable;
    rec.headers.reserve(v.headers.size());
    for (const auto& [name, value] : v.headers) {
        rec.headers.emplace_back(std::string(name), std::string(value));
    }
    rec.body = v.body;
    return rec;
}

std::string record_payload(const core::action& a, const response* upstream,
                           const config::idempotency_config& policy, std::string_view expires,
                           const core::record_cipher* cipher, const core::record_binding& bound,
                           const bhttp::fields* trailers,
                           const wire::raw_header_store* raw_fields) {
    // The record's parts are views into the response they come from (a problem is made here
    // and kept until encoded).
    std::optional<response> made;
    const response* from = upstream;
    bool replayable = a.replayable;
    if (a.record == core::record_kind::outcome_unknown_problem) {
        made = make_problem(problem_code::upstream_outcome_unknown);
        replayable = true;
    } else if (upstream == nullptr) {
        // The engine asks to record an upstream response only after one arrived.
        made = no_answer_problem();
        replayable = false;
    }
    if (made) {
        from = &*made;
    }
    auto rec = record_view_of(*from, policy, replayable, from == upstream ? raw_fields : nullptr);
    if (!expires.empty()) {
        // Kept as a recorded header rather than a new field of the encoding: a replay then
        // states it with no further work, and a replica still on the previous version (which
        // refuses unknown flags or versions, so would read the record as unreadable and answer
        // 409) replays it too, so a rolling upgrade changes no answer.
        rec.headers.emplace_back(idempotency_expires, expires);
    }
    if (trailers != nullptr && from == upstream) {
        for (const auto& f : *trailers) {
            rec.trailers.emplace_back(f.name_string(), f.value());
        }
    }
    return core::encode_stored_record(rec, cipher, bound);
}

store::record_kind record_kind_of(const core::action& a, const response* upstream) noexcept {
    if (a.record != core::record_kind::upstream_response || upstream == nullptr) {
        return store::record_kind::kept;
    }
    const unsigned status = upstream->result_int();
    return status >= 200 && status < 300 ? store::record_kind::kept : store::record_kind::evictable;
}

namespace {

template <class Headers>
std::string_view expires_in(const Headers& headers) noexcept {
    for (const auto& [name, value] : headers) {
        if (boost::beast::iequals(name, idempotency_expires)) {
            return value;
        }
    }
    return {};
}

} // namespace

std::string_view record_expires(const core::response_record& rec) noexcept {
    return expires_in(rec.headers);
}

std::string_view record_expires(const core::response_record_view& rec) noexcept {
    return expires_in(rec.headers);
}

void set_idempotency_expires(response& res, std::string_view expires) {
    if (expires.empty()) {
        res.erase(idempotency_expires);
    } else {
        res.set(idempotency_expires, expires);
    }
}

void set_idempotency_status(response& res, core::idempotency_status st) {
    if (st != core::idempotency_status::none) {
        res.set("Idempotency-Status", core::to_string(st));
    }
}

namespace {

/// A status whose answer carries no body and no Content-Length (RFC 9110 §8.6).
bool bodiless(unsigned status) noexcept {
    return status < 200 || status == 204 || status == 304;
}

/// The end of a head: Content-Length `length` when given, Connection: close unless `keep`,
/// then the blank line.
void end_head(std::optional<std::size_t> length, bool keep, std::string& out) {
    if (length) {
        char digits[24];
        const auto n = std::to_chars(std::begin(digits), std::end(digits), *length).ptr;
        out.append("Content-Length: ").append(digits, n).append("\r\n");
    }
    if (!keep) {
        out.append("Connection: close\r\n");
    }
    out.append("\r\n");
}

} // namespace

response replay_response(std::string encoded, bool stripe_compat, std::string_view date,
                         bhttp::fields* trailers) {
    const auto rec = core::decode_record_view(encoded);
    if (!rec) {
        return make_problem(problem_code::store_unavailable, "stored record is unreadable",
                            {.retry_after_s = 1});
    }
    response res{static_cast<bhttp::status>(rec->status), 11};
    for (const auto& [n, v] : rec->headers) {
        res.insert(n, v);
    }
    res.set(bhttp::field::date, date);
    res.set("Idempotency-Status", "replayed");
    if (stripe_compat) {
        res.set("Idempotent-Replayed", "true");
    }
    if (trailers != nullptr) {
        for (const auto& [n, v] : rec->trailers) {
            trailers->insert(n, v);
        }
    }
    // The body is the encoding's tail: moved to the front of the same buffer, which becomes the
    // answer's body (no allocation, no second buffer). `rec` points into `encoded`: not used
    // after this.
    const auto body_at = static_cast<std::size_t>(rec->body.data() - encoded.data());
    const bool body = !bodiless(rec->status);
    encoded.erase(0, rec->body.empty() || !body ? encoded.size() : body_at);
    res.body() = std::move(encoded);
    if (body) {
        res.content_length(res.body().size());
    }
    return res;
}

std::string_view serialize_replay_head(const core::response_record_view& rec, bool stripe_compat,
                                       std::string_view date, bool keep, bool head_request,
                                       std::string& out) {
    constexpr std::string_view status_name = "Idempotency-Status";
    constexpr std::string_view stripe_name = "Idempotent-Replayed";
    out.clear();
    wire::append_status_line(11, rec.status, {}, out);
    for (const auto& [name, value] : rec.headers) {
        // Stated afresh below, as replay_response's `set`s replace them.
        if (boost::beast::iequals(name, status_name) ||
            (stripe_compat && boost::beast::iequals(name, stripe_name))) {
            continue;
        }
        out.append(name).append(": ").append(value).append("\r\n");
    }
    out.append("Date: ").append(date).append("\r\n");
    out.append(status_name).append(": replayed\r\n");
    if (stripe_compat) {
        out.append(stripe_name).append(": true\r\n");
    }
    const bool body = !bodiless(rec.status);
    end_head(body ? std::optional(rec.body.size()) : std::nullopt, keep, out);
    return body && !head_request ? rec.body : std::string_view();
}

void serialize_answer_head(const response& upstream_head, core::idempotency_status st,
                           std::string_view expires, bool chunked,
                           std::optional<std::size_t> length, bool keep, std::string& out,
                           const wire::raw_header_store* raw_fields) {
    out.clear();
    const bool stated = st != core::idempotency_status::none;
    bool has_length = false;
    // Every field but those the proxy states itself. Hop-by-hop fields are gone from a Beast
    // head (strip_hop_by_hop) and left out of raw ones.
    const auto passed_on = [&](bhttp::field code, std::string_view name) {
        switch (code) {
        case bhttp::field::content_length:
            has_length = true;
            break;
        case bhttp::field::transfer_encoding:
            return !chunked; // else stated below
        case bhttp::field::connection:
            return keep;
        case bhttp::field::unknown:
            // The proxy's to state.
            return !boost::beast::iequals(name, idempotency_expires) &&
                   !(stated && boost::beast::iequals(name, "Idempotency-Status"));
        default:
            break;
        }
        return true;
    };
    if (raw_fields != nullptr) {
        out.reserve(128 + raw_fields->lines().size() + expires.size());
        wire::append_status_line(11, upstream_head.result_int(), raw_fields->reason(), out);
        for_each_end_to_end(*raw_fields, [&](const wire::raw_header_store::field_line& f) {
            if (passed_on(f.name, f.name_string)) {
                out += f.line;
            }
        });
    } else {
        wire::append_status_line(11, upstream_head.result_int(), upstream_head.reason(), out);
        for (const auto& f : upstream_head) {
            if (passed_on(f.name(), f.name_string())) {
                out.append(f.name_string()).append(": ").append(f.value()).append("\r\n");
            }
        }
    }
    if (stated) {
        out.append("Idempotency-Status: ").append(core::to_string(st)).append("\r\n");
    }
    if (!expires.empty()) {
        out.append(idempotency_expires).append(": ").append(expires).append("\r\n");
    }
    if (chunked) {
        out.append("Transfer-Encoding: chunked\r\n");
    }
    end_head(has_length ? std::nullopt : length, keep, out);
}

std::string upstream_limit_detail(upstream::forward_status s, std::string_view upstream_name) {
    if (s == upstream::forward_status::tunnel_limit) {
        return "tunnel limit of upstream '" + std::string(upstream_name) +
               "' reached: its max_tunnels upgraded connections are open; retry later";
    }
    return "connection limit of upstream '" + std::string(upstream_name) +
           "' reached: its max_connections were all in use for connect_timeout; the request "
           "was not sent";
}

response reject_response(const core::action& a, std::optional<upstream::forward_status> upstream,
                         std::string_view upstream_name) {
    std::optional<unsigned> retry;
    if (a.retry_after.count() > 0) {
        retry = static_cast<unsigned>(a.retry_after.count());
    }
    if (a.problem == problem_code::upstream_unavailable && upstream &&
        *upstream == upstream::forward_status::tls_failed) {
        // Nothing was sent, as for a refused connection, but the cause has a code of its own.
        auto tls = a;
        tls.problem = problem_code::upstream_tls_error;
        return reject_response(tls, std::nullopt);
    }
    std::string detail(core::info(a.problem).detail);
    if (a.problem == problem_code::upstream_unavailable && upstream &&
        !upstream::nothing_sent(*upstream)) {
        detail = "the connection to the upstream failed after the request was sent; the "
                 "upstream may have processed it";
    } else if (a.problem == problem_code::upstream_unavailable && upstream &&
               *upstream == upstream::forward_status::pool_exhausted) {
        detail = upstream_limit_detail(*upstream, upstream_name);
    }
    auto res = make_problem(
        a.problem, detail,
        {.status = a.http_status ? std::optional<unsigned>(a.http_status) : std::nullopt,
         .retry_after_s = retry});
    set_idempotency_status(res, a.status_header);
    return res;
}

response upstream_failure_problem(upstream::forward_status s, std::string_view upstream_name) {
    using upstream::forward_status;
    switch (s) {
    case forward_status::timeout_after_send:
        return make_problem(problem_code::upstream_timeout);
    case forward_status::response_too_large:
        return make_problem(problem_code::upstream_bad_response,
                            "the upstream response exceeds max_response_bytes");
    case forward_status::bad_response:
        return make_problem(problem_code::upstream_bad_response,
                            "the upstream response could not be parsed");
    case forward_status::pool_exhausted:
        return make_problem(problem_code::upstream_unavailable,
                            upstream_limit_detail(s, upstream_name));
    case forward_status::tunnel_limit:
        return make_problem(problem_code::upstream_tunnel_limit,
                            upstream_limit_detail(s, upstream_name), {.retry_after_s = 1});
    case forward_status::connect_failed:
        return make_problem(problem_code::upstream_unavailable,
                            "could not connect to the upstream");
    case forward_status::tls_failed:
        return make_problem(problem_code::upstream_tls_error);
    case forward_status::ok:
    case forward_status::reset_after_send:
        break;
    }
    return make_problem(problem_code::upstream_unavailable,
                        "the upstream closed the connection before a full response");
}

response no_answer_problem() {
    return make_problem(problem_code::bad_request, "exchange ended without an answer");
}

std::string http_date(std::int64_t t) {
    return imf_fixdate(std::chrono::system_clock::time_point(std::chrono::seconds(t)));
}

} // namespace onceproxy::http
