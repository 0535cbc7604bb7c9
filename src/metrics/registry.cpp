#include "onceproxy/metrics/registry.hpp"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <vector>

namespace onceproxy::metrics {

std::string_view outcome_name(outcome o) noexcept {
    return core::to_string(o);
}

void histogram_cells::observe(std::chrono::nanoseconds d) noexcept {
    const double s = std::chrono::duration<double>(d).count();
    std::size_t i = 0;
    while (i < latency_buckets.size() && s > latency_buckets[i]) {
        ++i;
    }
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(d.count()), std::memory_order_relaxed);
}

void histogram_cells::render(std::string& out, std::string_view name,
                             std::string_view labels) const {
    std::uint64_t cumulative = 0;
    char num[64];
    for (std::size_t i = 0; i <= latency_buckets.size(); ++i) {
        cumulative += buckets_[i].load(std::memory_order_relaxed);
        out += name;
        out += "_bucket{";
        out += labels;
        out += ",le=\"";
        if (i < latency_buckets.size()) {
            std::snprintf(num, sizeof num, "%g", latency_buckets[i]);
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

histogram_cells::counts histogram_cells::read() const noexcept {
    counts c;
    for (std::size_t i = 0; i < c.buckets.size(); ++i) {
        c.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
        c.count += c.buckets[i];
    }
    return c;
}

registry::registry(const std::vector<std::string>& route_names) {
    for (const auto& n : route_names) {
        routes_.push_back(std::make_unique<route_metrics>(n));
    }
    routes_.push_back(std::make_unique<route_metrics>("(none)"));
    unrouted_ = routes_.back().get();
}

void registry::set_workers(std::size_t workers) {
    worker_cells_ = std::make_unique<worker_cells[]>(workers);
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
    auto& t = worker_cells_[worker];
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
    const auto& t = worker_cells_[worker];
    const auto due = t.next_due_us.load(std::memory_order_relaxed);
    const std::int64_t overdue = due == 0 ? 0 : steady_micros(now) - due;
    return std::chrono::microseconds(std::max(t.worst_us.load(std::memory_order_relaxed), overdue));
}

void registry::worker_connections_add(std::size_t worker, std::int64_t delta) noexcept {
    if (worker < workers_) {
        worker_cells_[worker].connections.fetch_add(delta, std::memory_order_relaxed);
    }
}

std::int64_t registry::worker_connections(std::size_t worker) const noexcept {
    return worker < workers_ ? worker_cells_[worker].connections.load(std::memory_order_relaxed)
                             : 0;
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
    routes_.push_back(std::make_unique<route_metrics>(std::string(name)));
    return *routes_.back();
}

named_series::named_series(scope p, std::string series_name)
    : per(p), name(std::move(series_name)),
      counters_(new std::atomic<std::uint64_t>[cells_of_scope(p).counters + 1]()),
      gauges_(new std::atomic<std::int64_t>[cells_of_scope(p).gauges + 1]()) {}

std::int64_t named_series::cell(family f, std::size_t i) const noexcept {
    const auto at = offset(f) + i;
    return info(f).type == kind::gauge
               ? gauges_[at].load(std::memory_order_relaxed)
               : static_cast<std::int64_t>(counters_[at].load(std::memory_order_relaxed));
}

named_series& registry::series_named(scope per, std::string_view name) {
    assert(per == scope::egress_route || per == scope::upstream);
    std::lock_guard lk(mutex_);
    for (const auto& n : named_) {
        if (n->per == per && n->name == name) {
            return *n;
        }
    }
    named_.push_back(std::make_unique<named_series>(per, std::string(name)));
    return *named_.back();
}

void registry::set_config(std::string digest, std::int64_t loaded_at_seconds) {
    std::lock_guard lk(mutex_);
    config_digest_ = std::move(digest);
    gauge(family::config_loaded_at).set(loaded_at_seconds);
}

std::vector<const route_metrics*> registry::routes() const {
    std::lock_guard lk(mutex_);
    std::vector<const route_metrics*> out;
    for (const auto& r : routes_) {
        out.push_back(r.get());
    }
    return out;
}

std::vector<const named_series*> registry::named() const {
    std::lock_guard lk(mutex_);
    std::vector<const named_series*> out;
    for (const auto& n : named_) {
        out.push_back(n.get());
    }
    return out;
}

std::int64_t registry::value(family f, std::size_t i) const noexcept {
    const auto& row = info(f);
    assert(row.per == scope::process && row.from == source::cells && i < cells_of(row));
    const auto cell = process_cells.offset[static_cast<std::size_t>(f)] + i;
    return row.type == kind::gauge
               ? gauges_[cell].load(std::memory_order_relaxed)
               : static_cast<std::int64_t>(counters_[cell].load(std::memory_order_relaxed));
}

std::string registry::config_digest() const {
    std::lock_guard lk(mutex_);
    return config_digest_;
}

bool registry::shows(const family_info& f) const noexcept {
    switch (f.when) {
    case shown::always:
    case shown::counted:
        return true;
    case shown::follows_master:
        return store_follows_master.load(std::memory_order_relaxed);
    case shown::workers:
        return workers_ > 0;
    case shown::egress:
        return true; // decided by render: when series of the family's scope exist
    case shown::inbound_tls:
        return gauges_[process_cells
                           .offset[static_cast<std::size_t>(family::tls_certificate_expiry)]]
                   .load(std::memory_order_relaxed) != 0;
    }
    return false;
}

void registry::render_process(std::string& out, const family_info& f,
                              const std::string& digest) const {
    const auto series = [&](std::string_view value, std::string_view sample) {
        out += f.name;
        if (!f.label.empty()) {
            out += '{';
            out += f.label;
            out += "=\"";
            out += value;
            out += "\"}";
        }
        out += ' ';
        out += sample;
        out += '\n';
    };
    switch (f.from) {
    case source::cells: {
        const auto offset = process_cells.offset[static_cast<std::size_t>(f.id)];
        for (std::size_t i = 0; i < cells_of(f); ++i) {
            const auto v = f.type == kind::gauge
                               ? static_cast<std::uint64_t>(
                                     gauges_[offset + i].load(std::memory_order_relaxed))
                               : counters_[offset + i].load(std::memory_order_relaxed);
            series(f.label.empty() ? std::string_view() : f.values[i], std::to_string(v));
        }
        return;
    }
    case source::config_digest:
        series(digest, "1");
        return;
    case source::event_loop_lag: {
        char num[64];
        const auto now = std::chrono::steady_clock::now();
        for (std::size_t w = 0; w < workers_; ++w) {
            std::snprintf(num, sizeof num, "%.6f",
                          std::chrono::duration<double>(event_loop_lag(w, now)).count());
            series(std::to_string(w), num);
        }
        return;
    }
    case source::worker_connections:
        for (std::size_t w = 0; w < workers_; ++w) {
            series(std::to_string(w), std::to_string(worker_connections(w)));
        }
        return;
    }
}

std::string registry::render() const {
    // A snapshot of the lists: the series themselves are read without the lock.
    const auto routes_now = routes();
    const auto named_now = named();
    const auto digest = config_digest();
    static constexpr std::string_view type_names[] = {"counter", "gauge", "histogram"};
    std::string out;
    out.reserve(8192);
    for (const auto& f : family_table) {
        if (!shows(f)) {
            continue;
        }
        if (f.when == shown::egress &&
            std::none_of(named_now.begin(), named_now.end(),
                         [&](const named_series* n) { return n->per == f.per; })) {
            continue;
        }
        if (!f.help.empty()) {
            out += "# HELP ";
            out += f.name;
            out += ' ';
            out += f.help;
            out += '\n';
        }
        out += "# TYPE ";
        out += f.name;
        out += ' ';
        out += type_names[static_cast<std::size_t>(f.type)];
        out += '\n';
        if (f.per == scope::process) {
            render_process(out, f, digest);
            continue;
        }
        if (f.per == scope::egress_route || f.per == scope::upstream) {
            const std::string_view key = f.per == scope::upstream ? "upstream" : "route";
            for (const auto* n : named_now) {
                if (n->per != f.per) {
                    continue;
                }
                for (std::size_t i = 0; i < cells_of(f); ++i) {
                    out += f.name;
                    out += '{';
                    out += key;
                    out += "=\"";
                    out += n->name;
                    out += '"';
                    if (!f.label.empty()) {
                        out += ',';
                        out += f.label;
                        out += "=\"";
                        out += f.values[i];
                        out += '"';
                    }
                    out += "} ";
                    out += std::to_string(n->cell(f.id, i));
                    out += '\n';
                }
            }
            continue;
        }
        for (const auto* r : routes_now) {
            const std::string route_label = "route=\"" + r->name + "\"";
            if (f.type == kind::histogram) {
                r->histogram(f.id).render(out, f.name, route_label);
                continue;
            }
            for (std::size_t i = 0; i < f.values.count; ++i) {
                const auto n = r->cell(f.id, i);
                if (f.when == shown::counted && n == 0 && r->cell(family::requests, i) == 0) {
                    continue; // an outcome without requests has no round trips to show
                }
                out += f.name;
                out += '{';
                out += route_label;
                out += ',';
                out += f.label;
                out += "=\"";
                out += f.values[i];
                out += "\"} ";
                out += std::to_string(n);
                out += '\n';
            }
        }
    }
    return out;
}

} // namespace onceproxy::metrics
