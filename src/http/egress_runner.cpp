#include "http/egress_runner.hpp"

#include "http/exchange_translation.hpp"
#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/egress/retry_policy.hpp"
#include "onceproxy/egress/uuidv7.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/http/problem.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>

#include <openssl/rand.h>

#include <algorithm>

namespace onceproxy::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using clock = std::chrono::steady_clock;
using egress::attempt_result;
using egress::denial;
using std::chrono::milliseconds;
using upstream::forward_status;

static_assert(metrics::info(metrics::family::egress_attempts).values.count ==
              egress::attempt_result_count);
static_assert(metrics::info(metrics::family::egress_retries_denied).values.count ==
              egress::denial_count);
static_assert(metrics::info(metrics::family::egress_breaker_state).values.count ==
              egress::breaker_state_count);

namespace {

attempt_result classify(const config::retry_config& retry, const upstream::forward_result& r) {
    switch (r.status) {
    case forward_status::ok:
        return egress::retried_status(retry, r.res.result_int()) ? attempt_result::retryable_status
                                                                 : attempt_result::answered;
    case forward_status::connect_failed:
    case forward_status::pool_exhausted:
    case forward_status::tunnel_limit:
        return attempt_result::connect_failure;
    case forward_status::tls_failed:
        // A certificate that does not verify (or a refused client certificate) fails the
        // same way on the next attempt: not retried.
        return attempt_result::other;
    case forward_status::reset_after_send:
        return attempt_result::reset;
    case forward_status::timeout_after_send:
        return attempt_result::timeout;
    case forward_status::response_too_large:
    case forward_status::bad_response:
        return attempt_result::other;
    }
    return attempt_result::other;
}

/// A failure as far as the breaker is concerned: no usable answer, or a 5xx.
bool breaker_failure(attempt_result a, const upstream::forward_result& r) {
    if (a == attempt_result::answered || a == attempt_result::retryable_status) {
        return r.res.result_int() >= 500;
    }
    return true;
}

/// Uniform in [0, 1) from OpenSSL's generator (the jitter need not be secret; it is at hand).
double unit_random() {
    std::uint64_t v = 0;
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v) != 1) {
        return 0.5;
    }
    return static_cast<double>(v >> 11) * 0x1.0p-53;
}

} // namespace

std::string upstream_authority(const config::upstream_config& up) {
    std::string host = up.host.find(':') != std::string::npos ? "[" + up.host + "]" : up.host;
    if (up.port != (up.tls ? 443 : 80)) {
        host += ':' + std::to_string(up.port);
    }
    return host;
}

net::awaitable<response> async_run_egress(upstream::forwarder& fwd,
                                          const config::route_config& route, egress_route& state,
                                          request& req, egress_report& report,
                                          buffer_reservation* held) {
    const auto& retry = *route.retry;
    const auto& up = fwd.upstream(route.upstream_index);
    auto& series = *state.series;
    auto& guard = *state.guard;
    const auto started = clock::now();
    const auto deadline = started + retry.deadline;

    // One key for every attempt: the app's, or a new one for a request that is not idempotent.
    const bool idempotent = egress::idempotent_method(req.method_string());
    std::string key(req[retry.key_header]);
    if (key.empty() && !idempotent && retry.generate_key) {
        key = egress::new_uuidv7();
        req.set(retry.key_header, key);
    }
    report.key = key;
    req.set(bhttp::field::host, state.authority);

    upstream::forward_result last;
    const auto finish = [&](response res) {
        if (!key.empty()) {
            res.set(retry.key_header, key);
        }
        res.set("Onceproxy-Attempts", std::to_string(report.attempts));
        report.upstream_ms =
            std::chrono::duration_cast<milliseconds>(clock::now() - started).count();
        return res;
    };
    for (;;) {
        const auto admitted = guard.admit(clock::now());
        if (!admitted.allowed) {
            if (report.attempts == 0) {
                series.counter(metrics::family::egress_circuit_refusals).inc();
                const auto s = std::chrono::ceil<std::chrono::seconds>(admitted.retry_after);
                co_return finish(make_problem(
                    problem_code::egress_circuit_open,
                    "the circuit breaker of upstream '" + up.name +
                        "' is open after failed attempts; nothing was sent",
                    {.retry_after_s =
                         static_cast<unsigned>(std::max<std::int64_t>(1, s.count()))}));
            }
            series.counter(metrics::family::egress_retries_denied, denial::breaker).inc();
            break;
        }
        if (report.attempts == 0) {
            guard.on_request(clock::now()); // the budget counts requests sent, not refused
        }
        const auto left = std::chrono::duration_cast<milliseconds>(deadline - clock::now());
        last = {}; // the previous attempt's answer goes before the next one comes (held)
        last = co_await fwd.async_forward(route.upstream_index, req,
                                          route.limits.max_response_bytes, std::nullopt,
                                          std::max(milliseconds(1), std::min(up.timeout, left)));
        ++report.attempts;
        if (held != nullptr && last.status == forward_status::ok) {
            held->force_grow_to(req.body().size() + last.res.body().size());
        }
        const auto result = classify(retry, last);
        series.counter(metrics::family::egress_attempts, result).inc();
        guard.on_result(breaker_failure(result, last), admitted.probe, clock::now());
        if (!egress::retried_on(retry, result)) {
            break;
        }
        // A failure the route retries: whether this request may go again, and when.
        std::optional<denial> no;
        std::optional<milliseconds> wait;
        if (!idempotent && key.empty()) {
            no = denial::unsafe;
        } else if (req.body().size() > retry.max_body_bytes) {
            no = denial::body;
        } else if (report.attempts >= retry.attempts) {
            no = denial::attempts;
        } else {
            std::optional<milliseconds> retry_after;
            if (last.status == forward_status::ok) {
                if (const auto ra = last.res[bhttp::field::retry_after]; !ra.empty()) {
                    retry_after = egress::parse_retry_after(ra, std::chrono::system_clock::now());
                }
            }
            wait = egress::next_wait(
                retry,
                egress::full_jitter(egress::backoff_ceiling(retry, report.attempts), unit_random()),
                retry_after);
            if (!wait) {
                no = denial::retry_after;
            } else if (clock::now() + *wait >= deadline) {
                no = denial::deadline;
            } else if (!guard.try_retry(clock::now())) {
                no = denial::budget;
            }
        }
        if (no) {
            series.counter(metrics::family::egress_retries_denied, *no).inc();
            break;
        }
        series.counter(metrics::family::egress_retries).inc();
        net::steady_timer t(co_await net::this_coro::executor, *wait);
        co_await t.async_wait(use_tuple);
    }
    if (last.status == forward_status::ok) {
        strip_hop_by_hop(last.res);
        co_return finish(std::move(last.res));
    }
    co_return finish(upstream_failure_problem(last.status, up.name));
}

} // namespace onceproxy::http
