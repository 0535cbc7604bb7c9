// Settings of the runtime (issue 9): trusted_proxies, admin.readiness.upstream and the Redis
// credentials, each with the file:line:column of its errors.

#include "onceproxy/config/cidr.hpp"

#include "onceproxy/config/load.hpp"

#include "support/config_errors.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace cfg = onceproxy::config;
using onceproxy::test::check_one_error;
using onceproxy::test::describe;
using onceproxy::test::errors_of;
using onceproxy::test::temp_file;
using namespace std::chrono_literals;

namespace {

constexpr const char* base = onceproxy::test::minimal_config;

std::string redis_yaml(const std::string& lines) {
    return std::string{base} + "store:\n  type: redis\n  redis:\n" + lines;
}

} // namespace

TEST_SUITE("runtime settings") {
    TEST_CASE("parse_cidr: addresses and blocks of both families") {
        const auto a = cfg::parse_cidr("10.0.0.0/8");
        REQUIRE(a);
        CHECK(a->prefix_length == 104);
        CHECK(cfg::parse_cidr("127.0.0.1")->prefix_length == 128);
        CHECK(cfg::parse_cidr("0.0.0.0/0")->prefix_length == 96);
        CHECK(cfg::parse_cidr("fd00::/8")->prefix_length == 8);
        CHECK(cfg::parse_cidr("::1")->prefix_length == 128);
        CHECK(cfg::parse_cidr("::/0")->prefix_length == 0);
        CHECK_FALSE(cfg::parse_cidr("10.0.0.1/8")); // host bits set
        CHECK_FALSE(cfg::parse_cidr("10.0.0.0/33"));
        CHECK_FALSE(cfg::parse_cidr("10.0.0.0/"));
        CHECK_FALSE(cfg::parse_cidr("10.0.0.0/8x"));
        CHECK_FALSE(cfg::parse_cidr("fd00::/129"));
        CHECK_FALSE(cfg::parse_cidr("example.com"));
        CHECK_FALSE(cfg::parse_cidr(""));
    }

    TEST_CASE("address_in") {
        const std::vector<cfg::cidr> blocks{*cfg::parse_cidr("10.0.0.0/8"),
                                            *cfg::parse_cidr("192.168.1.7"),
                                            *cfg::parse_cidr("fd00::/8")};
        CHECK(cfg::address_in("10.255.0.1", blocks));
        CHECK(cfg::address_in("192.168.1.7", blocks));
        CHECK_FALSE(cfg::address_in("192.168.1.8", blocks));
        CHECK_FALSE(cfg::address_in("11.0.0.1", blocks));
        CHECK(cfg::address_in("fd12::1", blocks));
        CHECK(cfg::address_in("fd12::1%eth0", blocks));
        CHECK_FALSE(cfg::address_in("fe80::1", blocks));
        CHECK(cfg::address_in("::ffff:10.1.1.1", blocks)); // a dual-stack listener's view
        CHECK_FALSE(cfg::address_in("unknown", blocks));
        CHECK_FALSE(cfg::address_in("10.0.0.1", {}));
    }

    TEST_CASE("log.level: info by default, each level read, a bad one blamed") {
        CHECK(cfg::load_string(base, "test.yaml")->log.level == cfg::log_level::info);
        CHECK(cfg::load_string(std::string{base} + "log: { level: debug }\n", "test.yaml")
                  ->log.level == cfg::log_level::debug);
        CHECK(cfg::load_string(std::string{base} + "log:\n  level: error\n", "test.yaml")
                  ->log.level == cfg::log_level::error);
        check_one_error(std::string{base} + "log:\n  level: loud\n", 4, "log.level");
        check_one_error(std::string{base} + "log: { lvl: warn }\n", 3, "log.lvl");
    }

    TEST_CASE("trusted_proxies: read, empty by default, each bad entry blamed") {
        CHECK(cfg::load_string(base, "test.yaml")->trusted_proxies.empty());
        const auto c = cfg::load_string(
            std::string{base} + "trusted_proxies: [10.0.0.0/8, 127.0.0.1, \"fd00::/8\"]\n",
            "test.yaml");
        REQUIRE(c->trusted_proxies.size() == 3);
        CHECK(c->trusted_proxies[1] == *cfg::parse_cidr("127.0.0.1/32"));
        const auto errors =
            errors_of(std::string{base} + "trusted_proxies:\n  - 10.0.0.0/8\n  - 10.0.0.1/8\n"
                                          "  - localhost\n");
        CAPTURE(describe(errors));
        REQUIRE(errors.size() == 2);
        CHECK(errors[0].line == 5);
        CHECK(errors[0].column == 5);
        CHECK(errors[0].path == "trusted_proxies[1]");
        CHECK(errors[0].message.find("'10.0.0.1/8'") != std::string::npos);
        CHECK(errors[1].line == 6);
        check_one_error(std::string{base} + "trusted_proxies: 10.0.0.0/8\n", 3, "trusted_proxies");
    }

    TEST_CASE("admin.readiness.upstream: shape, defaults, resolution") {
        const auto none = cfg::load_string(base, "test.yaml");
        CHECK_FALSE(none->admin.readiness.upstream.has_value());

        const auto tcp = cfg::load_string(
            std::string{base} + "admin: { readiness: { upstream: { name: app } } }\n", "t.yaml");
        REQUIRE(tcp->admin.readiness.upstream.has_value());
        const auto& t = *tcp->admin.readiness.upstream;
        CHECK(t.upstream == "app");
        CHECK(t.upstream_index == 0);
        CHECK(t.http_path.empty());
        CHECK(t.interval == 2s);
        CHECK(t.timeout == 1s);

        const auto http = cfg::load_string(
            "upstreams:\n"
            "  other: { url: \"http://127.0.0.1:4000\" }\n"
            "  app: { url: \"http://127.0.0.1:3000\" }\n"
            "routes: [ { name: all, match: { prefix: / }, upstream: app } ]\n"
            "admin:\n"
            "  readiness:\n"
            "    require_store: true\n"
            "    upstream: { name: app, http_path: /healthz, interval: 5s, timeout: 300ms }\n",
            "t.yaml");
        const auto& h = *http->admin.readiness.upstream;
        CHECK(h.upstream_index == 1);
        CHECK(h.http_path == "/healthz");
        CHECK(h.interval == 5s);
        CHECK(h.timeout == 300ms);
        CHECK(http->admin.readiness.require_store);
    }

    TEST_CASE("admin.readiness.upstream errors carry line and column") {
        check_one_error(std::string{base} + "admin:\n  readiness:\n    upstream: { name: api }\n",
                        5, "unknown upstream 'api'");
        check_one_error(std::string{base} +
                            "admin:\n  readiness:\n    upstream: { interval: 1s }\n",
                        5, "missing");
        check_one_error(
            std::string{base} +
                "admin:\n  readiness:\n    upstream: { name: app, http_path: healthz }\n",
            5, "invalid http_path 'healthz'");
        check_one_error(std::string{base} + "admin:\n  readiness:\n    upstream:\n"
                                            "      name: app\n      interval: 1s\n"
                                            "      timeout: 2s\n",
                        8, "must not exceed its interval");
        check_one_error(std::string{base} +
                            "admin:\n  readiness:\n    upstream: { name: app, tcp: true }\n",
                        5, "unknown key 'tcp'");
    }

    TEST_CASE("store.redis credentials as fields: no percent-encoding needed") {
        const auto c = cfg::load_string(redis_yaml("    url: \"redis://127.0.0.1:6379/2\"\n"
                                                   "    username: onceproxy\n"
                                                   "    password: \"p@ss:w/rd%40#\"\n"),
                                        "t.yaml");
        CHECK(c->store.redis.username == "onceproxy");
        CHECK(c->store.redis.password == "p@ss:w/rd%40#");
        CHECK(c->store.redis.password_file.empty());

        ::setenv("ONCEPROXY_TEST_REDIS_PASSWORD", "from:env@x", 1);
        const auto e = cfg::load_string(
            redis_yaml("    password: ${ONCEPROXY_TEST_REDIS_PASSWORD}\n"), "t.yaml");
        ::unsetenv("ONCEPROXY_TEST_REDIS_PASSWORD");
        CHECK(e->store.redis.password == "from:env@x");
    }

    TEST_CASE("store.redis.password_file is read at load; one trailing line break dropped") {
        const temp_file secret("s3cr@t:pa ss\n");
        const auto c =
            cfg::load_string(redis_yaml("    password_file: " + secret.path + "\n"), "t.yaml");
        CHECK(c->store.redis.password == "s3cr@t:pa ss");
        CHECK(c->store.redis.password_file == secret.path);

        const temp_file crlf("abc\r\n");
        CHECK(cfg::load_string(redis_yaml("    password_file: " + crlf.path + "\n"), "t.yaml")
                  ->store.redis.password == "abc");
        const temp_file inner("a\nb");
        CHECK(cfg::load_string(redis_yaml("    password_file: " + inner.path + "\n"), "t.yaml")
                  ->store.redis.password == "a\nb");
    }

    TEST_CASE("store.redis credential errors carry line and column, never the secret") {
        check_one_error(redis_yaml("    password_file: /nonexistent/onceproxy/redis-password\n"), 6,
                        "cannot read password_file '/nonexistent/onceproxy/redis-password'");
        const temp_file empty("\n");
        check_one_error(redis_yaml("    password_file: " + empty.path + "\n"), 6, "is empty");
        const temp_file secret("x");
        check_one_error(
            redis_yaml("    password: hunter2\n    password_file: " + secret.path + "\n"), 7,
            "either password or password_file");
        check_one_error(redis_yaml("    username: app\n"), 6, "needs password or password_file");
        const auto errors = errors_of(redis_yaml("    url: \"redis://:hunter2@127.0.0.1:6379\"\n"
                                                 "    password: hunter3\n"));
        CAPTURE(describe(errors));
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].line == 6);
        CHECK(errors[0].message.find("keep one of them") != std::string::npos);
        CHECK(errors[0].to_string().find("hunter") == std::string::npos);
        check_one_error(redis_yaml("    password: \"\"\n"), 6, "the password is empty");
    }
}
