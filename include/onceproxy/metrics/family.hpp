#pragma once
// Every metric family onceproxy exposes (SPEC §6), declared once: its name, type, HELP text,
// label names and values, buckets and when it is rendered. Nothing else names a metric: the
// registry (registry.hpp) sizes its series from this table and renders /metrics by a loop over
// it, and a unit test checks every family is documented in docs/operations.md.
//
// Renaming a family, a label or a label value is a breaking change for dashboards and alerts
// (deploy/monitoring): it must be deliberate.

#include "onceproxy/core/outcome.hpp"
#include "onceproxy/core/record_cipher.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace onceproxy::metrics {

/// The metric families, in the order /metrics renders them.
enum class family : std::uint8_t {
    requests,                  ///< {route,outcome}: each request's one final outcome
    record_decrypt_failures,   ///< {route,reason}
    store_round_trips,         ///< {route,outcome}
    observed,                  ///< {route,would}: observe mode
    keys_purged,               ///< {route,forced}: key administration
    request_duration,          ///< {route} histogram
    upstream_duration,         ///< {route} histogram
    store_duration,            ///< {route} histogram
    open_connections,          ///< gauge
    store_errors,              ///< {cause}: store_error_cause
    store_master_switches,     ///< {cause}: store::master_switch_cause (Sentinel only)
    upstream_errors,           ///< {kind}: upstream_error
    late_answers,              ///< {outcome}: core::late_answer
    upstream_resends,          ///<
    connection_limit,          ///< gauge
    connections_refused,       ///<
    accept_errors,             ///< {listener}: listener
    admin_connections_refused, ///<
    admin_auth_throttled,      ///<
    internal_errors,           ///<
    tunnels_total,             ///<
    tunnels_open,              ///< gauge
    tunnels_refused,           ///<
    access_log_dropped,        ///<
    client_timeouts,           ///< {phase}: timeout_phase
    buffered_bytes,            ///< gauge
    buffered_bytes_limit,      ///< gauge
    buffered_refusals,         ///<
    config_reloads,            ///< {result}: reload_result
    config_info,               ///< gauge {sha256}, always 1
    config_loaded_at,          ///< gauge, seconds since the epoch
    upstream_tls_reloads,      ///< {result}: file_reload
    event_loop_lag,            ///< gauge {worker}, computed when rendered
    worker_connections,        ///< gauge {worker}, kept per worker
    tls_certificate_reloads,   ///< {result}: file_reload (inbound TLS only)
    tls_certificate_expiry,    ///< gauge, seconds since the epoch (inbound TLS only)
    tls_handshake_failures,    ///< (inbound TLS only)
    client_connections,        ///< {protocol}: protocol
    client_requests,           ///< {protocol}: protocol
    http2_goaways,             ///< {reason}: goaway_reason
    egress_attempts,           ///< {route,result}: egress::attempt_result (egress routes)
    egress_retries,            ///< {route}
    egress_retries_denied,     ///< {route,reason}: egress::denial
    egress_circuit_refusals,   ///< {route}: refused at once, the breaker open
    egress_breaker_state,      ///< gauge {upstream,state}: egress::breaker_state, 1 for the current
    egress_breaker_transitions, ///< {upstream,to}: egress::breaker_state
};

/// Number of families (the last one is egress_breaker_transitions).
inline constexpr std::size_t family_count =
    static_cast<std::size_t>(family::egress_breaker_transitions) + 1;

// Label values that are not an enum of core. Each enum's order is the order of the values of
// its family's row below.

/// Why a store operation failed, the `cause` label of store_errors (http/ maps the store's
/// error codes onto it).
enum class store_error_cause : std::uint8_t {
    unavailable,    ///< not reachable, connection lost, or not connected yet
    timeout,        ///< no answer within command_timeout (the operation may have run)
    not_replicated, ///< durability replicated: too few replicas acknowledged within wait_timeout
    store_full,     ///< the memory store's byte budget is exhausted
    holder_full,    ///< the memory store's bound for one holder (max_bytes_per_holder) is reached
    auth_failed,    ///< credentials refused
    tls_failed,     ///< the TLS session with the store could not be set up
    protocol,       ///< a reply that is not valid for the command, or a script the store lacks
    unreadable,     ///< a record that does not decode or decrypt
    other,
};
inline constexpr std::size_t store_error_cause_count = 10;

/// The `kind` label of upstream_errors.
enum class upstream_error : std::uint8_t { unavailable, timeout };

/// The `listener` label of accept_errors.
enum class listener : std::uint8_t { proxy, admin };

/// The `protocol` label of client_connections and client_requests: how the client spoke.
enum class protocol : std::uint8_t { http1, h2 };

/// The `reason` label of http2_goaways: why the proxy ended an HTTP/2 connection with an
/// error (h2::end_reason, in its order).
enum class goaway_reason : std::uint8_t {
    protocol_error,
    rapid_reset,
    control_flood,
    header_flood
};

/// The `phase` label of client_timeouts: a header not received in time, a body cut (408).
enum class timeout_phase : std::uint8_t { header, body };

/// Results of a config reload (SIGHUP), the `result` label of config_reloads.
enum class reload_result : std::uint8_t {
    success,          ///< the new config serves new requests
    error,            ///< the file could not be read or is invalid; the running config stays
    restart_required, ///< the file changes settings bound at start; the running config stays
};
inline constexpr std::size_t reload_result_count = 3;

/// The `result` label of a reload of TLS files: in use now, or refused (the old ones stay).
enum class file_reload : std::uint8_t { success, failure };

/// How a family's series are kept and rendered.
enum class kind : std::uint8_t { counter, gauge, histogram };

/// Where a family's series live: one set for the process, one per route (first label
/// `route`, one series set per route ever configured, "(none)" for unrouted requests), one per
/// egress route (first label `route`), or one per upstream egress routes call (first label
/// `upstream`).
enum class scope : std::uint8_t { process, route, egress_route, upstream };

/// When a family (or one of its series) is rendered.
enum class shown : std::uint8_t {
    always,
    counted,        ///< a {route,outcome} series only once that outcome was counted
    follows_master, ///< only when the store follows a master that can move (Sentinel)
    workers,        ///< only once the workers are known, one series per worker
    inbound_tls,    ///< only when the proxy listener serves TLS
    egress,         ///< only when egress routes are configured (their series exist)
};

/// Where the value of a series comes from when it is not a plain cell of the registry.
enum class source : std::uint8_t {
    cells,              ///< counters and gauges the code updates (one cell per label value)
    config_digest,      ///< the label value is the config digest, the value is 1
    event_loop_lag,     ///< computed from each worker's ticks when rendered (seconds, 6 decimals)
    worker_connections, ///< each worker's count of open client connections
};

/// The values of a family's label (other than `route`): listed in the row, or the names of a
/// core enum (core owns them: core::to_string).
struct label_values {
    static constexpr std::size_t max_listed = 10;
    std::size_t count = 0;
    std::array<std::string_view, max_listed> listed{};
    std::string_view (*name_of)(std::size_t) = nullptr; ///< set for a core enum

    constexpr std::string_view operator[](std::size_t i) const {
        return name_of != nullptr ? name_of(i) : listed[i];
    }
};

/// `"a", "b", ...` in this order.
template <class... S>
constexpr label_values listed(S... names) {
    static_assert(sizeof...(S) <= label_values::max_listed);
    return {sizeof...(S), {std::string_view(names)...}, nullptr};
}

/// The names core gives the `count` values of enum `E`.
template <class E, std::size_t Count>
constexpr label_values core_names() {
    return {Count, {}, [](std::size_t i) { return core::to_string(static_cast<E>(i)); }};
}

/// Bucket bounds (seconds) of the latency histograms.
inline constexpr std::array<double, 14> latency_buckets{
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

/// One row of the family table.
struct family_info {
    family id;
    std::string_view name;
    kind type;
    scope per;
    std::string_view label; ///< the label besides `route` (and `le`), "" for none
    label_values values;    ///< its values (count 0 when the values come from `from`)
    std::string_view help;  ///< the HELP text; "" renders no HELP line (the histograms)
    shown when = shown::always;
    source from = source::cells;
    std::span<const double> buckets = {}; ///< histograms: the upper bounds, ascending
};

/// THE table, in enum order (checked below).
inline constexpr std::array<family_info, family_count> family_table{{
    {family::requests, "onceproxy_requests_total", kind::counter, scope::route, "outcome",
     core_names<core::outcome, core::outcome_count>(), "Requests by route and final outcome."},
    {family::record_decrypt_failures, "onceproxy_record_decrypt_failures_total", kind::counter,
     scope::route, "reason",
     core_names<core::record_open_failure, core::record_open_failure_count>(),
     "Stored records that did not decrypt (not replayed, not executed again), by route and "
     "reason."},
    {family::store_round_trips, "onceproxy_store_round_trips_total", kind::counter, scope::route,
     "outcome", core_names<core::outcome, core::outcome_count>(),
     "Store round trips (on Redis, one per store operation: claim, complete, release) of the "
     "requests counted in onceproxy_requests_total, by route and final outcome; lease renewals "
     "are not included.",
     shown::counted},
    {family::observed, "onceproxy_observed_total", kind::counter, scope::route, "would",
     core_names<core::observation, core::observation_count>(),
     "Requests a route in observe mode sent to the upstream where enforcement would have acted, "
     "by what it would have done."},
    {family::keys_purged, "onceproxy_keys_purged_total", kind::counter, scope::route, "forced",
     listed("false", "true"),
     "Idempotency keys purged through key administration, by route and whether a held lease "
     "was forced."},
    {family::request_duration,
     "onceproxy_request_duration_seconds",
     kind::histogram,
     scope::route,
     "",
     {},
     "",
     shown::always,
     source::cells,
     latency_buckets},
    {family::upstream_duration,
     "onceproxy_upstream_duration_seconds",
     kind::histogram,
     scope::route,
     "",
     {},
     "",
     shown::always,
     source::cells,
     latency_buckets},
    {family::store_duration,
     "onceproxy_store_duration_seconds",
     kind::histogram,
     scope::route,
     "",
     {},
     "",
     shown::always,
     source::cells,
     latency_buckets},
    {family::open_connections,
     "onceproxy_open_connections",
     kind::gauge,
     scope::process,
     "",
     {},
     "Client connections currently open."},
    {family::store_errors, "onceproxy_store_errors_total", kind::counter, scope::process, "cause",
     listed("unavailable", "timeout", "not_replicated", "store_full", "holder_full", "auth_failed",
            "tls_failed", "protocol", "unreadable", "other"),
     "Store operations that failed, by cause: unavailable, timeout, not_replicated (durability "
     "replicated: too few replicas acknowledged), store_full, holder_full (memory store: the "
     "caller's max_bytes_per_holder is reached), auth_failed, tls_failed, protocol, unreadable "
     "(a record that does not decode or decrypt), other."},
    {family::store_master_switches, "onceproxy_store_master_switches_total", kind::counter,
     scope::process, "cause", listed("switch_master", "readonly", "connection_lost"),
     "Moves of the store to another Redis master (Sentinel), by cause: switch_master (a "
     "sentinel announced it), readonly (a write got -READONLY from the demoted master) or "
     "connection_lost (the reconnect found another master).",
     shown::follows_master},
    {family::upstream_errors, "onceproxy_upstream_errors_total", kind::counter, scope::process,
     "kind", listed("unavailable", "timeout"), "Upstream exchanges that failed, by kind."},
    {family::late_answers, "onceproxy_late_answers_total", kind::counter, scope::process, "outcome",
     core_names<core::late_answer, core::late_answer_count>(),
     "Guarded requests answered 504 at the upstream timeout while the answer was still read "
     "(late_answer_timeout), by what became of it: recorded (retries replay it), released, "
     "unrecorded (lease lost, store error) or unanswered (on_upstream_uncertain applied)."},
    {family::upstream_resends,
     "onceproxy_upstream_resends_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Requests with a safe method sent once more because the pooled upstream connection they "
     "took had been closed by the upstream before it answered."},
    {family::connection_limit,
     "onceproxy_connection_limit",
     kind::gauge,
     scope::process,
     "",
     {},
     "Client connections allowed at once (limits.max_connections, lowered to fit the "
     "descriptor limit)."},
    {family::connections_refused,
     "onceproxy_connections_refused_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Client connections refused with 503 because the connection limit was reached."},
    {family::accept_errors, "onceproxy_accept_errors_total", kind::counter, scope::process,
     "listener", listed("proxy", "admin"),
     "Failed accepts (e.g. out of descriptors), by listener; the listener backs off and goes "
     "on."},
    {family::admin_connections_refused,
     "onceproxy_admin_connections_refused_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Admin connections closed at once because admin.max_connections were open."},
    {family::admin_auth_throttled,
     "onceproxy_admin_auth_throttled_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Key administration requests refused with 429 because their address sent too many wrong "
     "tokens."},
    {family::internal_errors,
     "onceproxy_internal_errors_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Exceptions caught in an event loop or a connection (logged; the worker goes on "
     "serving)."},
    {family::tunnels_total,
     "onceproxy_tunnels_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Connections upgraded (101 Switching Protocols) and relayed as byte tunnels."},
    {family::tunnels_open,
     "onceproxy_tunnels_open",
     kind::gauge,
     scope::process,
     "",
     {},
     "Upgraded connections open now."},
    {family::tunnels_refused,
     "onceproxy_tunnels_refused_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Upgrade requests refused with 503 upstream.tunnel_limit: the upstream's max_tunnels "
     "upgraded connections were open (per worker)."},
    {family::access_log_dropped,
     "onceproxy_access_log_dropped_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Access-log lines dropped because the log writer's buffer was full (stdout slower than "
     "the requests)."},
    {family::client_timeouts, "onceproxy_client_timeouts_total", kind::counter, scope::process,
     "phase", listed("header", "body"),
     "Client connections cut by a read limit: a header not received within "
     "limits.header_timeout, or a request body stalled for limits.body_timeout, below "
     "limits.min_body_rate or not complete within limits.max_body_time (408)."},
    {family::buffered_bytes,
     "onceproxy_buffered_bytes",
     kind::gauge,
     scope::process,
     "",
     {},
     "Bytes of buffered bodies held now, all workers: request bodies read whole (guarded "
     "and egress routes), upstream answers held for recording and egress answers."},
    {family::buffered_bytes_limit,
     "onceproxy_buffered_bytes_limit",
     kind::gauge,
     scope::process,
     "",
     {},
     "The budget of buffered bodies (limits.max_buffered_bytes)."},
    {family::buffered_refusals,
     "onceproxy_buffered_refusals_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Requests refused with 503 proxy.memory_limit because their body did not fit "
     "limits.max_buffered_bytes."},
    {family::config_reloads, "onceproxy_config_reloads_total", kind::counter, scope::process,
     "result", listed("success", "error", "restart_required"),
     "Config reloads (SIGHUP) by result: success, error (unreadable or invalid file) or "
     "restart_required (it changes settings bound at start); the running config stays unless "
     "success."},
    {family::config_info,
     "onceproxy_config_info",
     kind::gauge,
     scope::process,
     "sha256",
     {},
     "The config serving new requests: the first 16 hex digits of the SHA-256 of its file.",
     shown::always,
     source::config_digest},
    {family::config_loaded_at,
     "onceproxy_config_last_reload_success_timestamp_seconds",
     kind::gauge,
     scope::process,
     "",
     {},
     "When the config serving new requests was loaded (start or the last successful reload), "
     "in seconds since the epoch."},
    {family::upstream_tls_reloads, "onceproxy_upstream_tls_reloads_total", kind::counter,
     scope::process, "result", listed("success", "failure"),
     "Changed TLS files (ca_file, client_cert_file, client_key_file) of https:// upstreams, by "
     "result: success (new upstream connections use them) or failure (logged; the files in use "
     "stay)."},
    {family::event_loop_lag,
     "onceproxy_event_loop_lag_seconds",
     kind::gauge,
     scope::process,
     "worker",
     {},
     "How late each worker's event loop ran its periodic tick (every 50 ms): the largest "
     "lateness over the last second, or how long the next tick is overdue if more (a loop "
     "blocked now).",
     shown::workers,
     source::event_loop_lag},
    {family::worker_connections,
     "onceproxy_worker_connections",
     kind::gauge,
     scope::process,
     "worker",
     {},
     "Client connections open now on each worker (proxy, TLS and egress listeners): how the "
     "kernel spread them over the workers' SO_REUSEPORT listeners. A connection stays on the "
     "worker that accepted it; the sum is onceproxy_open_connections.",
     shown::workers,
     source::worker_connections},
    {family::tls_certificate_reloads, "onceproxy_tls_certificate_reloads_total", kind::counter,
     scope::process, "result", listed("success", "failure"),
     "Inbound TLS certificate reloads (a changed cert/key/CA file, or SIGHUP) by result: "
     "success (new connections get the new pair) or failure (logged; the pair in use stays).",
     shown::inbound_tls},
    {family::tls_certificate_expiry,
     "onceproxy_tls_certificate_expiry_timestamp_seconds",
     kind::gauge,
     scope::process,
     "",
     {},
     "When the certificate served to new TLS connections expires, in seconds since the epoch.",
     shown::inbound_tls},
    {family::tls_handshake_failures,
     "onceproxy_tls_handshake_failures_total",
     kind::counter,
     scope::process,
     "",
     {},
     "Inbound TLS handshakes that failed (bad client hello, no common cipher, a client "
     "certificate refused, or no handshake within limits.header_timeout).",
     shown::inbound_tls},
    {family::client_connections, "onceproxy_client_connections_total", kind::counter,
     scope::process, "protocol", listed("http1", "h2"),
     "Client connections served, by protocol: http1, or h2 (ALPN h2 on TLS, or the h2c "
     "preface on the plain listener)."},
    {family::client_requests, "onceproxy_client_requests_total", kind::counter, scope::process,
     "protocol", listed("http1", "h2"),
     "Client requests received, by protocol (HTTP/2: one per stream)."},
    {family::http2_goaways, "onceproxy_http2_goaways_total", kind::counter, scope::process,
     "reason", listed("protocol_error", "rapid_reset", "control_flood", "header_flood"),
     "HTTP/2 connections the proxy ended with an error GOAWAY: the peer broke the protocol, "
     "reset streams too fast (CVE-2023-44487), flooded control frames, or sent a header block "
     "far past limits.max_header_bytes (CONTINUATION flood)."},
    {family::egress_attempts, "onceproxy_egress_attempts_total", kind::counter, scope::egress_route,
     "result",
     listed("answered", "retryable_status", "connect_failure", "reset", "timeout", "other"),
     "Sends of egress requests to their upstream (first attempts and retries), by egress route "
     "and how each ended: answered (passed on), retryable_status (a status in retry.on), "
     "connect_failure, reset (before a complete answer), timeout, other (an unusable answer, a "
     "failed TLS handshake).",
     shown::egress},
    {family::egress_retries,
     "onceproxy_egress_retries_total",
     kind::counter,
     scope::egress_route,
     "",
     {},
     "Egress requests sent again after a failed attempt, by egress route.",
     shown::egress},
    {family::egress_retries_denied, "onceproxy_egress_retries_denied_total", kind::counter,
     scope::egress_route, "reason",
     listed("attempts", "deadline", "budget", "breaker", "retry_after", "unsafe", "body"),
     "Failed egress attempts not retried, by egress route and why: attempts (retry.attempts "
     "used), deadline (retry.deadline would pass), budget (the upstream's retry budget is "
     "spent), breaker (its circuit breaker opened), retry_after (Retry-After above "
     "retry.max_retry_after), unsafe (a non-idempotent request without a key), body (a body "
     "above retry.max_body_bytes).",
     shown::egress},
    {family::egress_circuit_refusals,
     "onceproxy_egress_circuit_refusals_total",
     kind::counter,
     scope::egress_route,
     "",
     {},
     "Egress requests answered 503 egress.circuit_open without a send, their upstream's "
     "circuit breaker being open, by egress route.",
     shown::egress},
    {family::egress_breaker_state, "onceproxy_egress_breaker_state", kind::gauge, scope::upstream,
     "state", listed("closed", "open", "half_open"),
     "The circuit breaker of each upstream egress routes call: 1 for its current state "
     "(closed, open, half_open), 0 for the others.",
     shown::egress},
    {family::egress_breaker_transitions, "onceproxy_egress_breaker_transitions_total",
     kind::counter, scope::upstream, "to", listed("closed", "open", "half_open"),
     "Changes of state of each upstream's circuit breaker, by the state entered.", shown::egress},
}};

/// The row of `f`. Precondition: `f` is a declared enumerator.
constexpr const family_info& info(family f) noexcept {
    return family_table[static_cast<std::size_t>(f)];
}

/// The number of cells a family keeps per series set: one per label value, or one without a
/// label; none for histograms and values computed when rendered.
constexpr std::size_t cells_of(const family_info& f) noexcept {
    if (f.type == kind::histogram || f.from != source::cells) {
        return 0;
    }
    return f.label.empty() ? 1 : f.values.count;
}

namespace detail {

constexpr bool family_table_well_formed() {
    for (std::size_t i = 0; i < family_table.size(); ++i) {
        const auto& f = family_table[i];
        if (static_cast<std::size_t>(f.id) != i) {
            return false; // rows must follow the enum order
        }
        if (f.name.substr(0, 10) != "onceproxy_") {
            return false;
        }
        if ((f.type == kind::histogram) != !f.buckets.empty()) {
            return false; // buckets, and only for histograms
        }
        if (!f.buckets.empty() && f.buckets.data() != latency_buckets.data()) {
            return false; // histogram_cells keeps the latency buckets
        }
        if (f.type == kind::histogram && (f.per != scope::route || !f.label.empty())) {
            return false; // histograms are kept per route, by route only
        }
        if ((f.per == scope::route || f.per == scope::egress_route) && f.type == kind::gauge) {
            return false; // no route gauges are kept
        }
        if (f.from == source::cells && !f.label.empty() && f.values.count == 0) {
            return false; // a label needs its values
        }
        if ((f.type == kind::counter) != f.name.ends_with("_total")) {
            return false; // counters, and only counters, end in _total
        }
    }
    return true;
}

} // namespace detail
static_assert(detail::family_table_well_formed(),
              "family_table rows must follow the enum order and be consistent");
static_assert(info(family::store_errors).values.count == store_error_cause_count);
static_assert(info(family::upstream_errors).values.count == 2);
static_assert(info(family::accept_errors).values.count == 2);
static_assert(info(family::client_timeouts).values.count == 2);
static_assert(info(family::config_reloads).values.count == reload_result_count);
static_assert(info(family::upstream_tls_reloads).values.count == 2);
static_assert(info(family::tls_certificate_reloads).values.count == 2);

/// The cell of each family among those of the same scope and cell type (counters: unsigned,
/// gauges: signed), and how many cells each such set has.
struct cell_layout {
    std::array<std::size_t, family_count> offset{};
    std::size_t counters = 0;
    std::size_t gauges = 0;
};

constexpr cell_layout layout_of(scope per) noexcept {
    cell_layout l;
    for (const auto& f : family_table) {
        if (f.per != per) {
            continue;
        }
        auto& next = f.type == kind::gauge ? l.gauges : l.counters;
        l.offset[static_cast<std::size_t>(f.id)] = next;
        next += cells_of(f);
    }
    return l;
}

inline constexpr cell_layout process_cells = layout_of(scope::process);
inline constexpr cell_layout route_cells = layout_of(scope::route);
inline constexpr cell_layout egress_route_cells = layout_of(scope::egress_route);
inline constexpr cell_layout upstream_cells = layout_of(scope::upstream);

/// The cell layout of `per` (process, route, egress route or upstream).
constexpr const cell_layout& cells_of_scope(scope per) noexcept {
    switch (per) {
    case scope::process:
        return process_cells;
    case scope::route:
        return route_cells;
    case scope::egress_route:
        return egress_route_cells;
    case scope::upstream:
        break;
    }
    return upstream_cells;
}

/// The histogram's index among a route's histograms.
constexpr std::size_t histogram_index(family f) noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(f); ++i) {
        n += family_table[i].type == kind::histogram ? 1 : 0;
    }
    return n;
}

inline constexpr std::size_t route_histograms = histogram_index(family::tls_handshake_failures);

} // namespace onceproxy::metrics
