#pragma once
// The pure translations between the exchange engine (core::exchange_fsm) and HTTP: store and
// upstream results become engine events, engine actions become responses, and an upstream
// answer becomes the record replays are made of. No I/O, no clock reads: exchange_runner does
// the I/O and calls these, and unit tests call them directly.

#include "onceproxy/config/config.hpp"
#include "onceproxy/core/exchange_fsm.hpp"
#include "onceproxy/core/response_record.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/store/store.hpp"
#include "onceproxy/upstream/forwarder.hpp"
#include "onceproxy/wire/raw_header_store.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::http {

/// The header stating until when an answer's record is replayed: recorded-at + the route's ttl,
/// as an IMF-fixdate. On every answer that carries a record (the first `stored` one and every
/// replay) and on the 409 of a record that is not replayable (the key stays consumed until
/// then); never on an answer that left no record.
inline constexpr std::string_view idempotency_expires = "Idempotency-Expires";

/// How a forward attempt ended, as the engine sees it (SPEC §2: only a connect failure is
/// certainly without effect). `body_bytes` is the size of the body received. An answer whose
/// body outgrew the hold limit (`rest` set) is `streaming`.
[[nodiscard]] core::upstream_event to_upstream_event(upstream::forward_status status,
                                                     unsigned http_status,
                                                     std::size_t body_bytes) noexcept;
/// `grpc_call`: the request is a gRPC call, whose answer's grpc-status (grpc_status_of)
/// decides what becomes of the key.
[[nodiscard]] core::upstream_event to_upstream_event(const upstream::forward_result& r,
                                                     bool grpc_call = false) noexcept;

/// A gRPC answer's status: grpc-status from the trailers, or from the head of a trailers-only
/// answer; UNKNOWN when malformed; without one, what gRPC makes of the HTTP status.
[[nodiscard]] unsigned grpc_status_of(const response& res,
                                      const boost::beast::http::fields& trailers) noexcept;

/// The `cause` label of metrics::family::store_errors for a failed store operation's error.
[[nodiscard]] metrics::store_error_cause
store_error_cause_of(const boost::system::error_code& ec) noexcept;

/// A claim result as the engine event, plus the record to replay when one was found.
struct claim_translation {
    core::claim_event event;
    /// Completed and readable: the record decoded, viewing the caller's `record` (see below).
    std::optional<core::response_record_view> view;
    std::string expires;      ///< completed and readable: its Idempotency-Expires ("" if none)
    bool store_error = false; ///< the store failed (count it, by `error`)
    boost::system::error_code error; ///< store_error: why
    bool unreadable = false; ///< a record exists but cannot be decoded (count as store error)
    /// Set when the record exists but does not open (encryption at rest): why, for
    /// metrics::family::record_decrypt_failures. `unreadable` is set too.
    std::optional<core::record_open_failure> open_failure;
};

/// Translates a claim result. A completed record is opened with `cipher` (encryption at rest;
/// null: off) bound to `store_key`, `fingerprint` (the request's: a completed claim matched it)
/// and the claim's created_ms as stored; `record` (the caller's) then holds the encoded record
/// in plaintext, and the translation's `view` its decoded form: decoded once, valid while
/// `record` stays as it is. Otherwise `record` is left empty. A completed record that cannot be
/// opened or decoded is reported as completed and not replayable: the request did run, so it
/// must never run again, and what cannot be read is never replayed.
[[nodiscard]] claim_translation to_claim_event(store::result<store::claim_result>&& r,
                                               std::string& record,
                                               const core::record_cipher* cipher = nullptr,
                                               std::string_view store_key = {},
                                               std::string_view fingerprint = {});

/// Result of a fenced store operation (extend, complete, release) as the engine event.
[[nodiscard]] core::fence_event
to_fence_event(const store::result<store::fence_status>& r) noexcept;

/// True when response header `name` is never recorded: Date and Content-Length (regenerated
/// on replay, SPEC §3.7), the upstream's own Idempotency-Expires (the proxy states the
/// record's), Set-Cookie unless record_set_cookie, and the route's exclude_headers.
[[nodiscard]] bool excluded_from_record(const config::idempotency_config& policy,
                                        std::string_view name) noexcept;
/// The same for a field whose Beast code is known (`code`: field::unknown for others).
[[nodiscard]] bool excluded_from_record(const config::idempotency_config& policy,
                                        boost::beast::http::field code,
                                        std::string_view name) noexcept;

/// The record of an upstream response: status, the headers not excluded, and the body when
/// `replayable` (a not-replayable record keeps no body).
[[nodiscard]] core::response_record
record_of(const response& res, const config::idempotency_config& policy, bool replayable);

/// The encoded payload of a complete action: the upstream response (`upstream`, required for
/// record_kind::upstream_response) or the upstream.outcome_unknown problem, with `expires` (an
/// IMF-fixdate; none when empty) recorded as its Idempotency-Expires header, and the upstream
/// answer's `trailers`; sealed by `cipher`, bound to `bound`, when encryption at rest is on.
/// `raw_fields`: the upstream answer's header fields as received (forward_result::raw_fields),
/// its hop-by-hop ones left out here; null: `upstream`'s own fields, already stripped.
[[nodiscard]] std::string record_payload(const core::action& a, const response* upstream,
                                         const config::idempotency_config& policy,
                                         std::string_view expires,
                                         const core::record_cipher* cipher = nullptr,
                                         const core::record_binding& bound = {},
                                         const boost::beast::http::fields* trailers = nullptr,
                                         const wire::raw_header_store* raw_fields = nullptr);

/// How the store may treat the record of complete action `a`: evictable for an upstream answer
/// outside 2xx; kept for a 2xx answer and for an uncertain outcome (a retry must not run it).
[[nodiscard]] store::record_kind record_kind_of(const core::action& a,
                                                const response* upstream) noexcept;

/// The Idempotency-Expires a record carries ("" for a record written before it existed).
[[nodiscard]] std::string_view record_expires(const core::response_record& rec) noexcept;
[[nodiscard]] std::string_view record_expires(const core::response_record_view& rec) noexcept;

/// Sets Idempotency-Expires to `expires`, or removes it when empty (an upstream's own header
/// must not pass for the proxy's on an answer that left no record).
void set_idempotency_expires(response& res, std::string_view expires);

/// Sets Idempotency-Status on a respond or reject answer (nothing for `none`).
void set_idempotency_status(response& res, core::idempotency_status st);

/// The replay of an encoded record with a fresh `date`, Idempotency-Status: replayed (and
/// Idempotent-Replayed: true with `stripe_compat`), and a Content-Length unless its status
/// carries no body (1xx, 204, 304: RFC 9110 §8.6). A record that cannot be decoded gives a 503
/// store_unavailable problem (the engine only replays records decoded at claim time). The
/// answer's body reuses `encoded`'s buffer (the body is the encoding's tail): no copy of it.
/// The record's trailers are added to `trailers` when given.
[[nodiscard]] response replay_response(std::string encoded, bool stripe_compat,
                                       std::string_view date,
                                       boost::beast::http::fields* trailers = nullptr);

/// The head of a replay to an HTTP/1.1 client, serialised into `out` straight from the decoded
/// record (no header map): the head replay_response's answer gets from the server's write step
/// (Connection: close unless `keep`). Returns the body to write after it: the record's, or
/// none for a HEAD request or a status that carries none (1xx, 204, 304: no Content-Length).
[[nodiscard]] std::string_view serialize_replay_head(const core::response_record_view& rec,
                                                     bool stripe_compat, std::string_view date,
                                                     bool keep, bool head_request,
                                                     std::string& out);

/// The head of an upstream answer (hop-by-hop fields already gone) as an HTTP/1.1 client gets
/// it, serialised into `out` straight from the upstream's head: its fields, then
/// Idempotency-Status `st` (none: not stated), Idempotency-Expires `expires` (empty: none;
/// the upstream's own is never passed on), Transfer-Encoding: chunked when `chunked`,
/// Content-Length `length` when given and the head states none, and Connection: close unless
/// `keep` (`chunked` and `length` are never both given). The head set_idempotency_status,
/// set_idempotency_expires and the server's write step would give it, without editing a copy
/// of the header map. `raw_fields`: the answer's fields and reason phrase as received
/// (forward_result::raw_fields), its hop-by-hop ones left out here; null: `upstream_head`'s.
void serialize_answer_head(const response& upstream_head, core::idempotency_status st,
                           std::string_view expires, bool chunked,
                           std::optional<std::size_t> length, bool keep, std::string& out,
                           const wire::raw_header_store* raw_fields = nullptr);

/// The problem answer of a reject action. `upstream`: how the upstream call ended, when there
/// was one (a reset after sending says so in the detail, a full pool names `upstream_name`).
[[nodiscard]] response reject_response(const core::action& a,
                                       std::optional<upstream::forward_status> upstream,
                                       std::string_view upstream_name = {});

/// The problem a client sees for a failed plain forward (SPEC §3.2). `upstream_name` is named
/// when one of its limits (max_connections, max_tunnels) was the cause.
[[nodiscard]] response upstream_failure_problem(upstream::forward_status s,
                                                std::string_view upstream_name = {});

/// "connection limit of upstream 'app' reached ..." (pool_exhausted) or "tunnel limit of
/// upstream 'app' reached ..." (tunnel_limit).
[[nodiscard]] std::string upstream_limit_detail(upstream::forward_status s,
                                                std::string_view upstream_name);

/// The outcome of a request whose exchange produced no answer at all (a driver bug; the client
/// still gets a problem).
[[nodiscard]] response no_answer_problem();

/// RFC 9110 §5.6.7 IMF-fixdate of `t` (seconds since the epoch).
[[nodiscard]] std::string http_date(std::int64_t t);

} // namespace onceproxy::http
