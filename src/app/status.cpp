#include "app/status.hpp"

#include "onceproxy/core/outcome.hpp"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

namespace onceproxy::app {

namespace json = boost::json;
using metrics::family;
using namespace std::chrono_literals;

namespace {

/// The window of the latency percentiles: the samples are a minute apart, so 1 to 2 minutes.
constexpr auto latency_window = 60s;
/// The window of the observe-mode headline.
constexpr auto hour = 3600s;

/// A process family with a label, as {value: count}.
json::object by_label(const metrics::registry& reg, family f) {
    json::object o;
    const auto& row = metrics::info(f);
    for (std::size_t i = 0; i < row.values.count; ++i) {
        o[row.values[i]] = reg.value(f, i);
    }
    return o;
}

/// A family of an egress route's or an upstream's series with a label, as {value: count}.
json::object by_label(const metrics::named_series& n, family f) {
    json::object o;
    const auto& row = metrics::info(f);
    for (std::size_t i = 0; i < row.values.count; ++i) {
        o[row.values[i]] = n.cell(f, i);
    }
    return o;
}

/// Seconds as milliseconds with 3 decimals, or null for an empty window.
json::value millis(double seconds) {
    if (seconds < 0) {
        return nullptr;
    }
    return std::round(seconds * 1e6) / 1e3;
}

/// The duplicate executions enforcement would have prevented: retries of a completed request
/// (replay) and of one still in flight (conflict).
std::uint64_t duplicates(const metrics::route_sample& r) {
    return r.observed[static_cast<std::size_t>(core::observation::replay)] +
           r.observed[static_cast<std::size_t>(core::observation::conflict)];
}

json::object route_status(std::string_view name, std::string_view mode,
                          const metrics::route_sample& now, const metrics::sample* minute_ago,
                          const metrics::sample* hour_ago,
                          std::chrono::steady_clock::time_point t) {
    json::object o;
    o["name"] = name;
    o["mode"] = mode;
    json::object requests;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < now.requests.size(); ++i) {
        requests[core::to_string(static_cast<core::outcome>(i))] = now.requests[i];
        total += now.requests[i];
    }
    o["requests"] = std::move(requests);
    o["total"] = total;

    const auto* before = minute_ago != nullptr ? minute_ago->route(name) : nullptr;
    const auto window = before != nullptr ? difference(now.latency, before->latency) : now.latency;
    json::object latency;
    latency["window_seconds"] =
        minute_ago != nullptr
            ? std::chrono::duration_cast<std::chrono::seconds>(t - minute_ago->at).count()
            : 0;
    latency["count"] = window.count;
    latency["p50_ms"] = millis(metrics::quantile(0.5, window));
    latency["p99_ms"] = millis(metrics::quantile(0.99, window));
    o["latency"] = std::move(latency);

    json::object observed;
    for (std::size_t i = 0; i < now.observed.size(); ++i) {
        observed[core::to_string(static_cast<core::observation>(i))] = now.observed[i];
    }
    o["observed"] = std::move(observed);
    const auto* hour_before = hour_ago != nullptr ? hour_ago->route(name) : nullptr;
    const auto since_start = duplicates(now);
    json::object prevented;
    prevented["since_start"] = since_start;
    prevented["last_hour"] =
        hour_before != nullptr ? since_start - duplicates(*hour_before) : since_start;
    prevented["hour_seconds"] =
        hour_ago != nullptr
            ? std::chrono::duration_cast<std::chrono::seconds>(t - hour_ago->at).count()
            : 0;
    o["duplicates_prevented"] = std::move(prevented);
    return o;
}

json::object store_status(const status_inputs& in) {
    const auto& s = in.cfg.store;
    json::object o;
    o["type"] = config::store_type_name(s.type);
    switch (s.type) {
    case config::store_type::memory:
        o["topology"] = "one process";
        o["replication"] = "none (records live in this process)";
        break;
    case config::store_type::redis: {
        const auto& r = s.redis;
        o["topology"] = !r.cluster.nodes.empty() ? "cluster" : r.sentinel ? "sentinel" : "single";
        o["replication"] = r.durability == config::redis_durability::replicated
                               ? "replicated: WAIT for " + std::to_string(r.replicas) +
                                     " replica(s) within " +
                                     std::to_string(r.wait_timeout.count()) + " ms"
                               : std::string("async");
        break;
    }
    case config::store_type::postgres:
        o["topology"] = "postgresql";
        o["replication"] = "the server's (synchronous_commit, synchronous_standby_names)";
        break;
    }
    o["answering"] = in.store_answering;
    o["answered_once"] = in.store_answered;
    std::uint64_t trips = 0;
    for (const auto* r : in.reg.routes()) {
        for (std::size_t i = 0; i < core::outcome_count; ++i) {
            trips += r->cell(family::store_round_trips, i);
        }
    }
    o["round_trips"] = trips;
    o["errors"] = by_label(in.reg, family::store_errors);
    if (in.reg.store_follows_master.load(std::memory_order_relaxed)) {
        o["master_switches"] = by_label(in.reg, family::store_master_switches);
    }
    return o;
}

/// The egress routes of the config now serving, in its order, and the upstreams they call, each
/// once; nullopt when there are none (or their series are not made yet).
std::optional<json::object> egress_status(const status_inputs& in) {
    if (!in.cfg.egress) {
        return std::nullopt;
    }
    const auto named = in.reg.named();
    const auto series = [&](metrics::scope per, std::string_view name) {
        const auto at = std::ranges::find_if(named, [&](const metrics::named_series* n) {
            return n->per == per && n->name == name;
        });
        return at != named.end() ? *at : nullptr;
    };
    json::array routes;
    json::array upstreams;
    std::vector<std::string_view> listed;
    for (const auto& r : in.cfg.egress->routes) {
        const auto* s = series(metrics::scope::egress_route, r.name);
        if (s == nullptr) {
            continue;
        }
        json::object o;
        o["name"] = r.name;
        o["upstream"] = r.upstream;
        o["attempts"] = by_label(*s, family::egress_attempts);
        o["retries"] = s->cell(family::egress_retries, 0);
        o["retries_denied"] = by_label(*s, family::egress_retries_denied);
        o["circuit_refusals"] = s->cell(family::egress_circuit_refusals, 0);
        routes.push_back(std::move(o));

        const auto* u = series(metrics::scope::upstream, r.upstream);
        if (u == nullptr || std::ranges::find(listed, r.upstream) != listed.end()) {
            continue;
        }
        listed.push_back(r.upstream);
        json::object up;
        up["name"] = r.upstream;
        const auto& states = metrics::info(family::egress_breaker_state).values;
        json::value breaker = nullptr;
        for (std::size_t i = 0; i < states.count; ++i) {
            if (u->cell(family::egress_breaker_state, i) == 1) {
                breaker = states[i];
            }
        }
        up["breaker"] = std::move(breaker);
        up["breaker_transitions"] = by_label(*u, family::egress_breaker_transitions);
        upstreams.push_back(std::move(up));
    }
    if (routes.empty()) {
        return std::nullopt;
    }
    json::object o;
    o["routes"] = std::move(routes);
    o["upstreams"] = std::move(upstreams);
    return o;
}

} // namespace

std::string status_json(const status_inputs& in) {
    const auto t = std::chrono::steady_clock::now();
    const auto now = metrics::sample_of(in.reg, t);
    const auto* minute_ago = in.past.at_least(latency_window, t);
    const auto* hour_ago = in.past.at_least(hour, t);
    const auto& reg = in.reg;

    json::object doc;
    const auto wall = std::chrono::system_clock::now().time_since_epoch();
    doc["generated_at"] =
        static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(wall).count()) /
        1e3;
    doc["uptime_seconds"] =
        std::chrono::duration_cast<std::chrono::seconds>(t - in.started).count();
    doc["draining"] = in.draining;

    json::object cfg;
    cfg["sha256"] = reg.config_digest();
    cfg["loaded_at"] = reg.value(family::config_loaded_at);
    cfg["reloads"] = by_label(reg, family::config_reloads);
    cfg["workers"] = in.cfg.workers;
    doc["config"] = std::move(cfg);

    json::object conn;
    conn["open"] = reg.value(family::open_connections);
    conn["limit"] = reg.value(family::connection_limit);
    conn["refused"] = reg.value(family::connections_refused);
    conn["by_protocol"] = by_label(reg, family::client_connections);
    conn["tunnels_open"] = reg.value(family::tunnels_open);
    conn["buffered_bytes"] = reg.value(family::buffered_bytes);
    conn["buffered_bytes_limit"] = reg.value(family::buffered_bytes_limit);
    doc["connections"] = std::move(conn);

    doc["store"] = store_status(in);

    json::object tls;
    const auto expiry = reg.value(family::tls_certificate_expiry);
    tls["inbound"] = expiry != 0;
    tls["certificate_expires_at"] = expiry != 0 ? json::value(expiry) : json::value(nullptr);
    tls["certificate_reloads"] = by_label(reg, family::tls_certificate_reloads);
    tls["handshake_failures"] = reg.value(family::tls_handshake_failures);
    tls["upstream_reloads"] = by_label(reg, family::upstream_tls_reloads);
    doc["tls"] = std::move(tls);

    // The routes of the config now serving, in its order, then the unrouted requests.
    json::array routes;
    const auto add = [&](std::string_view name, std::string_view mode) {
        if (const auto* r = now.route(name)) {
            routes.push_back(route_status(name, mode, *r, minute_ago, hour_ago, t));
        }
    };
    for (const auto& r : in.cfg.routes) {
        add(r.name, config::idempotency_mode_name(r.idempotency.mode));
    }
    add("(none)", "unrouted");
    doc["routes"] = std::move(routes);
    if (auto egress = egress_status(in)) {
        doc["egress"] = std::move(*egress);
    }
    return json::serialize(doc);
}

} // namespace onceproxy::app
