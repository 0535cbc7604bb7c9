#include "onceproxy/config/load.hpp"

#include <doctest/doctest.h>

#include <string>

namespace cfg = onceproxy::config;

namespace {

std::string conf_path(const char* name) {
    return std::string{ONCEPROXY_SOURCE_DIR} + "/conf/" + name;
}

} // namespace

TEST_CASE("conf/minimal.yaml loads with the expected resolved values") {
    const auto c = cfg::load_file(conf_path("minimal.yaml"));
    CHECK(c->listen.host == "127.0.0.1");
    CHECK(c->listen.port == 8080);
    REQUIRE(c->upstreams.size() == 1);
    CHECK(c->upstreams[0].host == "127.0.0.1");
    CHECK(c->upstreams[0].port == 3000);
    CHECK_FALSE(c->upstreams[0].tls);
    CHECK(c->store.type == cfg::store_type::memory);
    REQUIRE(c->routes.size() == 2);
    CHECK(c->routes[0].idempotency.mode == cfg::idempotency_mode::required);
    CHECK(c->routes[1].idempotency.mode == cfg::idempotency_mode::off);
}
