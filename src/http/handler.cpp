#include "onceproxy/http/handler.hpp"

#include "http/access_log.hpp"
#include "http/egress_runner.hpp"
#include "http/exchange_runner.hpp"
#include "http/grpc_answer.hpp"
#include "http/plain_relay.hpp"
#include "onceproxy/config/route_table.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/http/request_target.hpp"
#include "onceproxy/upstream/h2_upstream.hpp"

#include <boost/beast/http/field.hpp>

#include <algorithm>
#include <string_view>
#include <vector>

namespace onceproxy::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using clock = std::chrono::steady_clock;

struct handler::impl {
    impl(std::shared_ptr<const config::config> c, std::shared_ptr<upstream::forwarder> f,
         std::shared_ptr<store::store> s, metrics::registry& r, task_tracker& t,
         const std::shared_ptr<egress::upstream_guards>& guards)
        : cfg(c), reg(r), env(std::make_shared<exchange_env>(
                              exchange_env{std::move(c), std::move(f), std::move(s), r, t, {}})) {
        if (guards) {
            // The egress listener's: its routes have series of their own, not an inbound
            // route's (an unrouted request still counts as one of no route).
            for (const auto& route : cfg->routes) {
                egress_routes.push_back(egress_route_of(route, *guards));
                env->route_series.push_back(&reg.unrouted());
                fields_in_use.push_back(request_fields_in_use(route.idempotency));
                ready_after_facts.push_back(!facts_read_changed_fields(route.idempotency));
            }
            return;
        }
        if (const auto& keys = cfg->store.encryption.keys; !keys.empty()) {
            std::vector<core::record_key> ck;
            for (const auto& k : keys) {
                ck.push_back({k.id, k.bytes});
            }
            env->cipher = std::make_shared<const core::record_cipher>(std::move(ck));
        }
        for (const auto& route : cfg->routes) {
            env->route_series.push_back(&reg.route_named(route.name));
            fields_in_use.push_back(request_fields_in_use(route.idempotency));
            grpc_routes = grpc_routes || !route.match.grpc.empty();
            ready_after_facts.push_back(!facts_read_changed_fields(route.idempotency));
        }
    }

    std::shared_ptr<const config::config> cfg;
    metrics::registry& reg;
    /// Shared with the exchanges of this config (some outlive their request).
    std::shared_ptr<exchange_env> env;
    /// Per route: the request fields Connection may not nominate away (computed once; the
    /// views point into `cfg`).
    std::vector<std::vector<std::string_view>> fields_in_use;
    /// Some route has a grpc match: only then does routing look at a request's content-type.
    bool grpc_routes = false;
    /// Per route: its request facts (key, scope, fingerprint) read no field ready_for_upstream
    /// changes, so a guarded request is readied only when it is forwarded (a replay never is).
    std::vector<bool> ready_after_facts;

    static bool facts_read_changed_fields(const config::idempotency_config& idem) {
        const auto named = [](const std::vector<std::string>& names) {
            return std::any_of(names.begin(), names.end(), changed_for_upstream);
        };
        return changed_for_upstream(idem.key.header) || named(idem.scope_headers) ||
               named(idem.fingerprint_headers);
    }
    /// The egress listener's handler: per route, its upstream's guard and its series.
    std::vector<egress_route> egress_routes;

    /// Hands the access-log line over; a line the full writer dropped is counted.
    void write_log(const access_log_entry& log, const request_context& ctx, const request& req) {
        if (!write_access_log(log, ctx, req)) {
            reg.counter(metrics::family::access_log_dropped).inc();
        }
    }

    /// An egress route's request (`route.retry` set): sent, and sent again as its route says.
    net::awaitable<handled> handle_egress(request& req, const config::route_config& route,
                                          std::size_t route_index, const request_context& ctx,
                                          access_log_entry& log, buffer_reservation* held);

    egress_route egress_route_of(const config::route_config& route,
                                 egress::upstream_guards& guards) {
        const auto& e = *cfg->egress;
        auto& up = reg.series_named(metrics::scope::upstream, route.upstream);
        auto guard =
            guards.of(route.upstream, e.budget, e.breaker, [&up](egress::breaker_state now) {
                for (std::size_t i = 0; i < egress::breaker_state_count; ++i) {
                    up.gauge(metrics::family::egress_breaker_state,
                             static_cast<egress::breaker_state>(i))
                        .set(i == static_cast<std::size_t>(now) ? 1 : 0);
                }
                up.counter(metrics::family::egress_breaker_transitions, now).inc();
            });
        if (up.cell(metrics::family::egress_breaker_state, 0) +
                up.cell(metrics::family::egress_breaker_state, 1) +
                up.cell(metrics::family::egress_breaker_state, 2) ==
            0) {
            // A new upstream: its breaker starts closed.
            up.gauge(metrics::family::egress_breaker_state, egress::breaker_state::closed).set(1);
        }
        return {std::move(guard), &reg.series_named(metrics::scope::egress_route, route.name),
                upstream_authority(cfg->upstreams[route.upstream_index])};
    }
    plain_relay relay{cfg, *env->fwd, reg, fields_in_use, env->route_series};
};

handler::handler(std::shared_ptr<const config::config> cfg,
                 std::shared_ptr<upstream::forwarder> fwd, std::shared_ptr<store::store> st,
                 metrics::registry& reg, task_tracker& tracker,
                 std::shared_ptr<egress::upstream_guards> egress)
    : impl_(std::make_unique<impl>(std::move(cfg), std::move(fwd), std::move(st), reg, tracker,
                                   egress)) {}

handler::~handler() = default;

const config::config& handler::config() const noexcept {
    return *impl_->cfg;
}

namespace {

std::string_view path_of(std::string_view target) {
    const auto q = target.find('?');
    return q == std::string_view::npos ? target : target.substr(0, q);
}

} // namespace

const config::route_config* handler::route_for(const request& head, std::size_t& index) const {
    const auto* route =
        config::find_route(*impl_->cfg, head.method_string(), path_of(head.target()),
                           impl_->grpc_routes && is_grpc_call(head));
    if (route != nullptr) {
        index = static_cast<std::size_t>(route - impl_->cfg->routes.data());
    }
    return route;
}

admission handler::admit(request& head, std::optional<std::uint64_t> declared_length) const {
    admission a;
    if (const auto why = refuse_request_head(head); !why.empty()) {
        a.refusal = make_problem(problem_code::bad_request, why);
        return a;
    }
    if (!is_normal_target(head.target())) {
        // Routed and forwarded as normalised, so the route that guards a path and the app
        // that serves it read the same path.
        const auto t = normalize_target(head.target());
        if (t.refused != nullptr) {
            a.refusal = make_problem(problem_code::bad_request, t.refused);
            return a;
        }
        head.target(t.target);
    }
    a.route = route_for(head, a.route_index);
    if (a.route != nullptr && config::refuses_path(*a.route, path_of(head.target()))) {
        a.refusal = make_problem(
            problem_code::bad_request,
            "the route refuses path parameters (;) in its paths (match.path_params: refuse)");
        return a;
    }
    a.body_limit = a.route != nullptr
                       ? a.route->limits.max_request_bytes
                       : std::optional<std::size_t>(impl_->cfg->limits.max_request_bytes);
    if (a.body_limit && declared_length.value_or(0) > *a.body_limit) {
        a.refusal = read_failure_problem(bhttp::error::body_limit, "request body");
    }
    return a;
}

bool handler::guards(const config::route_config& route, const request& req) const {
    return impl_->env->st && is_guarded(route, req.method_string(), path_of(req.target()));
}

bool handler::reads_whole(const config::route_config& route, const request& req) const {
    // An egress request's body is kept for its retries.
    return route.retry || guards(route, req);
}

bool handler::streams(const config::route_config& route, const request& req) const {
    // An HTTP/2 upstream's plain requests from HTTP/1.1 clients are forwarded whole.
    return !reads_whole(route, req) && impl_->env->fwd->h2(route.upstream_index) == nullptr;
}

net::awaitable<bool> handler::async_relay(client_side client, wire::request_parser& parser,
                                          const config::route_config& route,
                                          std::size_t route_index, const request_context& ctx) {
    return impl_->relay.async_relay(client, parser, route, route_index, ctx);
}

net::awaitable<void> handler::async_relay_h2(h2_stream& client, request& req, bool has_body,
                                             const config::route_config& route,
                                             std::size_t route_index, const request_context& ctx) {
    return impl_->relay.async_relay_h2(client, req, has_body, route, route_index, ctx);
}

net::awaitable<handled> handler::async_handle(request& req, const config::route_config* route,
                                              std::size_t route_index, const request_context& ctx,
                                              client_side client,
                                              std::shared_ptr<buffer_reservation> held) {
    auto& m = *impl_;
    const auto target = req.target();
    access_log_entry log;
    log.method = req.method_string();
    log.target = target;
    if (route == nullptr) {
        auto res = make_problem(problem_code::route_not_found, "no route matches this path");
        m.reg.unrouted().counter(metrics::family::requests, metrics::outcome::rejected).inc();
        if (m.cfg->access_log) {
            log.status = res.result_int();
            log.outcome = metrics::outcome::rejected;
            m.write_log(log, ctx, req);
        }
        co_return handled{std::move(res)};
    }
    if (route->retry) {
        co_return co_await m.handle_egress(req, *route, route_index, ctx, log, held.get());
    }
    auto& rm = *m.env->route_series[route_index];
    log.route = route->name;
    const std::string method(req.method_string());
    const std::string target_copy(target);
    log.method = method;
    log.target = target_copy;

    const bool guarded = guards(*route, req);
    const std::string_view proto = ctx.tls ? "https" : "http";
    const bool ready_later = guarded && m.ready_after_facts[route_index];
    // What the client's request says about a streamed answer, before the rewrite below.
    const stream_target sink{client,           req.version(),
                             req.keep_alive(), req.method() == bhttp::verb::head,
                             ctx.client_ip,    ready_later ? proto : std::string_view()};
    std::string request_id;
    if (m.cfg->access_log) {
        request_id = ensure_request_id(req);
    }
    strip_hop_by_hop(req, m.fields_in_use[route_index]);
    if (!ready_later) {
        ready_for_upstream(req, ctx.client_ip, proto, m.cfg->trusted_proxies);
    }

    exchange_report report;
    std::optional<response> res;
    if (!guarded) {
        // A plain request the caller could not stream (an HTTP/2 upstream): forwarded whole.
        const auto& lim = route->limits.max_response_bytes;
        auto r = co_await m.env->fwd->async_forward(
            route->upstream_index, req,
            lim ? lim : std::optional<std::size_t>(m.cfg->limits.max_response_bytes));
        if (r.status == upstream::forward_status::ok) {
            strip_hop_by_hop(r.res);
            res = std::move(r.res);
            report.trailers = std::move(r.trailers);
        } else {
            res =
                upstream_failure(r.status, m.reg, m.env->fwd->upstream(route->upstream_index).name);
        }
        rm.counter(metrics::family::requests, metrics::outcome::passthrough).inc();
    } else {
        res = co_await async_run_exchange(m.env, *route, route_index, req, report, sink,
                                          std::move(held));
    }
    rm.histogram(metrics::family::request_duration).observe(clock::now() - ctx.received);
    if (m.cfg->access_log) {
        log.status = report.streamed ? report.streamed_status : res->result_int();
        log.outcome = report.outcome;
        log.request_id = request_id;
        log.key_hash = report.key_hash;
        log.upstream_ms = report.upstream_ms;
        log.store_ms = report.store_ms;
        m.write_log(log, ctx, req);
    }
    co_return handled{std::move(res), report.streamed, report.keep, std::move(report.trailers)};
}

net::awaitable<handled>
handler::impl::handle_egress(request& req, const config::route_config& route,
                             std::size_t route_index, const request_context& ctx,
                             access_log_entry& log, buffer_reservation* held) {
    auto& m = *this;
    const std::string method(req.method_string());
    const std::string target(req.target());
    log.route = route.name;
    log.method = method;
    log.target = target;
    std::string request_id;
    if (m.cfg->access_log) {
        request_id = ensure_request_id(req);
    }
    strip_hop_by_hop(req, m.fields_in_use[route_index]);
    req.version(11);
    req.keep_alive(true);
    req.prepare_payload();
    egress_report report;
    auto res = co_await async_run_egress(*m.env->fwd, route, m.egress_routes[route_index], req,
                                         report, held);
    if (m.cfg->access_log) {
        log.status = res.result_int();
        log.request_id = request_id;
        log.upstream_ms = static_cast<double>(report.upstream_ms);
        log.egress_key = report.key;
        log.egress = true;
        log.attempts = report.attempts;
        m.write_log(log, ctx, req);
    }
    co_return handled{std::move(res)};
}

} // namespace onceproxy::http
