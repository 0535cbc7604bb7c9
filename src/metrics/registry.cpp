#include "onceproxy/metrics/registry.hpp"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <vector>

namespace onceproxy::metrics {

std::string_view outcome_name(outcome o) noexcept {
    return core::to_string(o);
}

void histogram::observe(std::chrono::nanoseconds d) noexcept {
    const double s = std::chrono::duration<double>(d).count();
    std::size_t i = 0;
    while (i < bounds.size() && s > bounds[i]) {
        ++i;
    }
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(d.count()), std::memory_order_relaxed);
}

void histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
    std::uint64_t cumulative = 0;
    char num[64];
    for (std::size_t i = 0; i <= bounds.size(); ++i) {
        cumulative += buckets_[i].load(std::memory_order_relaxed);
        out += name;
        out += "_bucket{";
        out += labels;
        out += ",le=\"";
        if (i < bounds.size()) {
            std::snprintf(num, sizeof num, "%g", bounds[i]);
            out += num;
        } else {
            out += "+Inf";
        }
        out += "\"} " + std::to_string(cumulative) + "\n";
    }
    std::snprintf(num, sizeof num, "%.9f",
                  static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9);
    out += std::string(name) + "_sum{" + std::string(labels) + "} " + num + "\n";
    out += std::string(name) + "_count{" + std::string(labels) + "} " +
           std::to_string(count_.load(std::memory_order_relaxed)) + "\n";
}

registry::registry(const std::vector<std::string>& route_names) {
    for (const auto& n : route_names) {
        routes_.push_back(std::make_unique<route_metrics>());
        routes_.back()->name = n;
    }
    routes_.push_back(std::make_unique<route_metrics>());
    routes_.back()->name = "(none)";
    unrouted_ = routes_.back().get();
}

void registry::set_workers(std::size_t workers) {
    event_loop_ticks_ = std::make_unique<event_loop_tick[]>(workers);
    workers_ = workers;
}

namespace {

std::int64_t steady_micros(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

} // namespace

void registry::set_event_loop_tick(std::size_t worker,
                                   std::chrono::steady_clock::time_point next_due,
                                   std::optional<std::chrono::microseconds> window_worst) noexcept {
    if (worker >= workers_) {
        return;
    }
    auto& t = event_loop_ticks_[worker];
    if (window_worst) {
        t.worst_us.store(window_worst->count(), std::memory_order_relaxed);
    }
    t.next_due_us.store(steady_micros(next_due), std::memory_order_relaxed);
}

std::chrono::microseconds
registry::event_loop_lag(std::size_t worker,
                         std::chrono::steady_clock::time_point now) const noexcept {
    if (worker >= workers_) {
        return {};
    }
    const auto& t = event_loop_ticks_[worker];
    const auto due = t.next_due_us.load(std::memory_order_relaxed);
    const std::int64_t overdue = due == 0 ? 0 : steady_micros(now) - due;
    return std::chrono::microseconds(std::max(t.worst_us.load(std::memory_order_relaxed), overdue));
}

route_metrics& registry::route(std::size_t index) noexcept {
    std::lock_guard lk(mutex_);
    return *routes_[index];
}

route_metrics& registry::route_named(std::string_view name) {
    std::lock_guard lk(mutex_);
    for (const auto& r : routes_) {
        if (r->name == name && r.get() != unrouted_) {
            return *r;
        }
    }
    routes_.push_back(std::make_unique<route_metrics>());
    routes_.back()->name = std::string(name);
    return *routes_.back();
}

void registry::set_config(std::string digest, std::int64_t loaded_at_seconds) {
    std::lock_guard lk(mutex_);
    config_digest_ = std::move(digest);
    config_loaded_at_.store(loaded_at_seconds, std::memory_order_relaxed);
}

std::string registry::render() const {
    std::vector<const route_metrics*> routes_now;
    std::string digest;
    {
        // A snapshot of the list: the series themselves are read without the lock.
        std::lock_guard lk(mutex_);
        for (const auto& r : routes_) {
            routes_now.push_back(r.get());
        }
        digest = config_digest_;
    }
    std::string out;
    out.reserve(8192);
    out += "# HELP onceproxy_requests_total Requests by route and final outcome.\n"
           "# TYPE onceproxy_requests_total counter\n";
    for (const auto* r : routes_now) {
        for (std::size_t i = 0; i < outcome_count; ++i) {
            out += "onceproxy_requests_total{route=\"" + r->name + "\",outcome=\"" +
                   std::string(outcome_name(static_cast<outcome>(i))) + "\"} " +
                   std::to_string(r->counted(static_cast<outcome>(i))) + "\n";
        }
    }
    out += "# HELP onceproxy_record_decrypt_failures_total Stored records that did not decrypt "
           "(not replayed, not executed again), by route and reason.\n"
           "# TYPE onceproxy_record_decrypt_failures_total counter\n";
    for (const auto* r : routes_now) {
        for (std::size_t i = 0; i < core::record_open_failure_count; ++i) {
            out += "onceproxy_record_decrypt_failures_total{route=\"" + r->name + "\",reason=\"" +
                   std::string(core::to_string(static_cast<core::record_open_failure>(i))) +
                   "\"} " + std::to_string(r->decrypt_failures[i].load(std::memory_order_relaxed)) +
                   "\n";
        }
    }
    out += "# HELP onceproxy_store_round_trips_total Store round trips (on Redis, one per store "
           "operation: claim, complete, release) of the requests counted in "
           "onceproxy_requests_total, by route and final outcome; lease renewals are not "
           "included.\n"
           "# TYPE onceproxy_store_round_trips_total counter\n";
    for (const auto* r : routes_now) {
        for (std::size_t i = 0; i < outcome_count; ++i) {
            const auto o = static_cast<outcome>(i);
            if (const auto n = r->round_trips(o); n != 0 || r->counted(o) != 0) {
                out += "onceproxy_store_round_trips_total{route=\"" + r->name + "\",outcome=\"" +
                       std::string(outcome_name(o)) + "\"} " + std::to_string(n) + "\n";
            }
        }
    }
    out += "# HELP onceproxy_observed_total Requests a route in observe mode sent to the upstream "
           "where enforcement would have acted, by what it would have done.\n"
           "# TYPE onceproxy_observed_total counter\n";
    for (const auto* r : routes_now) {
        for (std::size_t i = 0; i < core::observation_count; ++i) {
            const auto o = static_cast<core::observation>(i);
            out += "onceproxy_observed_total{route=\"" + r->name + "\",would=\"" +
                   std::string(core::to_string(o)) + "\"} " + std::to_string(r->counted(o)) + "\n";
        }
    }
    out += "# HELP onceproxy_keys_purged_total Idempotency keys purged through key "
           "administration, by route and whether a held lease was forced.\n"
           "# TYPE onceproxy_keys_purged_total counter\n";
    for (const auto* r : routes_now) {
        for (std::size_t forced = 0; forced < 2; ++forced) {
            out += "onceproxy_keys_purged_total{route=\"" + r->name + "\",forced=\"" +
                   (forced ? "true" : "false") + "\"} " +
                   std::to_string(r->keys_purged[forced].load(std::memory_order_relaxed)) + "\n";
        }
    }
    const std::pair<const char*, histogram route_metrics::*> hists[] = {
        {"onceproxy_request_duration_seconds", &route_metrics::request_duration},
        {"onceproxy_upstream_duration_seconds", &route_metrics::upstream_duration},
        {"onceproxy_store_duration_seconds", &route_metrics::store_duration},
    };
    for (const auto& [name, member] : hists) {
        out += std::string("# TYPE ") + name + " histogram\n";
        for (const auto* r : routes_now) {
            ((*r).*member).render(out, name, "route=\"" + r->name + "\"");
        }
    }
    struct sample {
        const char* labels; ///< "" or `{name="value"}`
        std::uint64_t value;
    };
    const auto family = [&out](const char* name, const char* type, const char* help,
                               std::initializer_list<sample> samples) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
        for (const auto& s : samples) {
            out += std::string(name) + s.labels + " " + std::to_string(s.value) + "\n";
        }
    };
    const auto get = [](const auto& a) {
        return static_cast<std::uint64_t>(a.load(std::memory_order_relaxed));
    };
    family("onceproxy_open_connections", "gauge", "Client connections currently open.",
           {{"", get(open_connections)}});
    family("onceproxy_store_errors_total", "counter",
           "Store operations that failed, by cause: unavailable, timeout, not_replicated "
           "(durability replicated: too few replicas acknowledged), store_full, holder_full "
           "(memory store: the caller's max_bytes_per_holder is reached), auth_failed, "
           "tls_failed, protocol, unreadable (a record that does not decode or decrypt), other.",
           {{"{cause=\"unavailable\"}", store_errors(store_error_cause::unavailable)},
            {"{cause=\"timeout\"}", store_errors(store_error_cause::timeout)},
            {"{cause=\"not_replicated\"}", store_errors(store_error_cause::not_replicated)},
            {"{cause=\"store_full\"}", store_errors(store_error_cause::store_full)},
            {"{cause=\"holder_full\"}", store_errors(store_error_cause::holder_full)},
            {"{cause=\"auth_failed\"}", store_errors(store_error_cause::auth_failed)},
            {"{cause=\"tls_failed\"}", store_errors(store_error_cause::tls_failed)},
            {"{cause=\"protocol\"}", store_errors(store_error_cause::protocol)},
            {"{cause=\"unreadable\"}", store_errors(store_error_cause::unreadable)},
            {"{cause=\"other\"}", store_errors(store_error_cause::other)}});
    if (store_follows_master.load(std::memory_order_relaxed)) {
        family("onceproxy_store_master_switches_total", "counter",
               "Moves of the store to another Redis master (Sentinel), by cause: switch_master "
               "(a sentinel announced it), readonly (a write got -READONLY from the demoted "
               "master) or connection_lost (the reconnect found another master).",
               {{"{cause=\"switch_master\"}", master_switches(master_switch_cause::switch_master)},
                {"{cause=\"readonly\"}", master_switches(master_switch_cause::readonly)},
                {"{cause=\"connection_lost\"}",
                 master_switches(master_switch_cause::connection_lost)}});
    }
    family("onceproxy_upstream_errors_total", "counter", "Upstream exchanges that failed, by kind.",
           {{"{kind=\"unavailable\"}", get(upstream_errors)},
            {"{kind=\"timeout\"}", get(upstream_timeouts)}});
    family("onceproxy_late_answers_total", "counter",
           "Guarded requests answered 504 at the upstream timeout while the answer was still "
           "read (late_answer_timeout), by what became of it: recorded (retries replay it), "
           "released, unrecorded (lease lost, store error) or unanswered (on_upstream_uncertain "
           "applied).",
           {{"{outcome=\"recorded\"}", late_answers(core::late_answer::recorded)},
            {"{outcome=\"released\"}", late_answers(core::late_answer::released)},
            {"{outcome=\"unrecorded\"}", late_answers(core::late_answer::unrecorded)},
            {"{outcome=\"unanswered\"}", late_answers(core::late_answer::unanswered)}});
    family("onceproxy_upstream_resends_total", "counter",
           "Requests with a safe method sent once more because the pooled upstream connection "
           "they took had been closed by the upstream before it answered.",
           {{"", get(upstream_resends)}});
    family("onceproxy_connection_limit", "gauge",
           "Client connections allowed at once (limits.max_connections, lowered to fit the "
           "descriptor limit).",
           {{"", get(connection_limit)}});
    family("onceproxy_connections_refused_total", "counter",
           "Client connections refused with 503 because the connection limit was reached.",
           {{"", get(connections_refused)}});
    family("onceproxy_accept_errors_total", "counter",
           "Failed accepts (e.g. out of descriptors), by listener; the listener backs off and "
           "goes on.",
           {{"{listener=\"proxy\"}", get(accept_errors_proxy)},
            {"{listener=\"admin\"}", get(accept_errors_admin)}});
    family("onceproxy_admin_connections_refused_total", "counter",
           "Admin connections closed at once because admin.max_connections were open.",
           {{"", get(admin_connections_refused)}});
    family("onceproxy_admin_auth_throttled_total", "counter",
           "Key administration requests refused with 429 because their address sent too many "
           "wrong tokens.",
           {{"", get(admin_auth_throttled)}});
    family("onceproxy_internal_errors_total", "counter",
           "Exceptions caught in an event loop or a connection (logged; the worker goes on "
           "serving).",
           {{"", get(internal_errors)}});
    family("onceproxy_tunnels_total", "counter",
           "Connections upgraded (101 Switching Protocols) and relayed as byte tunnels.",
           {{"", get(tunnels_total)}});
    family("onceproxy_tunnels_open", "gauge", "Upgraded connections open now.",
           {{"", get(tunnels_open)}});
    family("onceproxy_tunnels_refused_total", "counter",
           "Upgrade requests refused with 503 upstream.tunnel_limit: the upstream's max_tunnels "
           "upgraded connections were open (per worker).",
           {{"", get(tunnels_refused)}});
    family("onceproxy_access_log_dropped_total", "counter",
           "Access-log lines dropped because the log writer's buffer was full (stdout slower "
           "than the requests).",
           {{"", get(access_log_dropped)}});
    family(
        "onceproxy_client_timeouts_total", "counter",
        "Client connections cut by a read limit: a header not received within "
        "limits.header_timeout, or a request body stalled for limits.body_timeout, below "
        "limits.min_body_rate or not complete within limits.max_body_time (408).",
        {{"{phase=\"header\"}", get(header_timeouts)}, {"{phase=\"body\"}", get(body_timeouts)}});
    family("onceproxy_buffered_bytes", "gauge",
           "Bytes of buffered bodies held now, all workers: request bodies read whole (guarded "
           "routes) and upstream answers held for recording.",
           {{"", get(buffered_bytes)}});
    family("onceproxy_buffered_bytes_limit", "gauge",
           "The budget of buffered bodies (limits.max_buffered_bytes).",
           {{"", get(buffered_bytes_limit)}});
    family("onceproxy_buffered_refusals_total", "counter",
           "Requests refused with 503 proxy.memory_limit because their body did not fit "
           "limits.max_buffered_bytes.",
           {{"", get(buffered_refusals)}});
    family("onceproxy_config_reloads_total", "counter",
           "Config reloads (SIGHUP) by result: success, error (unreadable or invalid file) or "
           "restart_required (it changes settings bound at start); the running config stays "
           "unless success.",
           {{"{result=\"success\"}", reloads(reload_result::success)},
            {"{result=\"error\"}", reloads(reload_result::error)},
            {"{result=\"restart_required\"}", reloads(reload_result::restart_required)}});
    out += "# HELP onceproxy_config_info The config serving new requests: the first 16 hex digits "
           "of the SHA-256 of its file.\n# TYPE onceproxy_config_info gauge\n"
           "onceproxy_config_info{sha256=\"" +
           digest + "\"} 1\n";
    family("onceproxy_config_last_reload_success_timestamp_seconds", "gauge",
           "When the config serving new requests was loaded (start or the last successful "
           "reload), in seconds since the epoch.",
           {{"", static_cast<std::uint64_t>(config_loaded_at_.load(std::memory_order_relaxed))}});
    family("onceproxy_upstream_tls_reloads_total", "counter",
           "Changed TLS files (ca_file, client_cert_file, client_key_file) of https:// "
           "upstreams, by result: success (new upstream connections use them) or failure "
           "(logged; the files in use stay).",
           {{"{result=\"success\"}", get(upstream_tls_reloads_success)},
            {"{result=\"failure\"}", get(upstream_tls_reloads_failure)}});
    if (workers_ > 0) {
        out += "# HELP onceproxy_event_loop_lag_seconds How late each worker's event loop ran "
               "its periodic tick (every 50 ms): the largest lateness over the last second, or "
               "how long the next tick is overdue if more (a loop blocked now).\n"
               "# TYPE onceproxy_event_loop_lag_seconds gauge\n";
        char num[64];
        const auto now = std::chrono::steady_clock::now();
        for (std::size_t w = 0; w < workers_; ++w) {
            std::snprintf(num, sizeof num, "%.6f",
                          std::chrono::duration<double>(event_loop_lag(w, now)).count());
            out += "onceproxy_event_loop_lag_seconds{worker=\"" + std::to_string(w) + "\"} " + num +
                   "\n";
        }
    }
    if (const auto expiry = tls_certificate_expiry.load(std::memory_order_relaxed); expiry != 0) {
        family("onceproxy_tls_certificate_reloads_total", "counter",
               "Inbound TLS certificate reloads (a changed cert/key/CA file, or SIGHUP) by "
               "result: success (new connections get the new pair) or failure (logged; the "
               "pair in use stays).",
               {{"{result=\"success\"}", get(tls_reloads_success)},
                {"{result=\"failure\"}", get(tls_reloads_failure)}});
        family("onceproxy_tls_certificate_expiry_timestamp_seconds", "gauge",
               "When the certificate served to new TLS connections expires, in seconds since "
               "the epoch.",
               {{"", static_cast<std::uint64_t>(expiry)}});
        family("onceproxy_tls_handshake_failures_total", "counter",
               "Inbound TLS handshakes that failed (bad client hello, no common cipher, a "
               "client certificate refused, or no handshake within limits.header_timeout).",
               {{"", get(tls_handshake_failures)}});
    }
    return out;
}

} // namespace onceproxy::metrics
