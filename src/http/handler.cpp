#include "onceproxy/http/handler.hpp"

#include "http/access_log.hpp"
#include "onceproxy/config/route_table.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/problem.hpp"

#include <boost/beast/http/field.hpp>

namespace onceproxy::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using clock = std::chrono::steady_clock;

struct handler::impl {
    std::shared_ptr<const config::config> cfg;
    upstream::forwarder& fwd;
    std::shared_ptr<store::store> st;
    metrics::registry& reg;
};

handler::handler(std::shared_ptr<const config::config> cfg, upstream::forwarder& fwd,
                 std::shared_ptr<store::store> st, metrics::registry& reg)
    : impl_(std::make_unique<impl>(impl{std::move(cfg), fwd, std::move(st), reg})) {}

handler::~handler() = default;

namespace {

std::string_view path_of(std::string_view target) {
    const auto q = target.find('?');
    return q == std::string_view::npos ? target : target.substr(0, q);
}

void count(metrics::route_metrics& m, metrics::outcome o) {
    m.outcomes[static_cast<std::size_t>(o)].fetch_add(1, std::memory_order_relaxed);
}

} // namespace

/// Maps a failed forward to the problem the client sees (SPEC §3.2).
response upstream_failure(upstream::forward_status s, metrics::registry& reg) {
    using upstream::forward_status;
    switch (s) {
    case forward_status::timeout_after_send:
        reg.upstream_timeouts.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_timeout, "the upstream did not answer in time");
    case forward_status::response_too_large:
    case forward_status::bad_response:
        reg.upstream_errors.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_bad_response,
                            s == forward_status::response_too_large
                                ? "the upstream response exceeds max_response_bytes"
                                : "the upstream response could not be parsed");
    case forward_status::pool_exhausted:
        reg.upstream_errors.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_unavailable,
                            "no upstream connection available within connect_timeout");
    default:
        reg.upstream_errors.fetch_add(1, std::memory_order_relaxed);
        return make_problem(problem_code::upstream_unavailable,
                            s == forward_status::connect_failed
                                ? "could not connect to the upstream"
                                : "the upstream closed the connection before a full response");
    }
}

net::awaitable<response> handler::async_handle(request& req, const request_context& ctx) {
    auto& m = *impl_;
    const auto target = req.target();
    const auto* route = config::find_route(*m.cfg, req.method_string(), path_of(target));
    access_log_entry log;
    log.method = req.method_string();
    log.target = target;
    if (route == nullptr) {
        auto res = make_problem(problem_code::route_not_found, "no route matches this path");
        count(m.reg.unrouted(), metrics::outcome::rejected);
        if (m.cfg->access_log) {
            log.status = res.result_int();
            log.outcome = metrics::outcome::rejected;
            write_access_log(log, ctx, req);
        }
        co_return res;
    }
    const auto route_index = static_cast<std::size_t>(route - m.cfg->routes.data());
    auto& rm = m.reg.route(route_index);
    log.route = route->name;

    // TODO: guarded methods on idempotency routes go through the exchange (engine issue).
    std::string request_id;
    if (m.cfg->access_log) {
        request_id = ensure_request_id(req);
    }
    strip_hop_by_hop(req);
    add_forwarded(req, ctx.client_ip, ctx.tls ? "https" : "http");
    req.version(11);
    req.keep_alive(true);
    req.prepare_payload();

    const auto up_start = clock::now();
    auto fr = co_await m.fwd.async_forward(route->upstream_index, req);
    rm.upstream_duration.observe(clock::now() - up_start);
    response res;
    if (fr.status == upstream::forward_status::ok) {
        res = std::move(fr.res);
        strip_hop_by_hop(res);
    } else {
        res = upstream_failure(fr.status, m.reg);
    }
    count(rm, metrics::outcome::passthrough);
    rm.request_duration.observe(clock::now() - ctx.received);
    if (m.cfg->access_log) {
        log.status = res.result_int();
        log.outcome = metrics::outcome::passthrough;
        log.request_id = request_id;
        write_access_log(log, ctx, req);
    }
    co_return res;
}

} // namespace onceproxy::http
