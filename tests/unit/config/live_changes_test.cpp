#include "onceproxy/config/live_changes.hpp"

#include "onceproxy/config/load.hpp"

#include "support/config_errors.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace cfg = onceproxy::config;

namespace {

/// A config listening on `listen` with `workers` workers, plus `extra` top-level YAML.
std::string make(const std::string& listen, unsigned workers, const std::string& extra = "") {
    return "listen: " + listen + "\nworkers: " + std::to_string(workers) +
           "\nupstreams: { app: { url: \"http://127.0.0.1:3000\" } }\n"
           "routes: [ { name: all, match: { prefix: / }, upstream: app } ]\n" +
           extra;
}

const std::string base = make("127.0.0.1:8080", 2);

std::vector<std::string> restart(const std::string& before, const std::string& after) {
    return cfg::changes_needing_restart(*cfg::load_string(before, "a.yaml"),
                                        *cfg::load_string(after, "b.yaml"));
}

using list = std::vector<std::string>;

} // namespace

TEST_SUITE("live_changes") {

    TEST_CASE("routes, upstreams, limits, policies and logging change live") {
        CHECK(restart(base, base).empty());
        const std::string live =
            "listen: 127.0.0.1:8080\n"
            "workers: 2\n"
            "access_log: false\n"
            "log: { level: debug }\n"
            "trusted_proxies: [10.0.0.0/8]\n"
            "limits: { max_request_bytes: 1KiB, header_timeout: 1s, max_connections: 10 }\n"
            "upstreams:\n"
            "  app: { url: \"http://127.0.0.1:3001\", timeout: 5s }\n"
            "  other: { url: \"http://127.0.0.1:3002\" }\n"
            "defaults: { ttl: 1h }\n"
            "routes:\n"
            "  - { name: pay, match: { prefix: /pay }, upstream: other,\n"
            "      idempotency: { mode: required } }\n"
            "  - { name: all, match: { prefix: / }, upstream: app }\n";
        CHECK(restart(base, live).empty());
    }

    TEST_CASE("listen, workers and admin need a restart, each named") {
        CHECK(restart(base, make("127.0.0.1:9090", 2)) == list{"listen"});
        CHECK(restart(base, make("127.0.0.1:8080", 4)) == list{"workers"});
        CHECK(restart(base, make("0.0.0.0:9090", 3)) == list{"listen", "workers"});
        CHECK(restart(base, base + "admin: { listen: 127.0.0.1:9901 }\n") == list{"admin.listen"});
        CHECK(restart(base, base + "admin: { readiness: { require_store: true } }\n") ==
              list{"admin.readiness"});
        CHECK(restart(base, base + "admin: { max_connections: 4, idle_timeout: 5s }\n") ==
              list{"admin.max_connections, admin.header_timeout, admin.idle_timeout"});
    }

    TEST_CASE("the store: type and connection settings need a restart") {
        const std::string redis =
            base + "store: { type: redis, redis: { url: \"redis://127.0.0.1:6379/0\" } }\n";
        CHECK(restart(base, redis) == list{"store.type"});
        CHECK(restart(redis, std::string(base) +
                                 "store: { type: redis, redis: { url: \"redis://127.0.0.1:6380/0\","
                                 " key_prefix: \"x:\" } }\n") ==
              list{"store.redis.url", "store.redis.key_prefix"});
        CHECK(restart(base, base + "store: { memory: { max_bytes: 1MiB } }\n") ==
              list{"store.memory"});
        CHECK(restart(redis, std::string(base) +
                                 "store: { type: redis, redis: { url: \"redis://127.0.0.1:6379/0\","
                                 " password: s3cret } }\n") == list{"store.redis.password"});
    }

    TEST_CASE("store.postgres: every field needs a restart but a rotated password_file") {
        const auto pg = [](const std::string& fields) {
            return base + "store:\n  type: postgres\n  postgres:\n" + fields;
        };
        const std::string running = base + "store:\n  type: postgres\n";
        CHECK(restart(base, running) == list{"store.type"});
        CHECK(restart(running, running).empty());
        const std::vector<std::pair<std::string, std::string>> fields{
            {"    url: \"postgresql://app@db2/app\"\n", "store.postgres.url"},
            {"    password: s3cret\n", "store.postgres.password"},
            {"    sslmode: require\n", "store.postgres.sslmode"},
            {"    table: other\n", "store.postgres.table"},
            {"    key_prefix: \"x:\"\n", "store.postgres.key_prefix"},
            {"    pool: 3\n", "store.postgres.pool"},
            {"    connect_timeout: 5s\n", "store.postgres.connect_timeout"},
            {"    statement_timeout: 5s\n", "store.postgres.statement_timeout"},
            {"    migrate: check\n", "store.postgres.migrate"},
            {"    sweep_interval: 1m\n", "store.postgres.sweep_interval"},
            {"    lookup_before_claim: true\n", "store.postgres.lookup_before_claim"},
        };
        for (const auto& [field, path] : fields) {
            CAPTURE(field);
            const auto changes = restart(running, pg(field));
            REQUIRE_FALSE(changes.empty());
            CHECK(changes.front() == path);
        }
        // ssl_root_cert alone (same sslmode on both sides).
        const onceproxy::test::temp_file ca(onceproxy::test::ca_certificate_pem);
        const std::string verify = pg("    sslmode: verify-ca\n");
        CHECK(restart(verify, verify + "    ssl_root_cert: " + ca.path + "\n") ==
              list{"store.postgres.ssl_root_cert"});
        // A postgres block changed under another store type still needs a restart, as a
        // store.redis block does: the running store keeps the settings it started with.
        CHECK(restart(base, base + "store: { postgres: { pool: 3 } }\n") ==
              list{"store.postgres.pool"});
    }

    TEST_CASE("store.postgres.password_file: new content is live, a new file is not") {
        const std::string path = "/tmp/onceproxy-unit-pg-password-" + std::to_string(::getpid());
        const std::string other = path + "-other";
        const auto pg = [](const std::string& file) {
            return base + "store:\n  type: postgres\n  postgres:\n    password_file: " + file +
                   "\n";
        };
        std::ofstream(path) << "first\n";
        std::ofstream(other) << "first\n";
        const auto running = cfg::load_string(pg(path), "a.yaml");
        std::ofstream(path) << "rotated\n";
        const auto rotated = cfg::load_string(pg(path), "b.yaml");
        CHECK(rotated->store.postgres.password == "rotated");
        CHECK(cfg::changes_needing_restart(*running, *rotated).empty());
        CHECK(cfg::changes_needing_restart(*running, *cfg::load_string(pg(other), "c.yaml")) ==
              list{"store.postgres.password_file"});
        // From a password written in the file to a password_file: both are named.
        const auto inline_password = cfg::load_string(
            base + "store:\n  type: postgres\n  postgres:\n    password: first\n", "d.yaml");
        CHECK(cfg::changes_needing_restart(*inline_password, *rotated) ==
              list{"store.postgres.password_file", "store.postgres.password"});
        ::unlink(path.c_str());
        ::unlink(other.c_str());
    }

    TEST_CASE("the upstream a readiness check probes is bound at start") {
        const std::string checked =
            "listen: 127.0.0.1:8080\nworkers: 2\n"
            "admin: { readiness: { upstream: { name: app } } }\n"
            "upstreams: { app: { url: \"http://127.0.0.1:3000\" } }\n"
            "routes: [ { name: all, match: { prefix: / }, upstream: app } ]\n";
        std::string moved = checked;
        moved.replace(moved.find("3000"), 4, "3001");
        CHECK(restart(checked, moved) ==
              list{"admin.readiness.upstream (the settings of the upstream it checks)"});
    }
}
