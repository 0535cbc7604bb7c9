#pragma once
// Every metric onceproxy exposes, in one place (SPEC §6). Counters are relaxed atomics, updated
// from any worker; exposition renders the Prometheus text format on the admin listener.

#include "onceproxy/core/outcome.hpp"
#include "onceproxy/core/record_cipher.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::metrics {

/// The one final outcome each request records (SPEC §6): core owns the enum and its names.
using outcome = core::outcome;
using core::outcome_count;

/// The `outcome` label value (core::to_string).
std::string_view outcome_name(outcome o) noexcept;

/// Fixed-bucket latency histogram (seconds), lock-free.
class histogram {
public:
    static constexpr std::array<double, 14> bounds{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                   0.1,    0.25,  0.5,    1,     2.5,  5,     10};
    void observe(std::chrono::nanoseconds d) noexcept;
    void render(std::string& out, std::string_view name, std::string_view labels) const;

private:
    std::array<std::atomic<std::uint64_t>, bounds.size() + 1> buckets_{};
    std::atomic<std::uint64_t> count_{0};
    std::atomic<std::uint64_t> sum_ns_{0};
};

/// Per-route counters and histograms, index = route index in the config (last = unrouted).
struct route_metrics {
    std::string name;
    /// Requests by final outcome; written only through count().
    std::array<std::atomic<std::uint64_t>, outcome_count> outcomes{};

    /// Counts one request's final outcome. Every request is counted once, when its outcome is
    /// final (an exchange that completes in the background: when that ends).
    void count(outcome o) noexcept {
        outcomes[static_cast<std::size_t>(o)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t counted(outcome o) const noexcept {
        return outcomes[static_cast<std::size_t>(o)].load(std::memory_order_relaxed);
    }
    /// Upgrade requests and tunnels open on this route now, all workers (what the route's
    /// limits.max_tunnels bounds).
    std::atomic<std::int64_t> tunnels_open{0};
    /// Stored records that did not open (encryption at rest), by reason.
    std::array<std::atomic<std::uint64_t>, core::record_open_failure_count> decrypt_failures{};
    void count_decrypt_failure(core::record_open_failure why) noexcept {
        decrypt_failures[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
    }
    /// Store round trips of the requests counted, by their final outcome (lease renewals not
    /// included): divided by the request count of the same outcome, the round trips per request.
    std::array<std::atomic<std::uint64_t>, outcome_count> store_round_trips{};
    void count_round_trips(outcome o, std::uint64_t n) noexcept {
        store_round_trips[static_cast<std::size_t>(o)].fetch_add(n, std::memory_order_relaxed);
    }
    std::uint64_t round_trips(outcome o) const noexcept {
        return store_round_trips[static_cast<std::size_t>(o)].load(std::memory_order_relaxed);
    }
    /// Observe mode: requests sent upstream where enforcement would have acted, by what it
    /// would have done (onceproxy_observed_total{route,would}).
    std::array<std::atomic<std::uint64_t>, core::observation_count> observations{};
    void count(core::observation o) noexcept {
        observations[static_cast<std::size_t>(o)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t counted(core::observation o) const noexcept {
        return observations[static_cast<std::size_t>(o)].load(std::memory_order_relaxed);
    }
    histogram request_duration;
    histogram upstream_duration;
    histogram store_duration;
    /// Keys purged through key administration, [0] not forced, [1] forced.
    std::array<std::atomic<std::uint64_t>, 2> keys_purged{};
};

/// Results of a config reload (SIGHUP), the `result` label of onceproxy_config_reloads_total.
enum class reload_result {
    success,          ///< the new config serves new requests
    error,            ///< the file could not be read or is invalid; the running config stays
    restart_required, ///< the file changes settings bound at start; the running config stays
};
inline constexpr std::size_t reload_result_count = 3;

/// What moved the store to another master (Redis behind Sentinel), the `cause` label of
/// onceproxy_store_master_switches_total (app/ maps the store's own enum onto it).
enum class master_switch_cause {
    switch_master,   ///< a sentinel announced it (+switch-master)
    readonly,        ///< a write got -READONLY from the demoted master
    connection_lost, ///< the connection was lost and the reconnect found another master
};
inline constexpr std::size_t master_switch_cause_count = 3;

/// Why a store operation failed, the `cause` label of onceproxy_store_errors_total (http/ maps
/// the store's error codes onto it).
enum class store_error_cause {
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

class registry {
public:
    /// `route_names`: config route names in order; an extra "(none)" series is added.
    explicit registry(const std::vector<std::string>& route_names);

    /// The series of route `index` of the config the registry was built with (route_named
    /// serves later configs).
    route_metrics& route(std::size_t index) noexcept;
    route_metrics& unrouted() noexcept { return *unrouted_; }

    /// The series of the route named `name`: the one it already has (its counts go on across
    /// reloads), or a new one for a route a reload added. Takes a lock: call it when a config
    /// is installed, not per request. Any thread; the reference lives as long as the registry.
    route_metrics& route_named(std::string_view name);

    /// Counts one reload (onceproxy_config_reloads_total{result}). Any thread.
    void count_reload(reload_result r) noexcept {
        reloads_[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t reloads(reload_result r) const noexcept {
        return reloads_[static_cast<std::size_t>(r)].load(std::memory_order_relaxed);
    }

    /// Counts one failed store operation (onceproxy_store_errors_total{cause}). Any thread.
    void count_store_error(store_error_cause c) noexcept {
        store_errors_[static_cast<std::size_t>(c)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t store_errors(store_error_cause c) const noexcept {
        return store_errors_[static_cast<std::size_t>(c)].load(std::memory_order_relaxed);
    }

    /// Counts one late answer's fate (onceproxy_late_answers_total{outcome}, issue 26). Any
    /// thread.
    void count_late_answer(core::late_answer a) noexcept {
        late_answers_[static_cast<std::size_t>(a)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t late_answers(core::late_answer a) const noexcept {
        return late_answers_[static_cast<std::size_t>(a)].load(std::memory_order_relaxed);
    }

    /// Counts one move of the store to another master. Any thread.
    void count_master_switch(master_switch_cause c) noexcept {
        master_switches_[static_cast<std::size_t>(c)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t master_switches(master_switch_cause c) const noexcept {
        return master_switches_[static_cast<std::size_t>(c)].load(std::memory_order_relaxed);
    }
    /// Set when the store follows a master that can move (Sentinel): only then is
    /// onceproxy_store_master_switches_total rendered.
    std::atomic<bool> store_follows_master{false};

    /// The config now serving: `digest` (the first 16 hex digits of the SHA-256 of its file)
    /// for onceproxy_config_info, and when it was loaded, in seconds since the epoch (at start,
    /// then at each successful reload). Any thread.
    void set_config(std::string digest, std::int64_t loaded_at_seconds);

    std::atomic<std::int64_t> open_connections{0};
    std::atomic<std::uint64_t> upstream_errors{0};
    std::atomic<std::uint64_t> upstream_timeouts{0};
    /// Safe requests sent once more because their reused upstream connection had been closed.
    std::atomic<std::uint64_t> upstream_resends{0};
    std::atomic<std::uint64_t> connection_limit{0};    ///< effective limits.max_connections
    std::atomic<std::uint64_t> connections_refused{0}; ///< over the limit: 503 and closed
    std::atomic<std::uint64_t> accept_errors_proxy{0}; ///< accept() failures, proxy listener
    std::atomic<std::uint64_t> accept_errors_admin{0}; ///< accept() failures, admin listener
    /// Admin connections closed at once: admin.max_connections were open.
    std::atomic<std::uint64_t> admin_connections_refused{0};
    /// Key administration requests answered 429: too many wrong tokens from their address.
    std::atomic<std::uint64_t> admin_auth_throttled{0};
    std::atomic<std::uint64_t> internal_errors{0};    ///< exceptions caught in an event loop
    std::atomic<std::uint64_t> tunnels_total{0};      ///< upgraded connections (101), ever
    std::atomic<std::int64_t> tunnels_open{0};        ///< upgraded connections open now
    std::atomic<std::uint64_t> access_log_dropped{0}; ///< lines the log writer had no room for
    std::atomic<std::uint64_t> header_timeouts{0};    ///< connections cut at limits.header_timeout
    std::atomic<std::uint64_t> body_timeouts{0};      ///< request bodies cut (408 request.timeout)
    std::atomic<std::uint64_t> tunnels_refused{0};    ///< upgrades refused at max_tunnels
    /// limits.max_buffered_bytes: bytes of buffered bodies held now (request bodies read whole,
    /// upstream answers held for recording), all workers; the budget; bodies refused (503).
    std::atomic<std::int64_t> buffered_bytes{0};
    std::atomic<std::uint64_t> buffered_bytes_limit{0};
    std::atomic<std::uint64_t> buffered_refusals{0};
    /// Inbound TLS (README "TLS: inbound"): handshakes that failed (the connection closed),
    /// certificate reloads by result, and the served certificate's expiry (0: no TLS).
    std::atomic<std::uint64_t> tls_handshake_failures{0};
    std::atomic<std::uint64_t> tls_reloads_success{0};
    std::atomic<std::uint64_t> tls_reloads_failure{0};
    std::atomic<std::int64_t> tls_certificate_expiry{0};
    /// https:// upstreams (README "TLS: upstreams"): rotations of their CA, client certificate
    /// or key seen by the file check, by result.
    std::atomic<std::uint64_t> upstream_tls_reloads_success{0};
    std::atomic<std::uint64_t> upstream_tls_reloads_failure{0};

    /// Event-loop lag (onceproxy_event_loop_lag_seconds{worker}): `workers` series, all 0.
    /// Call once, before the workers run.
    void set_workers(std::size_t workers);
    /// Worker `worker`'s periodic tick: when the next one is due, and (once a second) the
    /// largest lateness of a tick over the last second. Written by that worker only; ignored
    /// for a worker set_workers did not count.
    void set_event_loop_tick(std::size_t worker, std::chrono::steady_clock::time_point next_due,
                             std::optional<std::chrono::microseconds> window_worst) noexcept;
    /// The lag of worker `worker` at `now`: the largest lateness of the last second, or how
    /// long its next tick is overdue if that is more (a loop blocked right now).
    std::chrono::microseconds
    event_loop_lag(std::size_t worker, std::chrono::steady_clock::time_point now) const noexcept;

    /// Prometheus text exposition format 0.0.4.
    std::string render() const;

private:
    /// Guards the growth of routes_ (a reload adding a route) and the config digest; the
    /// counters themselves are atomics, updated without it.
    mutable std::mutex mutex_;
    /// Every route ever configured, in order of appearance; "(none)" after the start config's.
    std::vector<std::unique_ptr<route_metrics>> routes_;
    route_metrics* unrouted_ = nullptr;
    std::array<std::atomic<std::uint64_t>, reload_result_count> reloads_{};
    std::array<std::atomic<std::uint64_t>, master_switch_cause_count> master_switches_{};
    std::array<std::atomic<std::uint64_t>, store_error_cause_count> store_errors_{};
    std::array<std::atomic<std::uint64_t>, core::late_answer_count> late_answers_{};
    std::string config_digest_;
    std::size_t workers_ = 0;
    struct event_loop_tick {
        std::atomic<std::int64_t> worst_us{0};    // the last second's largest lateness
        std::atomic<std::int64_t> next_due_us{0}; // steady clock; 0: not ticking yet
    };
    std::unique_ptr<event_loop_tick[]> event_loop_ticks_;
    std::atomic<std::int64_t> config_loaded_at_{0};
};

} // namespace onceproxy::metrics
