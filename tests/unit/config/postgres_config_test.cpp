// store.postgres: what is read, the defaults, and every error with file:line:column.

#include "onceproxy/config/load.hpp"

#include "support/config_errors.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace cfg = onceproxy::config;
using onceproxy::test::describe;
using onceproxy::test::errors_of;
using onceproxy::test::temp_file;
using namespace std::chrono_literals;

namespace {

/// store.type postgres; the block's own lines start at line 6.
const std::string base =
    std::string{onceproxy::test::minimal_config} + "store:\n  type: postgres\n  postgres:\n";

cfg::postgres_config load_postgres(const std::string& lines) {
    return cfg::load_string(base + lines, "pg.yaml")->store.postgres;
}

/// The one error of the store.postgres `lines`: at `path`, on `line`, saying `text`.
void check_one_error(const std::string& lines, const std::string& path, int line,
                     const std::string& text) {
    CAPTURE(lines);
    onceproxy::test::check_one_error(base + lines, line, text);
    const auto errors = errors_of(base + lines);
    if (errors.size() == 1) {
        CHECK(errors[0].path == path);
    }
}

} // namespace

TEST_SUITE("store.postgres") {
    TEST_CASE("every field is read") {
        const temp_file password("pg-s3cret\n");
        const temp_file ca(onceproxy::test::ca_certificate_pem);
        const auto c =
            cfg::load_string(base +
                                 "    url: \"postgresql://onceproxy@db1:5432,db2:5432/app"
                                 "?target_session_attrs=read-write\"\n"
                                 "    password_file: " +
                                 password.path +
                                 "\n"
                                 "    sslmode: verify-full\n"
                                 "    ssl_root_cert: " +
                                 ca.path +
                                 "\n"
                                 "    table: idem.onceproxy_records\n"
                                 "    key_prefix: \"billing:\"\n"
                                 "    pool: 4\n"
                                 "    connect_timeout: 3s\n"
                                 "    statement_timeout: 1500ms\n"
                                 "    migrate: check\n"
                                 "    sweep_interval: 30s\n"
                                 "    lookup_before_claim: true\n",
                             "pg.yaml");
        CHECK(c->store.type == cfg::store_type::postgres);
        const auto& p = c->store.postgres;
        CHECK(p.url ==
              "postgresql://onceproxy@db1:5432,db2:5432/app?target_session_attrs=read-write");
        CHECK(p.password == "pg-s3cret"); // one trailing line break dropped
        CHECK(p.password_file == password.path);
        CHECK(p.sslmode == "verify-full");
        CHECK(p.ssl_root_cert == ca.path);
        CHECK(p.table == "idem.onceproxy_records");
        CHECK(p.key_prefix == "billing:");
        CHECK(p.pool == 4);
        CHECK(p.connect_timeout == 3s);
        CHECK(p.statement_timeout == 1500ms);
        CHECK(p.migrate == cfg::postgres_migrate::check);
        CHECK(p.sweep_interval == 30s);
        CHECK(p.lookup_before_claim);
        // The memory and Redis settings stay at their defaults.
        CHECK(c->store.redis == cfg::redis_config{});
    }

    TEST_CASE("conf/postgres.yaml: the defaults but the url") {
        const auto c = cfg::load_file(std::string{ONCEPROXY_SOURCE_DIR} + "/conf/postgres.yaml");
        CHECK(c->store.type == cfg::store_type::postgres);
        auto p = c->store.postgres;
        CHECK(p.url ==
              "postgresql://onceproxy@db1:5432,db2:5432/app?target_session_attrs=read-write");
        p.url = cfg::postgres_config{}.url;
        CHECK(p == cfg::postgres_config{});
    }

    TEST_CASE("defaults: a type alone, and each field left out") {
        const auto c = cfg::load_string(std::string{onceproxy::test::minimal_config} +
                                            "store: { type: postgres }\n",
                                        "pg.yaml");
        CHECK(c->store.type == cfg::store_type::postgres);
        CHECK(c->store.postgres == cfg::postgres_config{});
        const cfg::postgres_config d;
        CHECK(d.url == "postgresql://onceproxy@127.0.0.1:5432/onceproxy");
        CHECK(d.password.empty());
        CHECK(d.password_file.empty());
        CHECK(d.sslmode.empty());
        CHECK(d.ssl_root_cert.empty());
        CHECK(d.table == "onceproxy_records");
        CHECK(d.key_prefix == "onceproxy:");
        CHECK(d.pool == 2);
        CHECK(d.connect_timeout == 2s);
        CHECK(d.statement_timeout == 2s);
        CHECK(d.migrate == cfg::postgres_migrate::automatic);
        CHECK(d.sweep_interval == 10s);
        CHECK_FALSE(d.lookup_before_claim);

        const auto p = load_postgres("    url: \"postgres://app@db/app\"\n    migrate: auto\n");
        CHECK(p.url == "postgres://app@db/app");
        CHECK(p.migrate == cfg::postgres_migrate::automatic);
        CHECK(p.table == d.table);
        CHECK(p.pool == d.pool);
    }

    TEST_CASE("the url's own credentials and parameters") {
        // A password in the url alone is allowed (as for Redis); it is never echoed.
        CHECK(load_postgres("    url: \"postgresql://app:pw@db/app\"\n").password.empty());
        CHECK(errors_of(base + "    url: \"postgresql://app@db/app?password=pw\"\n").empty());
        // A user in the url with the password as a field of its own is the usual form.
        CHECK(load_postgres("    url: \"postgresql://app@db/app\"\n    password: pw\n").password ==
              "pw");
        check_one_error("    url: \"postgresql://app:pw@db/app\"\n    password: other\n",
                        "store.postgres.url", 6, "carries a password");
        check_one_error("    url: \"postgresql://app@db/app?sslmode=require&password=pw\"\n"
                        "    password: other\n",
                        "store.postgres.url", 6, "carries a password");
        const auto errors = errors_of(base + "    url: \"mysql://app:hunter2@db/app\"\n");
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].message.find("hunter2") == std::string::npos);
        // The url's sslmode counts for ssl_root_cert, and must be one libpq knows.
        const temp_file ca(onceproxy::test::ca_certificate_pem);
        CHECK(load_postgres("    url: \"postgresql://db/app?sslmode=verify-ca\"\n"
                            "    ssl_root_cert: " +
                            ca.path + "\n")
                  .ssl_root_cert == ca.path);
        check_one_error("    url: \"postgresql://db/app?sslmode=verify\"\n", "store.postgres.url",
                        6, "invalid sslmode 'verify' in the url");
    }

    TEST_CASE("each error names its field, line and column") {
        const temp_file empty("\n");
        const temp_file not_a_cert("not a certificate\n");
        const temp_file ca(onceproxy::test::ca_certificate_pem);
        check_one_error("    url: \"redis://db:6379\"\n", "store.postgres.url", 6,
                        "invalid postgres url; expected postgresql://");
        check_one_error("    url: \"\"\n", "store.postgres.url", 6, "non-empty string");
        check_one_error("    password: \"\"\n", "store.postgres.password", 6,
                        "the password is empty");
        check_one_error("    password: pw\n    password_file: " + empty.path + "\n",
                        "store.postgres.password_file", 7, "either password or password_file");
        check_one_error("    password_file: /nonexistent/pg-password\n",
                        "store.postgres.password_file", 6,
                        "cannot read password_file '/nonexistent/pg-password'");
        check_one_error("    password_file: " + empty.path + "\n", "store.postgres.password_file",
                        6, "is empty");
        check_one_error("    sslmode: verify\n", "store.postgres.sslmode", 6,
                        "invalid sslmode 'verify'; expected one of disable, allow, prefer, "
                        "require, verify-ca, verify-full");
        check_one_error("    sslmode: require\n    ssl_root_cert: " + ca.path + "\n",
                        "store.postgres.ssl_root_cert", 7,
                        "ssl_root_cert needs sslmode verify-ca or verify-full");
        check_one_error("    ssl_root_cert: " + ca.path + "\n", "store.postgres.ssl_root_cert", 6,
                        "needs sslmode verify-ca or verify-full");
        check_one_error("    sslmode: verify-ca\n    ssl_root_cert: /nonexistent/ca.pem\n",
                        "store.postgres.ssl_root_cert", 7, "cannot read '/nonexistent/ca.pem'");
        check_one_error("    sslmode: verify-ca\n    ssl_root_cert: " + not_a_cert.path + "\n",
                        "store.postgres.ssl_root_cert", 7, "cannot load CA certificates");
        check_one_error("    table: a.b.c\n", "store.postgres.table", 6, "at most one dot");
        check_one_error("    table: .records\n", "store.postgres.table", 6,
                        "the schema name is empty");
        check_one_error("    table: \"idem.\"\n", "store.postgres.table", 6,
                        "the table name is empty");
        check_one_error("    table: " + std::string(64, 't') + "\n", "store.postgres.table", 6,
                        "the table name is 64 bytes; at most 63");
        check_one_error("    table: s" + std::string(64, 's') + ".t\n", "store.postgres.table", 6,
                        "the schema name is 65 bytes; at most 63");
        check_one_error("    table: \"a\\0b\"\n", "store.postgres.table", 6, "NUL");
        check_one_error("    key_prefix: \"\"\n", "store.postgres.key_prefix", 6, "is empty");
        check_one_error("    key_prefix: \"a b\"\n", "store.postgres.key_prefix", 6,
                        "whitespace or a control character");
        check_one_error("    key_prefix: " + std::string(65, 'k') + "\n",
                        "store.postgres.key_prefix", 6, "65 bytes; at most 64");
        check_one_error("    pool: 0\n", "store.postgres.pool", 6, "from 1 to 64");
        check_one_error("    pool: 65\n", "store.postgres.pool", 6, "from 1 to 64");
        check_one_error("    connect_timeout: 0s\n", "store.postgres.connect_timeout", 6,
                        "invalid duration");
        check_one_error("    statement_timeout: 0s\n", "store.postgres.statement_timeout", 6,
                        "invalid duration");
        check_one_error("    statement_timeout: 61s\n", "store.postgres.statement_timeout", 6,
                        "statement_timeout is 61s; at most 60s");
        check_one_error("    migrate: yes\n", "store.postgres.migrate", 6,
                        "expected one of auto, check");
        check_one_error("    sweep_interval: 500ms\n", "store.postgres.sweep_interval", 6,
                        "sweep_interval is 500ms; at least 1s");
        check_one_error("    lookup_before_claim: maybe\n", "store.postgres.lookup_before_claim", 6,
                        "invalid boolean");
        check_one_error("    username: app\n", "store.postgres.username", 6,
                        "unknown key 'username'");
        onceproxy::test::check_one_error(std::string{onceproxy::test::minimal_config} +
                                             "store: { type: postgresql }\n",
                                         3, "expected one of memory, redis, postgres");
    }

    TEST_CASE("an error's column points at the value") {
        const auto errors = errors_of(base + "    pool: 0\n    table: a.b.c\n");
        REQUIRE(errors.size() == 2);
        CHECK(errors[0].line == 6);
        CHECK(errors[0].column == 11);
        CHECK(errors[1].line == 7);
        CHECK(errors[1].column == 12);
    }

    TEST_CASE("the bounds themselves are accepted") {
        const auto p =
            load_postgres("    table: " + std::string(63, 's') + "." + std::string(63, 't') +
                          "\n"
                          "    pool: 64\n"
                          "    statement_timeout: 60s\n"
                          "    sweep_interval: 1s\n"
                          "    key_prefix: \"{tenant}:\"\n");
        CHECK(p.table.size() == 127);
        CHECK(p.pool == 64);
        CHECK(p.statement_timeout == 60s);
        CHECK(p.sweep_interval == 1s);
        // Braces are Redis Cluster's hash tags; a PostgreSQL key is plain text.
        CHECK(p.key_prefix == "{tenant}:");
        // A name is quoted by the store: case and other characters are kept.
        CHECK(load_postgres("    table: \"Billing.Idem Records\"\n").table ==
              "Billing.Idem Records");
        for (const char* mode : {"disable", "allow", "prefer", "require", "verify-ca"}) {
            CAPTURE(mode);
            CHECK(load_postgres(std::string{"    sslmode: "} + mode + "\n").sslmode == mode);
        }
    }

    TEST_CASE("a postgres block under another store type is read and checked, not used") {
        const std::string memory =
            std::string{onceproxy::test::minimal_config} + "store:\n  type: memory\n  postgres:\n";
        const auto c = cfg::load_string(memory + "    pool: 8\n", "pg.yaml");
        CHECK(c->store.type == cfg::store_type::memory);
        CHECK(c->store.postgres.pool == 8);
        const auto errors = errors_of(memory + "    pool: 0\n");
        CAPTURE(describe(errors));
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].path == "store.postgres.pool");
    }

    TEST_CASE("${VAR} substitution in the block") {
        ::setenv("ONCEPROXY_TEST_PG_URL", "postgresql://app@db:6432/app", 1);
        ::setenv("ONCEPROXY_TEST_PG_PASSWORD", "from-env", 1);
        const auto p = load_postgres("    url: \"${ONCEPROXY_TEST_PG_URL}\"\n"
                                     "    password: ${ONCEPROXY_TEST_PG_PASSWORD}\n");
        CHECK(p.url == "postgresql://app@db:6432/app");
        CHECK(p.password == "from-env");
        ::unsetenv("ONCEPROXY_TEST_PG_URL");
        ::unsetenv("ONCEPROXY_TEST_PG_PASSWORD");
        check_one_error("    password: ${ONCEPROXY_TEST_PG_UNSET}\n", "store.postgres.password", 6,
                        "ONCEPROXY_TEST_PG_UNSET is not set");
    }
}
