// The PostgreSQL store seen from outside (SPEC §5, §8): real onceproxy processes sharing one
// real PostgreSQL 15 server, the real test upstream, loopback sockets. What is asserted is what a
// client, the upstream (its per-key execution counts) or the database's table shows.
//
// Every test starts its own server on a free port (a missing server is a failure, never a skip).

#include "support/http_client.hpp"
#include "support/postgres_server.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string unique_pg_key(const std::string& tag) {
    return onceproxy::test::unique_key("pg", tag);
}

/// The `store:` lines of a proxy on `url`, plus `extra` lines under `postgres:`.
std::vector<std::string> pg_store_lines(const std::string& url,
                                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> lines{"type: postgres", "postgres:", "  url: \"" + url + "\"",
                                   "  connect_timeout: 2s", "  statement_timeout: 2s"};
    for (const auto& e : extra) {
        lines.push_back("  " + e);
    }
    return lines;
}

proxy_config pg_proxy_config(unsigned short upstream_port, const std::string& url,
                             const std::string& routes,
                             const std::vector<std::string>& store_extra = {}) {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.store = pg_store_lines(url, store_extra);
    c.routes = routes;
    return c;
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

} // namespace

TEST_SUITE("postgres proxy") {

    TEST_CASE("two proxies, one PostgreSQL: 40 concurrent duplicates execute once, and each "
              "proxy replays the other's record") {
        postgres_server pg;
        upstream_process up(2);
        const auto cfg = pg_proxy_config(up.port, pg.url(), guarded_route("pay", "/v1/pay"));
        proxy_process a(cfg.yaml()), b(cfg.yaml());
        wait_store_answering(a);
        wait_store_answering(b);
        const std::vector<unsigned short> ports{a.port, b.port};
        const auto key = unique_pg_key("burst");

        std::vector<std::unique_ptr<http_client>> clients;
        for (std::size_t i = 0; i < 40; ++i) {
            clients.push_back(std::make_unique<http_client>(ports[i % 2]));
        }
        const auto bytes =
            make_request("POST", "/v1/pay", idempotency_headers(key, {{"X-Test-Delay-Ms", "300"}}),
                         keyed_payment_json);
        for (auto& c : clients) {
            c->send_raw(bytes);
        }
        std::size_t stored = 0;
        std::string body;
        for (auto& c : clients) {
            auto r = c->read_response(15s);
            REQUIRE(r);
            CAPTURE(r->status);
            CAPTURE(r->body);
            if (r->header("Idempotency-Status") == "stored") {
                ++stored;
                body = r->body;
            } else if (r->status == 409) {
                check_problem(*r, 409, "idempotency.in_progress");
            } else {
                CHECK(r->status == 200);
                CHECK(r->header("Idempotency-Status") == "replayed");
            }
        }
        CHECK(stored == 1);
        CHECK(up.count(key) == 1);
        for (const auto port : ports) {
            const auto r = post_keyed_payment(port, "/v1/pay", key);
            CHECK(r.status == 200);
            CHECK(r.header("Idempotency-Status") == "replayed");
            CHECK(r.body == body);
        }
        CHECK(up.count(key) == 1);
        // One row, completed, under the default table and prefix.
        CHECK(pg.psql("SELECT count(*), bool_and(completed), bool_and(key LIKE 'onceproxy:%') "
                      "FROM onceproxy_records") == "1|t|t\n");
        // The same body again with another payload is a mismatch, answered without executing.
        const auto other =
            fetch(a.port, "POST", "/v1/pay", idempotency_headers(key), R"({"amount":999})");
        CHECK(other.status == 422);
        CHECK(up.count(key) == 1);
    }

    TEST_CASE("PostgreSQL down and back: fail-closed 503, fail-open forwards, records survive") {
        postgres_server_options durable;
        durable.durable = true;
        postgres_server pg(durable);
        upstream_process up(2);
        const auto cfg =
            pg_proxy_config(up.port, pg.url(),
                            guarded_route("closed", "/closed", "on_store_error: fail_closed") +
                                guarded_route("open", "/open", "on_store_error: fail_open"));
        proxy_process proxy(cfg.yaml());
        wait_store_answering(proxy);
        const auto before = unique_pg_key("before");
        const auto first = post_keyed_payment(proxy.port, "/closed/pay", before);
        REQUIRE(first.header("Idempotency-Status") == "stored");

        pg.kill();
        const auto closed_key = unique_pg_key("down-closed");
        const auto r = post_keyed_payment(proxy.port, "/closed/pay", closed_key);
        check_problem(r, 503, "idempotency.store_unavailable");
        CHECK_FALSE(r.header("Retry-After").empty());
        CHECK(up.count(closed_key) == 0);
        const auto open_key = unique_pg_key("down-open");
        const auto o = post_keyed_payment(proxy.port, "/open/pay", open_key);
        CHECK(o.status == 200);
        CHECK(o.header("Idempotency-Status") != "stored");
        CHECK(up.count(open_key) == 1);
        CHECK(proxy.metric("onceproxy_store_errors_total{cause=\"unavailable\"}") >= 2);

        pg.start();
        // Serving again: consecutive stored answers (every worker's pool reconnected), and the
        // record stored before the crash replays.
        std::size_t run = 0;
        const bool back = eventually(
            [&] {
                while (run < 10) {
                    const auto k = unique_pg_key("back");
                    const auto a = post_keyed_payment(proxy.port, "/closed/pay", k);
                    if (a.header("Idempotency-Status") != "stored") {
                        check_problem(a, 503, "idempotency.store_unavailable");
                        CHECK(up.count(k) == 0);
                        run = 0;
                        return false;
                    }
                    ++run;
                }
                return true;
            },
            20s, 100ms);
        CHECK(back);
        const auto again = post_keyed_payment(proxy.port, "/closed/pay", before);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(again.body == first.body);
        CHECK(up.count(before) == 1);
    }

    TEST_CASE("start-up: a wrong password or a missing schema is refused with the reason; an "
              "unreachable server starts degraded and serves once it answers") {
        upstream_process up;
        const auto routes = guarded_route("pay", "/v1/pay");

        SUBCASE("wrong password") {
            postgres_server pg;
            const auto url =
                "postgresql://onceproxy:wrong-secret@127.0.0.1:" + std::to_string(pg.port()) +
                "/onceproxy";
            temp_dir dir;
            const auto config =
                dir.write("config.yaml", pg_proxy_config(up.port, url, routes).yaml());
            process p({ONCEPROXY_BIN, "--config", config, "--port-file", dir.file("ports")},
                      dir.file("proxy.log"));
            CHECK(p.wait(10s) == 1);
            CAPTURE(p.log());
            CHECK(contains(p.log(), "password authentication failed"));
            CHECK_FALSE(contains(p.log(), "wrong-secret"));
        }

        SUBCASE("migrate: check on a database without the schema") {
            postgres_server pg;
            temp_dir dir;
            const auto config =
                dir.write("config.yaml",
                          pg_proxy_config(up.port, pg.url(), routes, {"migrate: check"}).yaml());
            process p({ONCEPROXY_BIN, "--config", config, "--port-file", dir.file("ports")},
                      dir.file("proxy.log"));
            CHECK(p.wait(10s) == 1);
            CAPTURE(p.log());
            CHECK(contains(p.log(), "schema version 1 of onceproxy_records is missing"));
        }

        SUBCASE("unreachable, then started") {
            postgres_server pg;
            pg.stop();
            proxy_process degraded(pg_proxy_config(up.port, pg.url(), routes).yaml());
            CHECK(degraded.proc.running());
            CHECK(contains(degraded.log(), "starting degraded"));
            const auto key = unique_pg_key("degraded");
            check_problem(post_keyed_payment(degraded.port, "/v1/pay", key), 503,
                          "idempotency.store_unavailable");
            CHECK(up.count(key) == 0);
            pg.start();
            wait_store_answering(degraded);
            CHECK(post_keyed_payment(degraded.port, "/v1/pay", key).header("Idempotency-Status") ==
                  "stored");
            CHECK(post_keyed_payment(degraded.port, "/v1/pay", key).header("Idempotency-Status") ==
                  "replayed");
            CHECK(up.count(key) == 1);
        }
    }

    TEST_CASE("encryption at rest: the table holds no plaintext body, and replays decrypt it") {
        postgres_server pg;
        upstream_process up;
        temp_dir dir;
        const auto key_file = dir.write("k1", std::string(64, 'a')); // hex
        auto cfg = pg_proxy_config(up.port, pg.url(), guarded_route("pay", "/v1/pay"));
        cfg.store.push_back("encryption:");
        cfg.store.push_back("  keys:");
        cfg.store.push_back("    - { id: k1, file: " + key_file + " }");
        proxy_process proxy(cfg.yaml());
        wait_store_answering(proxy);
        const auto key = unique_pg_key("sealed");
        const auto first = post_keyed_payment(proxy.port, "/v1/pay", key);
        REQUIRE(first.header("Idempotency-Status") == "stored");
        REQUIRE(contains(first.body, "execution_id"));
        // The answer's body is in the answer, not in the table.
        CHECK(pg.psql("SELECT count(*) FROM onceproxy_records WHERE position('execution_id'::bytea "
                      "IN record) > 0") == "0\n");
        CHECK(pg.psql("SELECT count(*) FROM onceproxy_records WHERE completed") == "1\n");
        const auto again = post_keyed_payment(proxy.port, "/v1/pay", key);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(again.body == first.body);
    }
}
