// The status page of the admin listener (issue 31), as an operator meets it: the real binary in
// front of the test upstream under light traffic, /admin/v1/status read over a socket, and the
// page at / loaded in a real headless Chromium (tests/integration/browser/page_probe.py drives it
// over the DevTools protocol). What the page shows must be what /metrics counts, with no console
// error, on a desktop window and on a phone-sized one.
//
// ONCEPROXY_SCREENSHOT=path.png (make screenshot) also writes a PNG of the page under traffic.

#include "support/http_client.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

using namespace onceproxy::test;
using namespace std::chrono_literals;
namespace json = boost::json;

namespace {

const std::string routes = guarded_route("pay", "/v1/pay") + R"(  - name: orders
    match: { prefix: /v1/orders }
    upstream: app
    idempotency: { mode: observe }
)";

constexpr const char* outcomes[] = {
    "stored",      "replayed",      "in_progress", "mismatch",        "missing_key",
    "invalid_key", "released",      "held",        "outcome_unknown", "not_replayable",
    "lease_lost",  "record_failed", "store_error", "passthrough",     "rejected"};

/// Two egress routes: `calls` to the test upstream, and `provider` to upstream `down`, where
/// nothing listens (every attempt a connect failure), with short waits between attempts.
const std::string egress = R"(egress:
  listen: 127.0.0.1:0
  routes:
    - name: calls
      match: { prefix: /app/ }
      upstream: app
    - name: provider
      match: { prefix: / }
      upstream: down
      retry: { attempts: 3, base_delay: 1ms, max_delay: 5ms }
)";

/// A proxy with a guarded route, an observed one and the catch-all, on the memory store, and
/// the egress routes above.
struct status_setup {
    upstream_process up{2};
    unsigned short down_port = free_port();
    proxy_process proxy;
    status_setup() : proxy(config()) {}
    /// The config, with `extra_routes` after the routes above.
    std::string config(const std::string& extra_routes = "") const {
        proxy_config c;
        c.upstream_port = up.port;
        c.routes = routes + extra_routes;
        c.top = egress;
        auto yaml = c.yaml();
        const std::string upstreams = "upstreams:\n";
        yaml.insert(yaml.find(upstreams) + upstreams.size(),
                    "  down: { url: http://127.0.0.1:" + std::to_string(down_port) + " }\n");
        return yaml;
    }
    /// The egress listener's port, from the port file's "egress N" line.
    unsigned short egress_port() const {
        const auto ports = read_file(proxy.dir.file("ports"));
        const auto at = ports.find("egress ");
        REQUIRE(at != std::string::npos);
        return static_cast<unsigned short>(std::stoi(ports.substr(at + 7)));
    }
    /// Calls through the egress listener: one answered, then the `down` upstream until its
    /// breaker is open and a call is refused at once.
    void egress_traffic() const {
        const auto port = egress_port();
        CHECK(fetch(port, "GET", "/app/health").status == 200);
        for (int i = 0; i < 5; ++i) {
            if (fetch(port, "POST", "/v1/charges", {{"Content-Type", "application/json"}}, "{}")
                    .status == 503) {
                return; // egress.circuit_open
            }
        }
        FAIL("the breaker of `down` never opened");
    }
};

constexpr const char* attempt_results[] = {"answered", "retryable_status", "connect_failure",
                                           "reset",    "timeout",          "other"};
constexpr const char* denial_reasons[] = {"attempts",    "deadline", "budget", "breaker",
                                          "retry_after", "unsafe",   "body"};

/// An egress series of /metrics: `family` (after onceproxy_egress_) on route or upstream
/// `owner`, with `label`="`value`" when given.
long long egress_metric(const std::string& metrics, const std::string& family,
                        const std::string& key, const std::string& owner,
                        const std::string& label = "", const std::string& value = "") {
    auto series = "onceproxy_egress_" + family + "{" + key + "=\"" + owner + "\"";
    if (!label.empty()) {
        series += "," + label + "=\"" + value + "\"";
    }
    return metric_value(metrics, series + "}");
}

/// One round of what a client fleet sends: a new payment, its retry, a retry with another
/// body, a payment without a key, an order sent twice (observe mode lets both through), and a
/// plain GET. `n` makes the keys of the round unique.
void traffic_round(unsigned short port, const std::string& tag, int n) {
    const auto key = unique_key("status", tag + "-" + std::to_string(n));
    post_keyed_payment(port, "/v1/pay", key);
    post_keyed_payment(port, "/v1/pay", key);
    fetch(port, "POST", "/v1/pay", idempotency_headers(key), R"({"amount":7})");
    fetch(port, "POST", "/v1/pay", {{"Content-Type", "application/json"}}, "{}");
    post_keyed_payment(port, "/v1/orders", key);
    post_keyed_payment(port, "/v1/orders", key);
    fetch(port, "GET", "/health");
}

double epoch_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// page_probe.py on the admin listener's page; its report (throws on a failed run).
json::object probe(unsigned short admin_port, std::vector<std::string> extra) {
    temp_dir dir;
    std::vector<std::string> argv{
        PYTHON3_BIN, ONCEPROXY_SOURCE_DIR "/tests/integration/browser/page_probe.py",
        "http://127.0.0.1:" + std::to_string(admin_port) + "/", "--chromium", CHROMIUM_BIN};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto err = dir.path() + "/probe.err";
    const auto r = run_command(argv, err);
    INFO("page_probe.py: " << read_file(err));
    REQUIRE(r.status == 0);
    return json::parse(r.output).as_object();
}

std::string text(const json::object& values, const std::string& key) {
    const auto* v = values.if_contains(key);
    return v != nullptr ? std::string(v->as_string()) : std::string("(not shown)");
}

/// A number as the page formats it ("1,234").
std::string shown(long long n) {
    std::string digits = std::to_string(n);
    for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) {
        digits.insert(static_cast<std::size_t>(i), ",");
    }
    return digits;
}

long long sum_of(const std::string& metrics, const std::string& prefix, const char* label,
                 std::initializer_list<const char*> values) {
    long long n = 0;
    for (const auto* v : values) {
        n += std::max(0LL, metric_value(metrics, prefix + label + "=\"" + v + "\"}"));
    }
    return n;
}

std::string config_sha(const std::string& metrics) {
    const auto at = metrics.find("onceproxy_config_info{sha256=\"");
    REQUIRE(at != std::string::npos);
    const auto start = metrics.find('"', at) + 1;
    return metrics.substr(start, metrics.find('"', start) - start);
}

/// Every figure of the page that /metrics also has, compared.
void check_matches_metrics(const json::object& values, const std::string& metrics) {
    for (const std::string route : {"pay", "orders", "everything-else"}) {
        long long total = 0;
        for (const auto* o : outcomes) {
            const auto n =
                std::max(0LL, metric_value(metrics, "onceproxy_requests_total{route=\"" + route +
                                                        "\",outcome=\"" + o + "\"}"));
            total += n;
            const auto key = "route:" + route + ":" + o;
            if (n > 0 || values.contains(key)) {
                CHECK_MESSAGE(text(values, key) == shown(n), key);
            }
        }
        CHECK(total > 0);
        CHECK(text(values, "route:" + route + ":total") == shown(total));
        CHECK(text(values, "route:" + route + ":p50") != "–");
        CHECK(text(values, "route:" + route + ":p99").ends_with(" ms"));
    }
    const auto prevented = sum_of(metrics, "onceproxy_observed_total{route=\"orders\",", "would",
                                  {"replay", "conflict"});
    CHECK(prevented > 0);
    CHECK(text(values, "route:orders:prevented_start") == shown(prevented));
    CHECK(text(values, "route:orders:prevented_hour") == shown(prevented));
    CHECK_FALSE(values.contains("route:pay:prevented_start")); // enforcing already
    long long trips = 0;
    for (const auto* o : outcomes) {
        for (const std::string route : {"pay", "orders", "everything-else", "(none)"}) {
            trips +=
                std::max(0LL, metric_value(metrics, "onceproxy_store_round_trips_total{route=\"" +
                                                        route + "\",outcome=\"" + o + "\"}"));
        }
    }
    CHECK(text(values, "store:round_trips") == shown(trips));
    CHECK(text(values, "store:errors") == "0");
    CHECK(text(values, "conn:http1") ==
          shown(metric_value(metrics, "onceproxy_client_connections_total{protocol=\"http1\"}")));
    CHECK(text(values, "config:sha256") == config_sha(metrics));
    for (const std::string route : {"calls", "provider"}) {
        const auto key = "egress:" + route + ":";
        long long sends = 0;
        for (const auto* r : attempt_results) {
            const auto n = egress_metric(metrics, "attempts_total", "route", route, "result", r);
            sends += n;
            CHECK_MESSAGE(text(values, key + "attempts:" + r) == shown(n), key << r);
        }
        CHECK(text(values, key + "sends") == shown(sends));
        long long denied = 0;
        for (const auto* r : denial_reasons) {
            const auto n =
                egress_metric(metrics, "retries_denied_total", "route", route, "reason", r);
            denied += n;
            CHECK_MESSAGE(text(values, key + "denied:" + r) == shown(n), key << r);
        }
        CHECK(text(values, key + "denied") == shown(denied));
        CHECK(text(values, key + "retries") ==
              shown(egress_metric(metrics, "retries_total", "route", route)));
        CHECK(text(values, key + "circuit_refusals") ==
              shown(egress_metric(metrics, "circuit_refusals_total", "route", route)));
    }
    CHECK(egress_metric(metrics, "breaker_state", "upstream", "down", "state", "open") == 1);
    CHECK(text(values, "egress:upstream:down:breaker") == "open");
    CHECK(text(values, "egress:upstream:app:breaker") == "closed");
}

} // namespace

TEST_SUITE("status page") {
    TEST_CASE("/admin/v1/status: the /metrics counts per route, observe mode's duplicates, the "
              "store and the config; a reload shows; no keys or bodies") {
        status_setup s;
        traffic_round(s.proxy.port, "json", 0);
        s.egress_traffic();
        const auto doc = json::parse(s.proxy.admin("/admin/v1/status").body).as_object();
        const auto metrics = s.proxy.admin("/metrics").body;
        const auto& rs = doc.at("routes").as_array();
        REQUIRE(rs.size() == 4); // pay, orders, the catch-all, unrouted
        CHECK(rs[0].at("name") == "pay");
        CHECK(rs[0].at("mode") == "required");
        CHECK(rs[1].at("mode") == "observe");
        CHECK(rs[3].at("name") == "(none)");
        for (const auto& r : rs) {
            const auto& o = r.as_object();
            const std::string name(o.at("name").as_string());
            for (const auto* out : outcomes) {
                CHECK_MESSAGE(
                    o.at("requests").at(out).to_number<long long>() ==
                        std::max(0LL,
                                 metric_value(metrics, "onceproxy_requests_total{route=\"" + name +
                                                           "\",outcome=\"" + out + "\"}")),
                    name << " " << out);
            }
        }
        CHECK(rs[0].at("requests").at("stored") == 1);
        CHECK(rs[0].at("requests").at("replayed") == 1);
        CHECK(rs[0].at("requests").at("mismatch") == 1);
        CHECK(rs[0].at("requests").at("missing_key") == 1);
        CHECK(rs[1].at("duplicates_prevented").at("since_start") == 1);
        CHECK(rs[1].at("duplicates_prevented").at("last_hour") == 1);
        CHECK(rs[0].at("latency").at("count") == 4);
        CHECK(rs[0].at("latency").at("p99_ms").is_number());
        const auto& store = doc.at("store").as_object();
        CHECK(store.at("type") == "memory");
        CHECK(store.at("answering") == true);
        CHECK(store.at("errors").at("unavailable") == 0);
        CHECK(std::string(doc.at("config").at("sha256").as_string()) == config_sha(metrics));
        CHECK(doc.at("connections").at("limit").to_number<long long>() ==
              metric_value(metrics, "onceproxy_connection_limit"));
        CHECK(doc.at("tls").at("certificate_expires_at").is_null());

        // Egress: per egress route, in the config's order, the counts of /metrics; per upstream
        // they call, the breaker's state.
        const auto& eg = doc.at("egress").as_object();
        const auto& ers = eg.at("routes").as_array();
        REQUIRE(ers.size() == 2);
        CHECK(ers[0].at("name") == "calls");
        CHECK(ers[0].at("upstream") == "app");
        CHECK(ers[1].at("name") == "provider");
        CHECK(ers[1].at("upstream") == "down");
        for (const auto& r : ers) {
            const auto& o = r.as_object();
            const std::string name(o.at("name").as_string());
            for (const auto* res : attempt_results) {
                CHECK_MESSAGE(
                    o.at("attempts").at(res).to_number<long long>() ==
                        egress_metric(metrics, "attempts_total", "route", name, "result", res),
                    name << " " << res);
            }
            for (const auto* why : denial_reasons) {
                CHECK_MESSAGE(o.at("retries_denied").at(why).to_number<long long>() ==
                                  egress_metric(metrics, "retries_denied_total", "route", name,
                                                "reason", why),
                              name << " " << why);
            }
            CHECK(o.at("retries").to_number<long long>() ==
                  egress_metric(metrics, "retries_total", "route", name));
            CHECK(o.at("circuit_refusals").to_number<long long>() ==
                  egress_metric(metrics, "circuit_refusals_total", "route", name));
        }
        CHECK(ers[0].at("attempts").at("answered") == 1);
        CHECK(ers[0].at("retries") == 0);
        CHECK(ers[1].at("attempts").at("answered") == 0);
        CHECK(ers[1].at("attempts").at("connect_failure").to_number<long long>() >= 5);
        CHECK(ers[1].at("retries").to_number<long long>() > 0);
        CHECK(ers[1].at("retries_denied").at("attempts") == 1);
        CHECK(ers[1].at("circuit_refusals") == 1);
        const auto& ups = eg.at("upstreams").as_array();
        REQUIRE(ups.size() == 2);
        for (const auto& u : ups) {
            const std::string name(u.at("name").as_string());
            const std::string state(u.at("breaker").as_string());
            CHECK(egress_metric(metrics, "breaker_state", "upstream", name, "state", state) == 1);
            for (const auto* to : {"closed", "open", "half_open"}) {
                CHECK(u.at("breaker_transitions").at(to).to_number<long long>() ==
                      egress_metric(metrics, "breaker_transitions_total", "upstream", name, "to",
                                    to));
            }
        }
        CHECK(ups[0].at("name") == "app");
        CHECK(ups[0].at("breaker") == "closed");
        CHECK(ups[1].at("name") == "down");
        CHECK(ups[1].at("breaker") == "open");
        CHECK(ups[1].at("breaker_transitions").at("open") == 1);
        // Read-only and nothing secret: no key, no body, GET only in spirit (POST is not an
        // action either).
        const auto body = s.proxy.admin("/admin/v1/status").body;
        CHECK(body.find("status-json-0") == std::string::npos);
        CHECK(body.find("amount") == std::string::npos);

        // The page itself: one HTML document, locked down.
        const auto page = s.proxy.admin("/");
        CHECK(page.status == 200);
        CHECK(page.header("Content-Type") == "text/html; charset=utf-8");
        CHECK(page.header("Content-Security-Policy").find("default-src 'none'") !=
              std::string::npos);
        CHECK(page.body.find("/admin/v1/status") != std::string::npos);
        CHECK(page.body.find("<script src") == std::string::npos); // no external assets
        CHECK(page.body.find("http://") == std::string::npos);
        CHECK(page.body.find("https://") == std::string::npos);

        // A reload with one more route: the page lists it, with the new config's digest.
        {
            std::ofstream out(s.proxy.config_file, std::ios::trunc);
            out << s.config(guarded_route("refunds", "/v1/refunds"));
        }
        s.proxy.proc.signal(SIGHUP);
        const bool reloaded = eventually(
            [&] {
                const auto d = json::parse(s.proxy.admin("/admin/v1/status").body).as_object();
                return d.at("config").at("reloads").at("success") == 1 &&
                       d.at("routes").as_array().size() == 5;
            },
            10s, 50ms);
        CHECK(reloaded);
        const auto after = json::parse(s.proxy.admin("/admin/v1/status").body).as_object();
        CHECK(after.at("routes").as_array()[2].at("name") == "refunds");
        CHECK(after.at("config").at("sha256") != doc.at("config").at("sha256"));
        CHECK(std::string(after.at("config").at("sha256").as_string()) ==
              config_sha(s.proxy.admin("/metrics").body));
    }

    TEST_CASE("in Chromium under light traffic: the page shows what /metrics counts, with no "
              "console error, on a desktop and on a phone") {
        status_setup s;
        // Traffic goes on until the desktop window has looked (however long Chromium takes to
        // start on a loaded machine), bounded by 60 s.
        const double traffic_ends = epoch_now() + 60;
        std::atomic<bool> looked{false};
        std::atomic<int> rounds{0};
        std::thread traffic([&] {
            for (int n = 0; !looked && epoch_now() < traffic_ends; ++n) {
                traffic_round(s.proxy.port, "page", n);
                rounds = n + 1;
                // Real time is the subject: light, steady traffic for the page's rates.
                std::this_thread::sleep_for(50ms);
            }
        });
        std::vector<std::string> desktop;
        if (const char* shot = std::getenv("ONCEPROXY_SCREENSHOT")) {
            desktop.insert(desktop.end(), {"--screenshot", shot});
        }
        const auto live = [&] {
            try {
                // The egress calls first, so that the desktop window (and the screenshot)
                // shows the egress part with counts in it. Then, while requests come in, the
                // window shows rates after a few refreshes.
                s.egress_traffic();
                desktop.insert(desktop.end(), {"--not-before", std::to_string(epoch_now() + 4.5)});
                return probe(s.proxy.admin_port, desktop);
            } catch (...) {
                looked = true;
                traffic.join();
                throw;
            }
        }();
        looked = true;
        traffic.join();
        CHECK(rounds > 10);
        CHECK(live.at("errors").as_array().empty());
        INFO("errors: " << json::serialize(live.at("errors")));
        CHECK(live.at("rates_seen") == true);
        CHECK(live.at("overflow") == false);

        // Traffic over: a phone-sized window shows the final counts, and they are /metrics'.
        const auto phone =
            probe(s.proxy.admin_port, {"--width", "390", "--height", "844", "--mobile",
                                       "--not-before", std::to_string(epoch_now() + 0.5)});
        const auto metrics = s.proxy.admin("/metrics").body;
        INFO("errors: " << json::serialize(phone.at("errors")));
        CHECK(phone.at("errors").as_array().empty());
        CHECK(phone.at("overflow") == false); // the tables scroll inside their box
        check_matches_metrics(phone.at("values").as_object(), metrics);
    }

    TEST_CASE("/admin/v1/status has no egress part without egress routes") {
        upstream_process up;
        proxy_process proxy(basic_config(up.port)); // no egress block (it needs a route)
        const auto doc = json::parse(proxy.admin("/admin/v1/status").body).as_object();
        CHECK(doc.contains("routes"));
        CHECK_FALSE(doc.contains("egress"));
        CHECK(proxy.admin("/metrics").body.find("onceproxy_egress_") == std::string::npos);
    }
}
