#include "onceproxy/config/config.hpp"

#include "onceproxy/config/live_changes.hpp"
#include "onceproxy/config/load.hpp"
#include "support/config_errors.hpp"

#include <doctest/doctest.h>

using namespace onceproxy;
using namespace std::chrono_literals;
using test::errors_of;

namespace {

constexpr const char* upstream_only =
    "upstreams: { provider: { url: \"http://127.0.0.1:3000\", timeout: 2s } }\n";

std::string egress_with(const std::string& route_extra, const std::string& block_extra = "") {
    return std::string(upstream_only) + "egress:\n" + "  listen: 127.0.0.1:9000\n" + block_extra +
           "  routes:\n"
           "    - name: provider\n"
           "      match: { prefix: / }\n"
           "      upstream: provider\n" +
           route_extra;
}

} // namespace

TEST_CASE("egress: a config with egress routes only is valid, with the documented defaults") {
    const auto c = config::load_string(egress_with(""), "test.yaml");
    CHECK(c->routes.empty());
    REQUIRE(c->egress.has_value());
    CHECK(c->egress->listen == config::endpoint{"127.0.0.1", 9000});
    REQUIRE(c->egress->routes.size() == 1);
    const auto& r = *c->egress->routes[0].retry;
    CHECK(r.attempts == 3);
    CHECK(r.deadline == 10s);
    CHECK(r.base_delay == 100ms);
    CHECK(r.max_delay == 2s);
    CHECK(r.max_retry_after == 30s);
    CHECK(r.on_connect_failure);
    CHECK(r.on_reset);
    CHECK_FALSE(r.on_timeout);
    CHECK(r.statuses.count() == 6);
    CHECK(r.generate_key);
    CHECK(r.key_header == "Idempotency-Key");
    CHECK(c->egress->budget.ratio == doctest::Approx(0.2));
    CHECK(c->egress->breaker.failures == 5);
    CHECK(c->egress->routes[0].idempotency.mode == config::idempotency_mode::off);

    const auto view = config::egress_view(*c);
    CHECK(view->listen == c->egress->listen);
    CHECK_FALSE(view->tls.has_value());
    REQUIRE(view->routes.size() == 1);
    CHECK(view->routes[0].retry.has_value());
}

TEST_CASE("egress: retry, budget and breaker settings are read") {
    const auto c = config::load_string(
        egress_with("      retry:\n"
                    "        attempts: 5\n"
                    "        deadline: 3s\n"
                    "        base_delay: 20ms\n"
                    "        max_delay: 300ms\n"
                    "        max_retry_after: 0s\n"
                    "        on: [timeout, 503]\n"
                    "        max_body_bytes: 4KiB\n"
                    "        generate_key: false\n"
                    "        key_header: X-Request-Key\n",
                    "  budget: { ratio: 10%, min_per_second: 0, window: 30s }\n"
                    "  breaker: { enabled: false, failures: 2, cool_down: 1s, probes: 3 }\n"),
        "test.yaml");
    const auto& r = *c->egress->routes[0].retry;
    CHECK(r.attempts == 5);
    CHECK(r.deadline == 3s);
    CHECK(r.base_delay == 20ms);
    CHECK(r.max_delay == 300ms);
    CHECK(r.max_retry_after == 0ms);
    CHECK(r.on_timeout);
    CHECK_FALSE(r.on_reset);
    CHECK_FALSE(r.on_connect_failure);
    CHECK(r.statuses.count() == 1);
    CHECK(r.statuses.test(503));
    CHECK(r.max_body_bytes == 4096);
    CHECK_FALSE(r.generate_key);
    CHECK(r.key_header == "X-Request-Key");
    CHECK(c->egress->budget.ratio == doctest::Approx(0.1));
    CHECK(c->egress->budget.min_per_second == 0);
    CHECK(c->egress->budget.window == 30s);
    CHECK_FALSE(c->egress->breaker.enabled);
    CHECK(c->egress->breaker.failures == 2);
    CHECK(c->egress->breaker.cool_down == 1s);
    CHECK(c->egress->breaker.probes == 3);
}

TEST_CASE("egress: bad settings are errors with their line") {
    SUBCASE("an unknown retry condition") {
        const auto e = errors_of(egress_with("      retry: { on: [503, sometimes] }\n"));
        REQUIRE(e.size() == 1);
        CHECK(e[0].line == 8);
        CHECK(e[0].message.find("invalid retry condition 'sometimes'") != std::string::npos);
    }
    SUBCASE("a status that is not an error") {
        const auto e = errors_of(egress_with("      retry: { on: [200] }\n"));
        REQUIRE(e.size() == 1);
        CHECK(e[0].line == 8);
    }
    SUBCASE("max_delay below base_delay") {
        const auto e =
            errors_of(egress_with("      retry: { base_delay: 1s, max_delay: 100ms }\n"));
        REQUIRE(e.size() == 1);
        CHECK(e[0].message.find("below base_delay") != std::string::npos);
    }
    SUBCASE("a ratio that is not one") {
        const auto e = errors_of(egress_with("", "  budget: { ratio: lots }\n"));
        REQUIRE(e.size() == 1);
        CHECK(e[0].line == 4);
    }
    SUBCASE("no size limit on an egress route") {
        const auto e = errors_of(egress_with("      limits: { max_request_bytes: none }\n"));
        REQUIRE(e.size() == 1);
        CHECK(e[0].message.find("egress route buffers") != std::string::npos);
    }
    SUBCASE("an unknown upstream, an unknown key") {
        const auto e = errors_of(std::string(upstream_only) +
                                 "egress:\n"
                                 "  listen: 127.0.0.1:9000\n"
                                 "  routes:\n"
                                 "    - { name: a, match: { prefix: / }, upstream: nowhere }\n"
                                 "    - { name: b, match: { prefix: / }, upstream: provider, "
                                 "retry: { attemps: 2 } }\n");
        REQUIRE(e.size() == 2);
        CHECK(e[0].message.find("unknown upstream 'nowhere'") != std::string::npos);
        CHECK(e[1].message.find("unknown key 'attemps'") != std::string::npos);
    }
    SUBCASE("egress.listen on the proxy's listen") {
        const auto e = errors_of("listen: 127.0.0.1:9000\n" + egress_with(""));
        REQUIRE(e.size() == 1);
        CHECK(e[0].message.find("egress.listen must differ from listen") != std::string::npos);
    }
    SUBCASE("neither routes nor egress") {
        const auto e = errors_of(upstream_only);
        REQUIRE(e.size() == 1);
        CHECK(e[0].message.find("routes") != std::string::npos);
    }
}

TEST_CASE("egress: on or off and its address need a restart; its routes do not") {
    const auto a = config::load_string(egress_with(""), "a.yaml");
    const auto b = config::load_string(egress_with("      retry: { attempts: 7 }\n"), "b.yaml");
    CHECK(config::changes_needing_restart(*a, *b).empty());
    auto moved = egress_with("");
    moved.replace(moved.find("9000"), 4, "9001");
    const auto c = config::load_string(moved, "c.yaml");
    CHECK(config::changes_needing_restart(*a, *c).size() == 1);
    const auto d = config::load_string(test::minimal_config, "d.yaml");
    CHECK(config::changes_needing_restart(*a, *d).size() == 1);
}
