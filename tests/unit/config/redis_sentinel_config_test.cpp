// store.redis.sentinel and store.redis.durability: what is read, and errors with
// file:line:column.

#include "onceproxy/config/load.hpp"

#include "support/config_errors.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

namespace cfg = onceproxy::config;
using onceproxy::test::errors_of;
using namespace std::chrono_literals;

namespace {

const std::string base =
    std::string{onceproxy::test::minimal_config} + "store:\n  type: redis\n  redis:\n";

/// The one error of the store.redis `lines`, at `line`, saying `text`.
void check_one_error(const std::string& lines, int line, const std::string& text) {
    onceproxy::test::check_one_error(base + lines, line, text);
}

} // namespace

TEST_SUITE("store.redis sentinel and durability") {
    TEST_CASE("sentinel: master, nodes, the sentinels' own credentials and TLS") {
        const std::string path = "/tmp/onceproxy-unit-sentinel-" + std::to_string(::getpid());
        std::ofstream(path) << "s3ntinel\n";
        const auto c = cfg::load_string(base +
                                            "    sentinel:\n"
                                            "      master: payments\n"
                                            "      nodes: [\"10.0.0.5:26379\", \"[::1]:26380\"]\n"
                                            "      username: watcher\n"
                                            "      password_file: " +
                                            path +
                                            "\n      tls: true\n"
                                            "    password: data-secret\n",
                                        "t.yaml");
        ::unlink(path.c_str());
        REQUIRE(c->store.redis.sentinel.has_value());
        const auto& s = *c->store.redis.sentinel;
        CHECK(s.master == "payments");
        REQUIRE(s.nodes.size() == 2);
        CHECK(s.nodes[0].host == "10.0.0.5");
        CHECK(s.nodes[0].port == 26379);
        CHECK(s.nodes[1].host == "::1");
        CHECK(s.nodes[1].port == 26380);
        CHECK(s.username == "watcher");
        CHECK(s.password == "s3ntinel");
        CHECK(s.password_file == path);
        CHECK(s.tls);
        // The data nodes keep store.redis's own credentials.
        CHECK(c->store.redis.password == "data-secret");
        CHECK(c->store.redis.durability == cfg::redis_durability::async);
    }

    TEST_CASE("sentinel errors carry line and column") {
        check_one_error("    url: \"redis://127.0.0.1:6379\"\n"
                        "    sentinel: { master: m, nodes: [\"127.0.0.1:26379\"] }\n",
                        7, "either url or sentinel");
        check_one_error("    sentinel: { nodes: [\"127.0.0.1:26379\"] }\n", 6, "needs master");
        check_one_error("    sentinel: { master: m }\n", 6, "needs nodes");
        check_one_error("    sentinel: { master: m, nodes: [] }\n", 6, "nodes is empty");
        check_one_error("    sentinel:\n      master: m\n      nodes:\n"
                        "        - \"127.0.0.1:26379\"\n        - \"sentinel-b\"\n",
                        10, "invalid sentinel address 'sentinel-b'");
        check_one_error("    sentinel: { master: m, nodes: [\"a:1\"], port: 3 }\n", 6,
                        "unknown key 'port'");
        check_one_error("    sentinel: { master: m, nodes: [\"a:1\"], username: u }\n", 6,
                        "needs password or password_file");
    }

    TEST_CASE("durability: async by default; replicated with replicas and wait_timeout") {
        const auto d = cfg::load_string(base + "    url: \"redis://h:1\"\n", "t.yaml");
        CHECK(d->store.redis.durability == cfg::redis_durability::async);
        CHECK(d->store.redis.replicas == 1);
        CHECK(d->store.redis.wait_timeout == 50ms);
        const auto c = cfg::load_string(base + "    durability: replicated\n"
                                               "    replicas: 2\n"
                                               "    wait_timeout: 80ms\n",
                                        "t.yaml");
        CHECK(c->store.redis.durability == cfg::redis_durability::replicated);
        CHECK(c->store.redis.replicas == 2);
        CHECK(c->store.redis.wait_timeout == 80ms);

        check_one_error("    durability: sync\n", 6, "durability");
        check_one_error("    replicas: 0\n", 6, "replicas");
        check_one_error("    durability: replicated\n    wait_timeout: 250ms\n", 7,
                        "must be below command_timeout");
        check_one_error("    durability: replicated\n    command_timeout: 40ms\n", 7,
                        "must be below command_timeout");
        // Only replicated waits: a short command_timeout is fine with async.
        CHECK(errors_of(base + "    command_timeout: 40ms\n").empty());
    }
}
