#include "onceproxy/metrics/registry.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace onceproxy::metrics;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> type_lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("# TYPE ", 0) == 0) {
            out.push_back(line);
        }
    }
    return out;
}

/// The causes of store::master_switch_cause, in its order (app/ checks that order at compile
/// time against the family's values).
enum class switch_cause { switch_master, readonly, connection_lost };

} // namespace

// Golden list: dashboards and alerts are built on these names; a change here is a breaking change
// for operators and must be deliberate.
TEST_CASE("metrics: the exposed metric families are stable") {
    registry reg({"payments"});
    const auto text = reg.render();
    CHECK(type_lines(text) == std::vector<std::string>{
                                  "# TYPE onceproxy_requests_total counter",
                                  "# TYPE onceproxy_record_decrypt_failures_total counter",
                                  "# TYPE onceproxy_store_round_trips_total counter",
                                  "# TYPE onceproxy_observed_total counter",
                                  "# TYPE onceproxy_keys_purged_total counter",
                                  "# TYPE onceproxy_request_duration_seconds histogram",
                                  "# TYPE onceproxy_upstream_duration_seconds histogram",
                                  "# TYPE onceproxy_store_duration_seconds histogram",
                                  "# TYPE onceproxy_open_connections gauge",
                                  "# TYPE onceproxy_store_errors_total counter",
                                  "# TYPE onceproxy_upstream_errors_total counter",
                                  "# TYPE onceproxy_late_answers_total counter",
                                  "# TYPE onceproxy_upstream_resends_total counter",
                                  "# TYPE onceproxy_connection_limit gauge",
                                  "# TYPE onceproxy_connections_refused_total counter",
                                  "# TYPE onceproxy_accept_errors_total counter",
                                  "# TYPE onceproxy_admin_connections_refused_total counter",
                                  "# TYPE onceproxy_admin_auth_throttled_total counter",
                                  "# TYPE onceproxy_internal_errors_total counter",
                                  "# TYPE onceproxy_tunnels_total counter",
                                  "# TYPE onceproxy_tunnels_open gauge",
                                  "# TYPE onceproxy_tunnels_refused_total counter",
                                  "# TYPE onceproxy_access_log_dropped_total counter",
                                  "# TYPE onceproxy_client_timeouts_total counter",
                                  "# TYPE onceproxy_buffered_bytes gauge",
                                  "# TYPE onceproxy_buffered_bytes_limit gauge",
                                  "# TYPE onceproxy_buffered_refusals_total counter",
                                  "# TYPE onceproxy_config_reloads_total counter",
                                  "# TYPE onceproxy_config_info gauge",
                                  "# TYPE onceproxy_config_last_reload_success_timestamp_seconds "
                                  "gauge",
                                  "# TYPE onceproxy_upstream_tls_reloads_total counter",
                                  "# TYPE onceproxy_client_connections_total counter",
                                  "# TYPE onceproxy_client_requests_total counter",
                                  "# TYPE onceproxy_http2_goaways_total counter",
                              });
}

TEST_CASE("metrics: record decrypt failures by route and reason") {
    registry reg({"payments"});
    reg.route(0)
        .counter(family::record_decrypt_failures, onceproxy::core::record_open_failure::unknown_key)
        .inc();
    reg.route(0)
        .counter(family::record_decrypt_failures, onceproxy::core::record_open_failure::unknown_key)
        .inc();
    reg.route(0)
        .counter(family::record_decrypt_failures,
                 onceproxy::core::record_open_failure::authentication)
        .inc();
    const auto text = reg.render();
    const std::string series = "onceproxy_record_decrypt_failures_total{route=\"payments\",reason=";
    CHECK(text.find(series + "\"unknown_key\"} 2\n") != std::string::npos);
    CHECK(text.find(series + "\"authentication\"} 1\n") != std::string::npos);
    CHECK(text.find(series + "\"plaintext\"} 0\n") != std::string::npos);
    CHECK(text.find(series + "\"malformed\"} 0\n") != std::string::npos);
}

TEST_CASE("metrics: every outcome of SPEC §6 has a series per route") {
    registry reg({"payments", "orders"});
    const auto text = reg.render();
    for (const char* o : {"stored", "replayed", "in_progress", "mismatch", "missing_key",
                          "invalid_key", "released", "held", "outcome_unknown", "not_replayable",
                          "lease_lost", "record_failed", "store_error", "passthrough"}) {
        CAPTURE(o);
        for (const char* r : {"payments", "orders"}) {
            CHECK(text.find("onceproxy_requests_total{route=\"" + std::string(r) + "\",outcome=\"" +
                            o + "\"} 0\n") != std::string::npos);
        }
    }
}

TEST_CASE("metrics: observe mode's would-be actions have a series per route") {
    registry reg({"payments", "orders"});
    reg.route(0).counter(family::observed, onceproxy::core::observation::replay).inc();
    reg.route(0).counter(family::observed, onceproxy::core::observation::replay).inc();
    reg.route(1).counter(family::observed, onceproxy::core::observation::mismatch).inc();
    CHECK(reg.route(0).counter(family::observed, onceproxy::core::observation::replay).value() ==
          2);
    const auto text = reg.render();
    CHECK(text.find("onceproxy_observed_total{route=\"payments\",would=\"replay\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_observed_total{route=\"orders\",would=\"mismatch\"} 1\n") !=
          std::string::npos);
    for (const char* w : {"conflict", "mismatch", "missing_key", "invalid_key", "not_replayable"}) {
        CAPTURE(w);
        CHECK(text.find("onceproxy_observed_total{route=\"payments\",would=\"" + std::string(w) +
                        "\"} 0\n") != std::string::npos);
    }
    // Observations are not outcomes: the request counts stay apart.
    CHECK(reg.route(0).counter(family::requests, outcome::replayed).value() == 0);
}

TEST_CASE("metrics: counters and histograms render what was recorded") {
    registry reg({"payments"});
    for (int i = 0; i < 3; ++i) {
        reg.route(0).counter(family::requests, outcome::replayed).inc();
    }
    CHECK(reg.route(0).counter(family::requests, outcome::replayed).value() == 3);
    reg.route(0).histogram(family::request_duration).observe(2ms); // in the 0.0025 bucket and above
    reg.route(0).histogram(family::request_duration).observe(700ms); // in the 1 bucket and above
    reg.counter(family::store_errors, store_error_cause::not_replicated).inc();
    reg.counter(family::store_errors, store_error_cause::not_replicated).inc();
    reg.counter(family::store_errors, store_error_cause::timeout).inc();
    const auto text = reg.render();
    CHECK(text.find("onceproxy_requests_total{route=\"payments\",outcome=\"replayed\"} 3\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_request_duration_seconds_bucket{route=\"payments\",le=\"0.001\"} "
                    "0\n") != std::string::npos);
    CHECK(text.find("onceproxy_request_duration_seconds_bucket{route=\"payments\",le=\"0.0025\"} "
                    "1\n") != std::string::npos);
    CHECK(text.find("onceproxy_request_duration_seconds_bucket{route=\"payments\",le=\"1\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_request_duration_seconds_bucket{route=\"payments\",le=\"+Inf\"} "
                    "2\n") != std::string::npos);
    CHECK(text.find("onceproxy_request_duration_seconds_count{route=\"payments\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_store_errors_total{cause=\"not_replicated\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_store_errors_total{cause=\"timeout\"} 1\n") != std::string::npos);
    CHECK(text.find("onceproxy_store_errors_total{cause=\"unavailable\"} 0\n") !=
          std::string::npos);
}

TEST_CASE("metrics: store round trips by route and outcome, beside the request counts") {
    registry reg({"payments", "orders"});
    reg.route(0).counter(family::requests, outcome::stored).inc();
    reg.route(0).counter(family::store_round_trips, outcome::stored).add(2);
    reg.route(0).counter(family::requests, outcome::replayed).inc();
    reg.route(0).counter(family::store_round_trips, outcome::replayed).add(1);
    reg.route(0).counter(family::requests, outcome::replayed).inc();
    reg.route(0).counter(family::store_round_trips, outcome::replayed).add(1);
    const auto text = reg.render();
    CHECK(text.find("onceproxy_store_round_trips_total{route=\"payments\",outcome=\"stored\"} "
                    "2\n") != std::string::npos);
    CHECK(text.find("onceproxy_store_round_trips_total{route=\"payments\",outcome=\"replayed\"} "
                    "2\n") != std::string::npos);
    // Only outcomes that happened have a series; a route without requests has none.
    CHECK(text.find("onceproxy_store_round_trips_total{route=\"payments\",outcome=\"mismatch\"}") ==
          std::string::npos);
    CHECK(text.find("onceproxy_store_round_trips_total{route=\"orders\"") == std::string::npos);
}

TEST_CASE("metrics: a route added by a reload gets its series; existing counts are kept") {
    registry reg({"payments"});
    reg.route(0).counter(family::requests, outcome::stored).inc();
    auto& payments = reg.route_named("payments");
    CHECK(&payments == &reg.route(0)); // the same series, not a new one
    auto& orders = reg.route_named("orders");
    orders.counter(family::requests, outcome::replayed).inc();
    CHECK(&reg.route_named("orders") == &orders);
    const auto text = reg.render();
    CHECK(text.find("onceproxy_requests_total{route=\"payments\",outcome=\"stored\"} 1\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_requests_total{route=\"orders\",outcome=\"replayed\"} 1\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_request_duration_seconds_count{route=\"orders\"} 0\n") !=
          std::string::npos);
}

TEST_CASE("metrics: reloads by result, the config digest and its load time") {
    registry reg({"payments"});
    reg.counter(family::config_reloads, reload_result::success).inc();
    reg.counter(family::config_reloads, reload_result::error).inc();
    reg.counter(family::config_reloads, reload_result::error).inc();
    reg.set_config("0123456789abcdef", 1700000000);
    const auto text = reg.render();
    CHECK(text.find("onceproxy_config_reloads_total{result=\"success\"} 1\n") != std::string::npos);
    CHECK(text.find("onceproxy_config_reloads_total{result=\"error\"} 2\n") != std::string::npos);
    CHECK(text.find("onceproxy_config_reloads_total{result=\"restart_required\"} 0\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_config_info{sha256=\"0123456789abcdef\"} 1\n") != std::string::npos);
    CHECK(text.find("onceproxy_config_last_reload_success_timestamp_seconds 1700000000\n") !=
          std::string::npos);
}

TEST_CASE("metrics: master switches by cause, only for a store that follows a master") {
    registry reg({"payments"});
    CHECK(reg.render().find("onceproxy_store_master_switches_total") == std::string::npos);
    reg.store_follows_master = true;
    reg.counter(family::store_master_switches, switch_cause::switch_master).inc();
    reg.counter(family::store_master_switches, switch_cause::switch_master).inc();
    reg.counter(family::store_master_switches, switch_cause::connection_lost).inc();
    const auto text = reg.render();
    CHECK(text.find("# TYPE onceproxy_store_master_switches_total counter\n") != std::string::npos);
    CHECK(text.find("onceproxy_store_master_switches_total{cause=\"switch_master\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_store_master_switches_total{cause=\"readonly\"} 0\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_store_master_switches_total{cause=\"connection_lost\"} 1\n") !=
          std::string::npos);
}

TEST_CASE("metrics: late answers by outcome (issue 26)") {
    registry reg({"payments"});
    reg.counter(family::late_answers, onceproxy::core::late_answer::recorded).inc();
    reg.counter(family::late_answers, onceproxy::core::late_answer::recorded).inc();
    reg.counter(family::late_answers, onceproxy::core::late_answer::unanswered).inc();
    const auto text = reg.render();
    CHECK(text.find("onceproxy_late_answers_total{outcome=\"recorded\"} 2\n") != std::string::npos);
    CHECK(text.find("onceproxy_late_answers_total{outcome=\"released\"} 0\n") != std::string::npos);
    CHECK(text.find("onceproxy_late_answers_total{outcome=\"unrecorded\"} 0\n") !=
          std::string::npos);
    CHECK(text.find("onceproxy_late_answers_total{outcome=\"unanswered\"} 1\n") !=
          std::string::npos);
}

TEST_CASE("metrics: event-loop lag per worker, the last second's worst or an overdue tick") {
    registry reg({"payments"});
    CHECK(reg.render().find("onceproxy_event_loop_lag_seconds") == std::string::npos);
    reg.set_workers(2);
    const auto now = std::chrono::steady_clock::now();
    // Worker 0 ticks on time; its worst lateness over the last second was 12 ms.
    reg.set_event_loop_tick(0, now + 40ms, 12ms);
    CHECK(reg.event_loop_lag(0, now) == 12ms);
    // A tick without a finished window keeps the last window's figure.
    reg.set_event_loop_tick(0, now + 90ms, std::nullopt);
    CHECK(reg.event_loop_lag(0, now) == 12ms);
    // Worker 1 is blocked: its next tick was due 3 s ago and has not run.
    reg.set_event_loop_tick(1, now - 3s, 0ms);
    CHECK(reg.event_loop_lag(1, now) == 3s);
    // Out of range: nothing, no crash.
    reg.set_event_loop_tick(7, now, 1s);
    CHECK(reg.event_loop_lag(7, now) == 0ms);
    const auto text = reg.render();
    CHECK(text.find("# TYPE onceproxy_event_loop_lag_seconds gauge\n") != std::string::npos);
    CHECK(text.find("onceproxy_event_loop_lag_seconds{worker=\"0\"} 0.0") != std::string::npos);
    CHECK(text.find("onceproxy_event_loop_lag_seconds{worker=\"1\"} 3.") != std::string::npos);
}

TEST_CASE("metrics: client connections open per worker") {
    registry reg({"payments"});
    CHECK(reg.render().find("onceproxy_worker_connections") == std::string::npos);
    reg.set_workers(2);
    reg.worker_connections_add(0, 1);
    reg.worker_connections_add(0, 1);
    reg.worker_connections_add(1, 1);
    reg.worker_connections_add(0, -1);
    reg.worker_connections_add(5, 1); // out of range: nothing, no crash
    CHECK(reg.worker_connections(0) == 1);
    CHECK(reg.worker_connections(1) == 1);
    CHECK(reg.worker_connections(5) == 0);
    const auto text = reg.render();
    CHECK(text.find("# TYPE onceproxy_worker_connections gauge\n") != std::string::npos);
    CHECK(text.find("onceproxy_worker_connections{worker=\"0\"} 1\n") != std::string::npos);
    CHECK(text.find("onceproxy_worker_connections{worker=\"1\"} 1\n") != std::string::npos);
    CHECK(text.find("onceproxy_worker_connections{worker=\"2\"}") == std::string::npos);
}

namespace {
/// Label values by index, as egress::attempt_result and egress::breaker_state give them.
enum class third : std::uint8_t { first, second, third };
} // namespace

TEST_CASE("metrics: egress families appear with egress routes, by route and by upstream") {
    registry reg({"payments"});
    CHECK(reg.render().find("onceproxy_egress_") == std::string::npos);
    auto& route = reg.series_named(scope::egress_route, "charge");
    auto& up = reg.series_named(scope::upstream, "provider");
    CHECK(&reg.series_named(scope::egress_route, "charge") == &route); // one series per name
    route.counter(family::egress_attempts, third::third).add(3);
    route.counter(family::egress_retries).inc();
    up.gauge(family::egress_breaker_state, third::second).set(1);
    up.counter(family::egress_breaker_transitions, third::second).inc();
    const auto text = reg.render();
    CHECK(
        text.find(
            "\nonceproxy_egress_attempts_total{route=\"charge\",result=\"connect_failure\"} 3\n") !=
        std::string::npos);
    CHECK(text.find("\nonceproxy_egress_retries_total{route=\"charge\"} 1\n") != std::string::npos);
    CHECK(text.find("\nonceproxy_egress_breaker_state{upstream=\"provider\",state=\"open\"} 1\n") !=
          std::string::npos);
    CHECK(
        text.find("\nonceproxy_egress_breaker_state{upstream=\"provider\",state=\"closed\"} 0\n") !=
        std::string::npos);
    CHECK(text.find("\nonceproxy_egress_breaker_transitions_total{upstream=\"provider\",to="
                    "\"open\"} 1\n") != std::string::npos);
    // The egress route's series are not an inbound route's.
    CHECK(text.find("onceproxy_requests_total{route=\"charge\"") == std::string::npos);
    const auto named = reg.named(); // in order of appearance
    REQUIRE(named.size() == 2);
    CHECK(named[0] == &route);
    CHECK(named[1] == &up);
}
