#pragma once
// The series of every metric family of family.hpp, and their exposition. Counters and gauges
// are relaxed atomics, updated from any worker through typed handles; exposition renders the
// Prometheus text format on the admin listener, by a loop over the family table.

#include "onceproxy/core/outcome.hpp"
#include "onceproxy/metrics/family.hpp"

#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace onceproxy::metrics {

/// The one final outcome each request records (SPEC §6): core owns the enum and its names.
using outcome = core::outcome;
using core::outcome_count;

/// The `outcome` label value (core::to_string).
std::string_view outcome_name(outcome o) noexcept;

/// A label value: an enumerator of the label's enum (its index in the family's values), or a
/// bool for a false/true label.
template <class L>
concept label = std::is_enum_v<L> || std::same_as<L, bool>;

namespace detail {
template <label L>
constexpr std::size_t label_index(L value) noexcept {
    if constexpr (std::same_as<L, bool>) {
        return value ? 1 : 0;
    } else {
        return static_cast<std::size_t>(value);
    }
}
} // namespace detail

/// One counter series: what registry::counter and route_metrics::counter hand out. Cheap to
/// copy; valid as long as the registry.
class counter_ref {
public:
    explicit counter_ref(std::atomic<std::uint64_t>& cell) noexcept : cell_(&cell) {}
    void inc() const noexcept { cell_->fetch_add(1, std::memory_order_relaxed); }
    void add(std::uint64_t n) const noexcept { cell_->fetch_add(n, std::memory_order_relaxed); }
    std::uint64_t value() const noexcept { return cell_->load(std::memory_order_relaxed); }

private:
    std::atomic<std::uint64_t>* cell_;
};

/// One gauge series. `cell` is for code that shares the count as an atomic (the budget of
/// buffered bodies).
class gauge_ref {
public:
    explicit gauge_ref(std::atomic<std::int64_t>& cell) noexcept : cell_(&cell) {}
    void inc() const noexcept { cell_->fetch_add(1, std::memory_order_relaxed); }
    void dec() const noexcept { cell_->fetch_sub(1, std::memory_order_relaxed); }
    void set(std::int64_t v) const noexcept { cell_->store(v, std::memory_order_relaxed); }
    std::int64_t value() const noexcept { return cell_->load(std::memory_order_relaxed); }
    std::atomic<std::int64_t>& cell() const noexcept { return *cell_; }

private:
    std::atomic<std::int64_t>* cell_;
};

/// The cells of a histogram (latency_buckets bounds, seconds), lock-free.
class histogram_cells {
public:
    void observe(std::chrono::nanoseconds d) noexcept;
    /// Appends the `_bucket`, `_sum` and `_count` series of `name` with `labels` before `le`.
    void render(std::string& out, std::string_view name, std::string_view labels) const;

    /// Observations per bucket (not cumulative; the last one is +Inf), and their number.
    struct counts {
        std::array<std::uint64_t, latency_buckets.size() + 1> buckets{};
        std::uint64_t count = 0;
    };
    counts read() const noexcept;

private:
    std::array<std::atomic<std::uint64_t>, latency_buckets.size() + 1> buckets_{};
    std::atomic<std::uint64_t> count_{0};
    std::atomic<std::uint64_t> sum_ns_{0};
};

/// The series of one route (index = route index in the config; last = unrouted).
class route_metrics {
public:
    explicit route_metrics(std::string route_name) : name(std::move(route_name)) {}

    /// The series of per-route counter `f` for label value `value`.
    template <label L>
    counter_ref counter(family f, L value) noexcept {
        assert(info(f).per == scope::route && info(f).type == kind::counter);
        assert(detail::label_index(value) < cells_of(info(f)));
        return counter_ref(counters_[route_cells.offset[static_cast<std::size_t>(f)] +
                                     detail::label_index(value)]);
    }
    /// The histogram `f` of this route.
    histogram_cells& histogram(family f) noexcept {
        assert(info(f).type == kind::histogram);
        return histograms_[histogram_index(f)];
    }
    const histogram_cells& histogram(family f) const noexcept {
        return histograms_[histogram_index(f)];
    }
    /// The value of counter `f` at label index `i` (rendering).
    std::uint64_t cell(family f, std::size_t i) const noexcept {
        return counters_[route_cells.offset[static_cast<std::size_t>(f)] + i].load(
            std::memory_order_relaxed);
    }

    const std::string name;
    /// Upgrade requests and tunnels open on this route now, all workers (what the route's
    /// limits.max_tunnels bounds). Not exposed as a metric.
    std::atomic<std::int64_t> tunnels_open{0};

private:
    std::array<std::atomic<std::uint64_t>, route_cells.counters> counters_{};
    std::array<histogram_cells, route_histograms> histograms_{};
};

/// The series of one egress route (scope::egress_route) or one upstream (scope::upstream),
/// by name.
class named_series {
public:
    named_series(scope per, std::string series_name);

    /// The series of counter `f` (of this scope) for label value `value`.
    template <label L>
    counter_ref counter(family f, L value) noexcept {
        assert(info(f).per == per && info(f).type == kind::counter);
        assert(detail::label_index(value) < cells_of(info(f)));
        return counter_ref(counters_[offset(f) + detail::label_index(value)]);
    }
    /// The series of the unlabelled counter `f`.
    counter_ref counter(family f) noexcept {
        assert(info(f).per == per && info(f).type == kind::counter && info(f).label.empty());
        return counter_ref(counters_[offset(f)]);
    }
    /// The series of gauge `f` (of this scope) for label value `value`.
    template <label L>
    gauge_ref gauge(family f, L value) noexcept {
        assert(info(f).per == per && info(f).type == kind::gauge);
        assert(detail::label_index(value) < cells_of(info(f)));
        return gauge_ref(gauges_[offset(f) + detail::label_index(value)]);
    }
    /// The value of counter or gauge `f` at label index `i` (rendering).
    std::int64_t cell(family f, std::size_t i) const noexcept;

    const scope per;
    const std::string name;

private:
    std::size_t offset(family f) const noexcept {
        return cells_of_scope(per).offset[static_cast<std::size_t>(f)];
    }
    std::unique_ptr<std::atomic<std::uint64_t>[]> counters_;
    std::unique_ptr<std::atomic<std::int64_t>[]> gauges_;
};

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

    /// The series of egress route `name` (scope::egress_route) or of upstream `name`
    /// (scope::upstream), made on first use; kept across reloads. Takes a lock: call it when a
    /// config is installed. Any thread; the reference lives as long as the registry.
    named_series& series_named(scope per, std::string_view name);

    /// The series of process counter `f` (unlabelled). Any thread.
    counter_ref counter(family f) noexcept {
        assert(info(f).per == scope::process && info(f).type == kind::counter);
        assert(info(f).label.empty());
        return counter_ref(counters_[process_cells.offset[static_cast<std::size_t>(f)]]);
    }
    /// The series of process counter `f` for label value `value`. Any thread.
    template <label L>
    counter_ref counter(family f, L value) noexcept {
        assert(info(f).per == scope::process && info(f).type == kind::counter);
        assert(detail::label_index(value) < cells_of(info(f)));
        return counter_ref(counters_[process_cells.offset[static_cast<std::size_t>(f)] +
                                     detail::label_index(value)]);
    }
    /// The series of process gauge `f` (unlabelled). Any thread.
    gauge_ref gauge(family f) noexcept {
        assert(info(f).per == scope::process && info(f).type == kind::gauge);
        assert(cells_of(info(f)) == 1);
        return gauge_ref(gauges_[process_cells.offset[static_cast<std::size_t>(f)]]);
    }

    /// Set when the store follows a master that can move (Sentinel): only then is
    /// family::store_master_switches rendered.
    std::atomic<bool> store_follows_master{false};

    /// The config now serving: `digest` (the first 16 hex digits of the SHA-256 of its file)
    /// for family::config_info, and when it was loaded, in seconds since the epoch (at start,
    /// then at each successful reload). Any thread.
    void set_config(std::string digest, std::int64_t loaded_at_seconds);

    /// The per-worker series (family::event_loop_lag, family::worker_connections): `workers`
    /// series each, all 0.
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
    /// A client connection opened (+1) or closed (-1) on worker `worker`
    /// (family::worker_connections); ignored for a worker set_workers did not count.
    void worker_connections_add(std::size_t worker, std::int64_t delta) noexcept;
    /// Client connections open now on worker `worker` (0 for one set_workers did not count).
    std::int64_t worker_connections(std::size_t worker) const noexcept;

    /// Prometheus text exposition format 0.0.4: every family of family_table, in its order.
    std::string render() const;

    /// Every route ever configured, in order of appearance, "(none)" after the start config's
    /// (the series /metrics renders). Any thread.
    std::vector<const route_metrics*> routes() const;
    /// Every egress route and upstream series series_named made, in order of appearance. Any
    /// thread.
    std::vector<const named_series*> named() const;
    /// The value of process counter or gauge `f` at label index `i` (0 without a label).
    std::int64_t value(family f, std::size_t i = 0) const noexcept;
    /// The digest of the config now serving (set_config).
    std::string config_digest() const;

private:
    /// Whether family `f` is rendered now.
    bool shows(const family_info& f) const noexcept;
    void render_process(std::string& out, const family_info& f, const std::string& digest) const;

    /// Guards the growth of routes_ (a reload adding a route) and the config digest; the
    /// counters themselves are atomics, updated without it.
    mutable std::mutex mutex_;
    /// Every route ever configured, in order of appearance; "(none)" after the start config's.
    std::vector<std::unique_ptr<route_metrics>> routes_;
    route_metrics* unrouted_ = nullptr;
    /// Every egress route and upstream series ever made, in order of appearance.
    std::vector<std::unique_ptr<named_series>> named_;
    std::array<std::atomic<std::uint64_t>, process_cells.counters> counters_{};
    std::array<std::atomic<std::int64_t>, process_cells.gauges> gauges_{};
    std::string config_digest_;
    std::size_t workers_ = 0;
    /// What each worker reports of itself: its loop's ticks, its open connections.
    struct worker_cells {
        std::atomic<std::int64_t> worst_us{0};    // the last second's largest lateness
        std::atomic<std::int64_t> next_due_us{0}; // steady clock; 0: not ticking yet
        std::atomic<std::int64_t> connections{0};
    };
    std::unique_ptr<worker_cells[]> worker_cells_;
};

} // namespace onceproxy::metrics
