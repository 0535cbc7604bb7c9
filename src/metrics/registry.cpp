#include "onceproxy/metrics/registry.hpp"

#include <cstdio>

namespace onceproxy::metrics {

std::string_view outcome_name(outcome o) noexcept {
    switch (o) {
    case outcome::stored:
        return "stored";
    case outcome::replayed:
        return "replayed";
    case outcome::in_progress:
        return "in_progress";
    case outcome::mismatch:
        return "mismatch";
    case outcome::missing_key:
        return "missing_key";
    case outcome::invalid_key:
        return "invalid_key";
    case outcome::released:
        return "released";
    case outcome::held:
        return "held";
    case outcome::outcome_unknown:
        return "outcome_unknown";
    case outcome::not_replayable:
        return "not_replayable";
    case outcome::lease_lost:
        return "lease_lost";
    case outcome::record_failed:
        return "record_failed";
    case outcome::store_error:
        return "store_error";
    case outcome::passthrough:
        return "passthrough";
    case outcome::rejected:
        return "rejected";
    }
    return "unknown";
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
}

std::string registry::render() const {
    std::string out;
    out.reserve(8192);
    out += "# HELP onceproxy_requests_total Requests by route and final outcome.\n"
           "# TYPE onceproxy_requests_total counter\n";
    for (const auto& r : routes_) {
        for (std::size_t i = 0; i < outcome_count; ++i) {
            out += "onceproxy_requests_total{route=\"" + r->name + "\",outcome=\"" +
                   std::string(outcome_name(static_cast<outcome>(i))) + "\"} " +
                   std::to_string(r->outcomes[i].load(std::memory_order_relaxed)) + "\n";
        }
    }
    const std::pair<const char*, histogram route_metrics::*> hists[] = {
        {"onceproxy_request_duration_seconds", &route_metrics::request_duration},
        {"onceproxy_upstream_duration_seconds", &route_metrics::upstream_duration},
        {"onceproxy_store_duration_seconds", &route_metrics::store_duration},
    };
    for (const auto& [name, member] : hists) {
        out += std::string("# TYPE ") + name + " histogram\n";
        for (const auto& r : routes_) {
            ((*r).*member).render(out, name, "route=\"" + r->name + "\"");
        }
    }
    out += "# HELP onceproxy_open_connections Client connections currently open.\n"
           "# TYPE onceproxy_open_connections gauge\n"
           "onceproxy_open_connections " +
           std::to_string(open_connections.load(std::memory_order_relaxed)) + "\n";
    out += "# HELP onceproxy_store_errors_total Store operations that failed.\n"
           "# TYPE onceproxy_store_errors_total counter\n"
           "onceproxy_store_errors_total " +
           std::to_string(store_errors.load(std::memory_order_relaxed)) + "\n";
    out += "# HELP onceproxy_upstream_errors_total Upstream exchanges that failed, by kind.\n"
           "# TYPE onceproxy_upstream_errors_total counter\n"
           "onceproxy_upstream_errors_total{kind=\"unavailable\"} " +
           std::to_string(upstream_errors.load(std::memory_order_relaxed)) + "\n" +
           "onceproxy_upstream_errors_total{kind=\"timeout\"} " +
           std::to_string(upstream_timeouts.load(std::memory_order_relaxed)) + "\n";
    out += "# HELP onceproxy_connection_limit Client connections allowed at once "
           "(limits.max_connections, lowered to fit the descriptor limit).\n"
           "# TYPE onceproxy_connection_limit gauge\n"
           "onceproxy_connection_limit " +
           std::to_string(connection_limit.load(std::memory_order_relaxed)) + "\n";
    out += "# HELP onceproxy_connections_refused_total Client connections refused with 503 "
           "because the connection limit was reached.\n"
           "# TYPE onceproxy_connections_refused_total counter\n"
           "onceproxy_connections_refused_total " +
           std::to_string(connections_refused.load(std::memory_order_relaxed)) + "\n";
    out += "# HELP onceproxy_accept_errors_total Failed accepts (e.g. out of descriptors), by "
           "listener; the listener backs off and goes on.\n"
           "# TYPE onceproxy_accept_errors_total counter\n"
           "onceproxy_accept_errors_total{listener=\"proxy\"} " +
           std::to_string(accept_errors_proxy.load(std::memory_order_relaxed)) + "\n" +
           "onceproxy_accept_errors_total{listener=\"admin\"} " +
           std::to_string(accept_errors_admin.load(std::memory_order_relaxed)) + "\n";
    out += "# HELP onceproxy_internal_errors_total Exceptions caught in an event loop or a "
           "connection (logged; the worker goes on serving).\n"
           "# TYPE onceproxy_internal_errors_total counter\n"
           "onceproxy_internal_errors_total " +
           std::to_string(internal_errors.load(std::memory_order_relaxed)) + "\n";
    return out;
}

} // namespace onceproxy::metrics
