// The Redis store seen from outside (SPEC §5, §8): real onceproxy processes sharing one real
// redis-server, the real test upstream, loopback sockets. What is asserted is what a client, the
// upstream (its per-key execution counts) or Redis itself (INFO commandstats) observes.
//
// Every test starts its own redis-server on a free port (a missing redis-server is a failure),
// uses keys unique to this run, and bounds every wait.

#include "support/http_client.hpp"
#include "support/http_date.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// A key no other test run (or earlier run against a reused Redis) can have used.
std::string unique_key(const std::string& tag) {
    return onceproxy::test::unique_key("rp", tag);
}

/// The `store:` lines of a proxy using `url` (a full redis:// or rediss:// URL with the db).
std::vector<std::string> redis_store_lines(const std::string& url,
                                           const std::vector<std::string>& extra = {}) {
    std::vector<std::string> lines{"type: redis", "redis:", "  url: \"" + url + "\"",
                                   "  command_timeout: 250ms", "  connect_timeout: 500ms"};
    for (const auto& e : extra) {
        lines.push_back("  " + e);
    }
    return lines;
}

/// A proxy config in front of `upstream_port` using the Redis at `url`, with `routes`.
proxy_config redis_proxy_config(unsigned short upstream_port, const std::string& url,
                                const std::string& routes,
                                const std::vector<std::string>& store_extra = {}) {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.store = redis_store_lines(url, store_extra);
    c.routes = routes;
    return c;
}

bool is_in_progress(const http_response& r) {
    return r.status == 409 && json_member(r.body, "code") == "idempotency.in_progress";
}

/// What a onceproxy that must refuse to start did.
struct startup_failure {
    int status = -1; ///< exit status; -1: still running after the bound (then killed)
    clock_type::duration elapsed{};
    std::string log;
};

/// Starts onceproxy with `yaml` and waits (bounded by `bound`) for it to exit.
startup_failure run_expecting_exit(const std::string& yaml, std::chrono::milliseconds bound = 8s) {
    temp_dir dir;
    const auto config = dir.write("config.yaml", yaml);
    const auto started = clock_type::now();
    process p({ONCEPROXY_BIN, "--config", config, "--port-file", dir.file("ports")},
              dir.file("proxy.log"));
    startup_failure f;
    f.status = p.wait(bound);
    f.elapsed = clock_type::now() - started;
    f.log = p.log();
    return f; // a process still running is SIGKILLed by its destructor
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

long long ms(clock_type::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

/// Runs a shell command; throws with its output when it fails.
void shell(const std::string& cmd) {
    const std::string full = cmd + " 2>&1";
    FILE* pipe = ::popen(full.c_str(), "r");
    if (pipe == nullptr) {
        throw std::runtime_error("cannot run " + cmd);
    }
    std::string out;
    char buf[512];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) {
        out.append(buf, n);
    }
    if (::pclose(pipe) != 0) {
        throw std::runtime_error("command failed: " + cmd + "\n" + out);
    }
}

/// The series `name{route="ROUTE",outcome="OUTCOME"}` of the proxy's /metrics, as a number
/// (-1: absent).
long long route_series(const proxy_process& p, const std::string& name, const std::string& route,
                       const std::string& outcome) {
    const auto r = p.admin("/metrics");
    REQUIRE(r.status == 200);
    const std::string needle =
        "\n" + name + "{route=\"" + route + "\",outcome=\"" + outcome + "\"} ";
    const auto pos = r.body.find(needle);
    if (pos == std::string::npos) {
        return -1;
    }
    return std::stoll(r.body.substr(pos + needle.size()));
}

/// A self-signed CA (`name`.crt, `name`.key) in `dir`.
std::string make_ca(const temp_dir& dir, const std::string& name) {
    shell("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2"
          " -subj '/CN=onceproxy test " +
          name + "' -keyout " + dir.file(name + ".key") + " -out " + dir.file(name + ".crt"));
    return dir.file(name + ".crt");
}

/// A server certificate for 127.0.0.1 signed by CA `ca` (server.crt, server.key in `dir`).
void make_server_cert(const temp_dir& dir, const std::string& ca) {
    const auto ext = dir.write("server.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    shell("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
          " -subj /CN=127.0.0.1 -keyout " +
          dir.file("server.key") + " -out " + dir.file("server.csr"));
    shell("openssl x509 -req -days 2 -in " + dir.file("server.csr") + " -CA " +
          dir.file(ca + ".crt") + " -CAkey " + dir.file(ca + ".key") +
          " -CAcreateserial -extfile " + ext + " -out " + dir.file("server.crt"));
}

} // namespace

TEST_SUITE("redis proxy") {

    TEST_CASE("two proxies, one Redis: 60 concurrent duplicates execute once") {
        redis_server redis;
        upstream_process up(2);
        const auto cfg =
            redis_proxy_config(up.port, redis.url() + "/0", guarded_route("pay", "/v1/pay"));
        proxy_process a(cfg.yaml()), b(cfg.yaml());
        wait_store_answering(a);
        wait_store_answering(b);
        const std::vector<unsigned short> ports{a.port, b.port};
        const auto key = unique_key("burst");

        // Every socket is connected before the first byte is sent, then all 60 requests leave
        // back to back; the upstream holds the one it executes for 300 ms so they all overlap.
        constexpr std::size_t per_proxy = 30;
        std::vector<std::unique_ptr<http_client>> clients;
        for (std::size_t i = 0; i < 2 * per_proxy; ++i) {
            clients.push_back(std::make_unique<http_client>(ports[i % 2]));
        }
        const auto bytes =
            make_request("POST", "/v1/pay", idempotency_headers(key, {{"X-Test-Delay-Ms", "300"}}),
                         keyed_payment_json);
        for (auto& c : clients) {
            c->send_raw(bytes);
        }
        std::vector<http_response> answers;
        for (auto& c : clients) {
            auto r = c->read_response(10s);
            REQUIRE(r);
            answers.push_back(std::move(*r));
        }

        CHECK(up.count(key) == 1);
        std::vector<const http_response*> stored;
        std::size_t conflicts[2] = {0, 0};
        for (std::size_t i = 0; i < answers.size(); ++i) {
            const auto& r = answers[i];
            CAPTURE(i);
            CAPTURE(r.status);
            CAPTURE(r.body);
            if (r.header("Idempotency-Status") == "stored") {
                CHECK(r.status == 200);
                stored.push_back(&r);
            } else if (r.status == 409) {
                check_problem(r, 409, "idempotency.in_progress");
                CHECK_FALSE(r.header("Retry-After").empty());
                ++conflicts[i % 2];
            } else {
                CHECK(r.status == 200);
                CHECK(r.header("Idempotency-Status") == "replayed");
            }
        }
        REQUIRE(stored.size() == 1);
        const std::string body = stored.front()->body;
        for (const auto& r : answers) {
            if (r.header("Idempotency-Status") == "replayed") {
                CHECK(r.body == body);
            }
        }
        // Both processes saw the other's lease: the proxy that did not execute answered 409s.
        CHECK(conflicts[0] > 0);
        CHECK(conflicts[1] > 0);

        for (const auto port : ports) {
            CAPTURE(port);
            const auto r = post_keyed_payment(port, "/v1/pay", key);
            CHECK(r.status == 200);
            CHECK(r.header("Idempotency-Status") == "replayed");
            CHECK(r.body == body);
        }
        CHECK(up.count(key) == 1);
        CHECK(a.proc.running());
        CHECK(b.proc.running());
    }

    TEST_CASE("SIGKILL of the proxy holding the lease: 409 until it lapses, then one retry runs") {
        redis_server redis;
        upstream_process up(2);
        auto cfg = redis_proxy_config(up.port, redis.url() + "/0",
                                      guarded_route("pay", "/v1/pay", "lease: 1s"));
        cfg.upstream_settings = {"timeout: 1s"}; // the config requires timeout <= lease
        proxy_process a(cfg.yaml()), b(cfg.yaml());
        wait_store_answering(a);
        wait_store_answering(b);
        const auto key = unique_key("kill");

        http_client first(a.port);
        const auto sent = clock_type::now();
        first.send_raw(make_request("POST", "/v1/pay",
                                    idempotency_headers(key, {{"X-Test-Delay-Ms", "3000"}}),
                                    keyed_payment_json));
        // The upstream counts a request when it arrives, i.e. after A claimed the key.
        REQUIRE(eventually([&] { return up.count(key) != 0; }, 3s, 10ms));
        REQUIRE(up.count(key) == 1);
        std::this_thread::sleep_until(sent + 200ms); // real time is the subject: A dies at 200 ms
        a.proc.signal(SIGKILL);
        REQUIRE(a.proc.wait(3s) == 128 + SIGKILL);

        // The lease is still A's: B refuses the retry.
        const auto early = post_keyed_payment(b.port, "/v1/pay", key);
        check_problem(early, 409, "idempotency.in_progress");
        CHECK_FALSE(early.header("Retry-After").empty());

        // Retry with bounded backoff until one executes; every answer before it is a 409.
        std::optional<http_response> executed;
        clock_type::time_point executed_at{};
        std::size_t refusals = 1;
        eventually(
            [&] {
                auto r = post_keyed_payment(b.port, "/v1/pay", key);
                if (is_in_progress(r)) {
                    ++refusals;
                    return false;
                }
                executed_at = clock_type::now();
                executed = std::move(r);
                return true;
            },
            std::chrono::duration_cast<std::chrono::milliseconds>(sent + 6s - clock_type::now()),
            200ms);
        REQUIRE(executed);
        CAPTURE(executed->body);
        CHECK(executed->status == 200);
        CHECK(executed->header("Idempotency-Status") == "stored");
        // The lease (1 s, taken after `sent`, never extended once A died at 200 ms) held until
        // at least `sent` + 1 s; a little slack for the two clocks.
        CHECK(ms(executed_at - sent) >= 950);
        CHECK(refusals >= 2);

        const auto again = post_keyed_payment(b.port, "/v1/pay", key);
        CHECK(again.status == 200);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(again.body == executed->body);
        // The killed attempt (which the upstream did receive) plus exactly one retry.
        CHECK(up.count(key) == 2);
    }

    TEST_CASE("Redis restarted under load: fail-closed 503, fail-open forwards, records survive") {
        redis_server_options opts;
        opts.appendonly = true;
        redis_server redis(opts);
        upstream_process up(2);
        const auto cfg =
            redis_proxy_config(up.port, redis.url() + "/0",
                               guarded_route("closed", "/closed", "on_store_error: fail_closed") +
                                   guarded_route("open", "/open", "on_store_error: fail_open"));
        proxy_process proxy(cfg.yaml());
        wait_store_answering(proxy);

        const auto before_key = unique_key("before");
        const auto before = post_keyed_payment(proxy.port, "/closed/pay", before_key);
        REQUIRE(before.status == 200);
        REQUIRE(before.header("Idempotency-Status") == "stored");

        // Background load on both routes, each request with its own key, across the restart.
        struct sample {
            std::string key;
            bool closed = true;
            std::optional<http_response> answer; ///< nullopt: no answer at all
        };
        std::vector<sample> samples;
        std::atomic<std::size_t> sampled{0}; // samples.size(), readable from this thread
        std::atomic<bool> stop_load{false};
        std::thread load([&] {
            for (std::size_t i = 0; !stop_load.load(); ++i) {
                sample s{unique_key("load"), i % 2 == 0, std::nullopt};
                try {
                    s.answer =
                        post_keyed_payment(proxy.port, s.closed ? "/closed/x" : "/open/x", s.key);
                } catch (const std::exception&) {
                    s.answer.reset();
                }
                samples.push_back(std::move(s));
                ++sampled;
                // Real time is the subject: a steady load of about 60 requests a second.
                std::this_thread::sleep_for(15ms);
            }
        });
        struct joiner {
            std::thread& t;
            std::atomic<bool>& stop;
            ~joiner() {
                stop = true;
                if (t.joinable()) {
                    t.join();
                }
            }
        } join_load{load, stop_load};

        wait_until([&] { return sampled >= 5; }, 10s, "load before the restart");
        redis.stop();
        {
            // The outage, seen from a fail-closed route: 503 with Retry-After, nothing executed.
            const auto closed_key = unique_key("down-closed");
            const auto r = post_keyed_payment(proxy.port, "/closed/pay", closed_key);
            check_problem(r, 503, "idempotency.store_unavailable");
            CHECK_FALSE(r.header("Retry-After").empty());
            CHECK(up.count(closed_key) == 0);
            // ... and from a fail-open route: forwarded unprotected.
            const auto open_key = unique_key("down-open");
            const auto o = post_keyed_payment(proxy.port, "/open/pay", open_key);
            CHECK(o.status == 200);
            CHECK(o.header("Idempotency-Status") != "stored");
            CHECK(up.count(open_key) == 1);
            // Both claims are counted as store errors, by their cause.
            CHECK(proxy.metric("onceproxy_store_errors_total{cause=\"unavailable\"}") >= 2);
            CHECK(proxy.metric("onceproxy_store_errors_total{cause=\"not_replicated\"}") == 0);
        }
        std::this_thread::sleep_for(500ms); // real time is the subject: the outage's length
        redis.start();

        // The proxy reconnects by itself; until then a guarded request is refused, never run.
        // Each worker has its own connection with its own backoff, so "serving again" means a
        // run of consecutive stored answers (each on a new connection, spread over the workers).
        const auto back_started = clock_type::now();
        constexpr std::size_t wanted_run = 10;
        std::size_t run = 0;
        std::size_t refused = 0;
        const bool recovered = eventually(
            [&] {
                while (run < wanted_run) {
                    const auto k = unique_key("back");
                    const auto r = post_keyed_payment(proxy.port, "/closed/pay", k);
                    if (r.status == 200 && r.header("Idempotency-Status") == "stored") {
                        ++run;
                        CHECK(up.count(k) == 1);
                        continue;
                    }
                    run = 0;
                    ++refused;
                    check_problem(r, 503, "idempotency.store_unavailable");
                    CHECK(up.count(k) == 0);
                    return false;
                }
                return true;
            },
            10s, 50ms);
        CAPTURE(refused);
        CAPTURE(ms(clock_type::now() - back_started));
        REQUIRE(recovered);

        // The record written before the restart came back from the AOF.
        const auto replay = post_keyed_payment(proxy.port, "/closed/pay", before_key);
        CHECK(replay.status == 200);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == before.body);
        CHECK(up.count(before_key) == 1);

        const std::size_t recovered_at = sampled;
        wait_until([&] { return sampled >= recovered_at + 5; }, 10s, "load after the recovery");
        stop_load = true;
        load.join();

        REQUIRE(samples.size() >= 10);
        std::size_t stored = 0;
        for (const auto& s : samples) {
            CAPTURE(s.key);
            CAPTURE(s.closed);
            REQUIRE(s.answer);
            const auto& r = *s.answer;
            CAPTURE(r.status);
            CAPTURE(r.body);
            const auto status = r.header("Idempotency-Status");
            const auto n = up.count(s.key);
            if (status == "stored") {
                ++stored;
                CHECK(r.status == 200);
                CHECK(n == 1);
            } else if (r.status == 503) {
                // Only a fail-closed route refuses, and a refused request never ran.
                CHECK(s.closed);
                check_problem(r, 503, "idempotency.store_unavailable");
                CHECK(n == 0);
            } else {
                // Executed but not recorded (completion failed), or forwarded unprotected on
                // the fail-open route: it ran exactly once, and never as a 2xx without a claim
                // on the fail-closed route.
                CHECK(r.status == 200);
                CHECK(n == 1);
                if (s.closed) {
                    CHECK(status == "unrecorded");
                }
            }
        }
        CHECK(stored > 0);
        // The load really ran through the outage: refusals on the fail-closed route and
        // unprotected forwards on the fail-open one.
        const auto refused_in_load =
            std::count_if(samples.begin(), samples.end(), [](const sample& s) {
                return s.closed && s.answer && s.answer->status == 503;
            });
        const auto forwarded_in_load =
            std::count_if(samples.begin(), samples.end(), [](const sample& s) {
                return !s.closed && s.answer && s.answer->status == 200 &&
                       s.answer->header("Idempotency-Status").empty();
            });
        CHECK(refused_in_load > 0);
        CHECK(forwarded_in_load > 0);
        CHECK(proxy.proc.running()); // no crash (the proxy runs under the sanitizers here too)

        // Every guarded key of the load retried once, now that Redis is back: a recorded answer
        // replays, a refused one may now run (once), an unrecorded one is replayed (completed
        // in the background) or still leased; none runs a second time. Fail-open forwards were
        // unprotected by definition and are not retried.
        for (const auto& s : samples) {
            const auto& first = *s.answer;
            const auto first_status = first.header("Idempotency-Status");
            if (!s.closed && first_status != "stored") {
                continue;
            }
            CAPTURE(s.key);
            CAPTURE(first.status);
            CAPTURE(first_status);
            const auto r =
                post_keyed_payment(proxy.port, s.closed ? "/closed/x" : "/open/x", s.key);
            CAPTURE(r.status);
            CAPTURE(r.body);
            const auto status = r.header("Idempotency-Status");
            if (first_status == "stored") {
                CHECK(status == "replayed");
                CHECK(r.body == first.body);
            } else if (first.status == 503) {
                // A claim whose reply was lost in the outage may have left a lease behind.
                CHECK((status == "stored" || is_in_progress(r)));
            } else {
                CHECK((status == "replayed" || is_in_progress(r)));
            }
            CHECK(up.count(s.key) <= 1);
        }

        // A flushed script cache (NOSCRIPT) does not break the store: EVAL reloads it.
        redis.cli({"SCRIPT", "FLUSH"});
        const auto evals_before = redis.command_calls("eval");
        const auto flushed_key = unique_key("flushed");
        const auto f1 = post_keyed_payment(proxy.port, "/closed/pay", flushed_key);
        CHECK(f1.status == 200);
        CHECK(f1.header("Idempotency-Status") == "stored");
        const auto f2 = post_keyed_payment(proxy.port, "/closed/pay", flushed_key);
        CHECK(f2.status == 200);
        CHECK(f2.header("Idempotency-Status") == "replayed");
        CHECK(f2.body == f1.body);
        CHECK(up.count(flushed_key) == 1);
        CHECK(redis.command_calls("eval") > evals_before);
    }

    TEST_CASE("start-up refuses a Redis it cannot use, quickly and with the reason") {
        upstream_process up;
        const auto routes = guarded_route("pay", "/v1/pay");

        SUBCASE("wrong password") {
            redis_server_options opts;
            opts.requirepass = "right-secret";
            redis_server redis(opts);
            const auto port = std::to_string(redis.port());
            const auto f = run_expecting_exit(
                redis_proxy_config(up.port, "redis://:wrong-secret@127.0.0.1:" + port + "/0",
                                   routes)
                    .yaml());
            CAPTURE(f.log);
            CHECK(f.status == 1);
            CHECK(ms(f.elapsed) < 5000);
            CHECK(contains(f.log, "AUTH"));
            CHECK(contains(f.log, "127.0.0.1:" + port));
            CHECK_FALSE(contains(f.log, "wrong-secret")); // the password is not echoed

            // The same Redis with the right password is accepted and serves.
            proxy_process ok(redis_proxy_config(
                                 up.port, "redis://:right-secret@127.0.0.1:" + port + "/0", routes)
                                 .yaml());
            wait_store_answering(ok);
            const auto key = unique_key("auth");
            CHECK(post_keyed_payment(ok.port, "/v1/pay", key).header("Idempotency-Status") ==
                  "stored");
            CHECK(post_keyed_payment(ok.port, "/v1/pay", key).header("Idempotency-Status") ==
                  "replayed");
        }

        SUBCASE("Redis unreachable (closed port): not refused, started degraded (issue 9; "
                "runtime_test covers the recovery)") {
            const auto port = std::to_string(free_port());
            proxy_process degraded(
                redis_proxy_config(up.port, "redis://127.0.0.1:" + port + "/0", routes).yaml());
            CHECK(degraded.proc.running());
            CHECK(contains(degraded.log(), "starting degraded"));
            CHECK(contains(degraded.log(), "127.0.0.1:" + port));
        }

        SUBCASE("maxmemory-policy allkeys-lru: refused by default, accepted with warn") {
            redis_server_options opts;
            opts.extra_args = {"--maxmemory-policy", "allkeys-lru"};
            redis_server redis(opts);
            const auto url = redis.url() + "/0";
            const auto f = run_expecting_exit(redis_proxy_config(up.port, url, routes).yaml());
            CAPTURE(f.log);
            CHECK(f.status == 1);
            CHECK(ms(f.elapsed) < 5000);
            CHECK(contains(f.log, "allkeys-lru"));
            CHECK(contains(f.log, "maxmemory"));

            proxy_process warned(
                redis_proxy_config(up.port, url, routes, {"maxmemory_policy: warn"}).yaml());
            wait_store_answering(warned);
            CHECK(contains(warned.log(), "allkeys-lru"));
            const auto key = unique_key("lru");
            const auto r1 = post_keyed_payment(warned.port, "/v1/pay", key);
            CHECK(r1.status == 200);
            CHECK(r1.header("Idempotency-Status") == "stored");
            const auto r2 = post_keyed_payment(warned.port, "/v1/pay", key);
            CHECK(r2.header("Idempotency-Status") == "replayed");
            CHECK(r2.body == r1.body);
            CHECK(up.count(key) == 1);
        }
    }

    TEST_CASE("rediss://: stores and replays over TLS; a wrong CA fails at start-up") {
        temp_dir pki;
        make_ca(pki, "ca");
        const auto other_ca = make_ca(pki, "other-ca");
        make_server_cert(pki, "ca");
        redis_server_options opts;
        opts.tls = redis_server_options::tls_files{pki.file("server.crt"), pki.file("server.key"),
                                                   pki.file("ca.crt")};
        redis_server redis(opts);
        upstream_process up;
        const auto url = redis.url() + "/0";
        REQUIRE(url.rfind("rediss://", 0) == 0);
        const auto routes = guarded_route("pay", "/v1/pay");

        {
            proxy_process proxy(redis_proxy_config(up.port, url, routes,
                                                   {"tls_ca_file: \"" + pki.file("ca.crt") + "\""})
                                    .yaml());
            wait_store_answering(proxy);
            const auto key = unique_key("tls");
            const auto r1 = post_keyed_payment(proxy.port, "/v1/pay", key);
            CHECK(r1.status == 200);
            CHECK(r1.header("Idempotency-Status") == "stored");
            const auto r2 = post_keyed_payment(proxy.port, "/v1/pay", key);
            CHECK(r2.status == 200);
            CHECK(r2.header("Idempotency-Status") == "replayed");
            CHECK(r2.body == r1.body);
            CHECK(up.count(key) == 1);
            // The record really is in this (TLS-only) Redis.
            CHECK(redis.command_calls("set") >= 3); // claim, complete (in its script), claim
            CHECK(redis.command_calls("evalsha") >= 1);
        }

        const auto f = run_expecting_exit(
            redis_proxy_config(up.port, url, routes, {"tls_ca_file: \"" + other_ca + "\""}).yaml());
        CAPTURE(f.log);
        CHECK(f.status == 1);
        CHECK(ms(f.elapsed) < 5000);
        CHECK(contains(f.log, "TLS"));
        CHECK(contains(f.log, "certificate"));
        CHECK(contains(f.log, "127.0.0.1:" + std::to_string(redis.port())));
    }

    TEST_CASE("Idempotency-Expires travels with the record in Redis: the same from another "
              "proxy and on a later replay; none on plain answers or problems") {
        redis_server redis;
        upstream_process up;
        const auto cfg = redis_proxy_config(up.port, redis.url() + "/0",
                                            guarded_route("pay", "/v1/pay", "ttl: 2h"));
        proxy_process a(cfg.yaml());
        proxy_process b(cfg.yaml());
        wait_store_answering(a);
        wait_store_answering(b);

        const auto key = unique_key("expires");
        const auto before = std::chrono::system_clock::now();
        const auto first = post_keyed_payment(a.port, "/v1/pay", key);
        const auto after = std::chrono::system_clock::now();
        REQUIRE(first.header("Idempotency-Status") == "stored");
        const auto expires = first.header("Idempotency-Expires");
        INFO("Idempotency-Expires: " << expires);
        const auto when = parse_imf_fixdate(expires);
        REQUIRE(when);
        CHECK(*when >= std::chrono::floor<std::chrono::seconds>(before) + 2h);
        CHECK(*when <= after + 2h + 2s);

        // The other proxy has only Redis to go by.
        const auto replay = post_keyed_payment(b.port, "/v1/pay", key);
        REQUIRE(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.header("Idempotency-Expires") == expires);

        wait_past_second(std::chrono::system_clock::now()); // now + ttl names a later second
        const auto later = post_keyed_payment(a.port, "/v1/pay", key);
        REQUIRE(later.header("Idempotency-Status") == "replayed");
        CHECK(later.header("Idempotency-Expires") == expires);
        CHECK(up.count(key) == 1);

        const auto plain = fetch(a.port, "POST", "/v1/other", {}, keyed_payment_json);
        CHECK(plain.status == 200);
        CHECK_FALSE(plain.has_header("Idempotency-Expires"));
        const auto missing = fetch(a.port, "POST", "/v1/pay",
                                   {{"Content-Type", "application/json"}}, keyed_payment_json);
        check_problem(missing, 400, "idempotency.missing_key");
        CHECK_FALSE(missing.has_header("Idempotency-Expires"));
    }

    TEST_CASE("round trips: one EVALSHA per claim and per completion, none else, as /metrics "
              "counts them") {
        redis_server redis;
        upstream_process up;
        // Health checks every 50 ms, so PINGs certainly run while the requests are counted.
        const auto cfg =
            redis_proxy_config(up.port, redis.url() + "/0", guarded_route("pay", "/v1/pay"),
                               {"health_check_interval: 50ms"});
        proxy_process proxy(cfg.yaml());
        wait_store_answering(proxy);
        // The start-up check and the connections' SCRIPT LOADs are behind us; health-check
        // PINGs are counted as ping; commands run inside scripts are counted under their own
        // names too: the completion script runs one GET and one SET, so the client's own
        // commands are the SETs less the GETs, plus the EVALSHAs.
        redis.cli({"CONFIG", "RESETSTAT"});
        REQUIRE(redis.command_calls("evalsha") == 0);
        REQUIRE(redis.command_calls("set") == 0);

        constexpr long long n = 20;
        std::vector<std::string> keys;
        std::vector<std::string> bodies;
        for (long long i = 0; i < n; ++i) {
            keys.push_back(unique_key("rt"));
            const auto r = post_keyed_payment(proxy.port, "/v1/pay", keys.back());
            REQUIRE(r.header("Idempotency-Status") == "stored");
            bodies.push_back(r.body);
        }
        CHECK(redis.command_calls("evalsha") == n); // complete
        CHECK(redis.command_calls("get") == n);     // (inside the script)
        CHECK(redis.command_calls("set") == 2 * n); // claim + (inside the script)
        CHECK(redis.command_calls("pttl") == 0);    // no key was found in flight
        // The proxy counts the same round trips per request: two per first execution.
        CHECK(route_series(proxy, "onceproxy_requests_total", "pay", "stored") == n);
        CHECK(route_series(proxy, "onceproxy_store_round_trips_total", "pay", "stored") == 2 * n);

        for (long long i = 0; i < n; ++i) {
            const auto r =
                post_keyed_payment(proxy.port, "/v1/pay", keys[static_cast<std::size_t>(i)]);
            CHECK(r.header("Idempotency-Status") == "replayed");
            CHECK(r.body == bodies[static_cast<std::size_t>(i)]);
        }
        CHECK(redis.command_calls("set") == 3 * n); // + one claim per replay, nothing else
        CHECK(redis.command_calls("evalsha") == n);
        CHECK(redis.command_calls("get") == n);
        CHECK(route_series(proxy, "onceproxy_requests_total", "pay", "replayed") == n);
        CHECK(route_series(proxy, "onceproxy_store_round_trips_total", "pay", "replayed") == n);
        CHECK(route_series(proxy, "onceproxy_store_round_trips_total", "pay", "stored") == 2 * n);
        CHECK(redis.command_calls("eval") == 0); // no NOSCRIPT fallback
        CHECK(redis.command_calls("ping") > 0);  // there were PINGs, not counted above
        CHECK(up.total() == static_cast<std::uint64_t>(n));
    }

    TEST_CASE("key_prefix: two services on one Redis keep their own records under their prefix") {
        redis_server redis;
        upstream_process up;
        const auto config_with = [&](const std::string& prefix) {
            return redis_proxy_config(up.port, redis.url() + "/0", guarded_route("pay", "/v1/pay"),
                                      {"key_prefix: \"" + prefix + "\""})
                .yaml();
        };
        proxy_process a(config_with("svc-a:")), b(config_with("svc-b:"));
        wait_store_answering(a);
        wait_store_answering(b);
        const auto key = unique_key("prefix");

        // Same key, same body, same route name: one service's record must not answer the other.
        const auto first_a = post_keyed_payment(a.port, "/v1/pay", key);
        const auto first_b = post_keyed_payment(b.port, "/v1/pay", key);
        CHECK(first_a.header("Idempotency-Status") == "stored");
        CHECK(first_b.header("Idempotency-Status") == "stored");
        CHECK(up.count(key) == 2);
        CHECK(first_a.body != first_b.body); // two executions, two execution ids

        const auto again_a = post_keyed_payment(a.port, "/v1/pay", key);
        const auto again_b = post_keyed_payment(b.port, "/v1/pay", key);
        CHECK(again_a.header("Idempotency-Status") == "replayed");
        CHECK(again_b.header("Idempotency-Status") == "replayed");
        CHECK(again_a.body == first_a.body);
        CHECK(again_b.body == first_b.body);
        CHECK(up.count(key) == 2);

        // What an operator sees: redis-cli --scan walks the keyspace with SCAN (never KEYS).
        const auto split = [](const std::string& text) {
            std::vector<std::string> lines;
            std::size_t start = 0;
            while (start < text.size()) {
                auto end = text.find('\n', start);
                if (end == std::string::npos) {
                    end = text.size();
                }
                if (end > start) {
                    lines.push_back(text.substr(start, end - start));
                }
                start = end + 1;
            }
            return lines;
        };
        const auto all = split(redis.cli({"--scan"}));
        const auto under_a = split(redis.cli({"--scan", "--pattern", "svc-a:*"}));
        const auto under_b = split(redis.cli({"--scan", "--pattern", "svc-b:*"}));
        CAPTURE(redis.cli({"--scan"}));
        CHECK(under_a.size() == 1);
        CHECK(under_b.size() == 1);
        CHECK(all.size() == under_a.size() + under_b.size());
        for (const auto& k : all) {
            CAPTURE(k);
            const bool a_key = k.starts_with("svc-a:");
            CHECK((a_key || k.starts_with("svc-b:")));
            // prefix + the hex SHA-256 of (route, principal, key): the raw key never shows.
            const auto hash = k.substr(6);
            CHECK(hash.size() == 64);
            CHECK(hash.find_first_not_of("0123456789abcdef") == std::string::npos);
            CHECK_FALSE(contains(k, key));
        }
        // The two records share the hashed part: only the prefix tells the services apart.
        REQUIRE(under_a.size() == 1);
        REQUIRE(under_b.size() == 1);
        CHECK(under_a[0].substr(6) == under_b[0].substr(6));
        CHECK(redis.cli({"GET", under_a[0]}).starts_with("2c")); // version 2, completed
        CHECK(std::stoll(redis.cli({"PTTL", under_a[0]})) > 0);
    }

    TEST_CASE(
        "Redis outages on two workers: every guarded request ends within its store deadlines") {
        // Issue 26 (7b). Whatever the state of the store connection, a guarded request ends
        // within its deadlines: a claim within command_timeout plus at most one connect_timeout
        // (a lost claim is then read back within as much again), a completion within two
        // command_timeouts (EVALSHA, EVAL on NOSCRIPT), else the route's on_store_error. The
        // sequence of the field report first (a proxy frozen while it owns a lease that a second
        // proxy takes over, its fenced completion refused), then about a minute of Redis outages
        // of various lengths (one long enough for the reconnect backoff to reach its cap, and
        // restarts right after one another) under guarded traffic on both workers of both
        // proxies. A request that hangs shows as no answer within the client's 8 s.
        constexpr auto command_timeout = 250ms;
        constexpr auto connect_timeout = 500ms;
        constexpr auto store_bound = 2 * (command_timeout + connect_timeout);
        constexpr auto slack = store_bound; // asserted loosely (2x): a hang, not a slow turn
        constexpr auto bound = store_bound + slack;
        redis_server redis;
        upstream_process up(4);
        auto cfg = redis_proxy_config(up.port, redis.url() + "/0",
                                      guarded_route("pay", "/v1/pay", "lease: 2s"));
        cfg.upstream_settings = {"timeout: 2s"}; // the config requires timeout <= lease
        cfg.workers = 2;
        auto a = std::make_unique<proxy_process>(cfg.yaml());
        proxy_process b(cfg.yaml());
        wait_store_answering(*a);
        wait_store_answering(b);

        struct sample {
            std::string key;
            unsigned short port = 0;
            clock_type::duration took{};
            clock_type::duration allowed{};
            std::optional<http_response> answer; ///< nullopt: no answer within 8 s
        };
        std::mutex samples_mutex;
        std::vector<sample> samples;
        // One guarded POST on a fresh connection (so the requests spread over both workers).
        const auto one = [&](unsigned short port, const std::string& tag,
                             clock_type::duration upstream_delay) {
            sample s{unique_key(tag), port, {}, bound + upstream_delay, std::nullopt};
            header_list extra;
            if (upstream_delay > 0ms) {
                extra.emplace_back("X-Test-Delay-Ms", std::to_string(ms(upstream_delay)));
            }
            const auto started = clock_type::now();
            try {
                http_client c(port);
                c.send_raw(make_request("POST", "/v1/pay", idempotency_headers(s.key, extra),
                                        keyed_payment_json));
                s.answer = c.read_response(8s);
            } catch (const std::exception&) {
                s.answer.reset();
            }
            s.took = clock_type::now() - started;
            std::lock_guard lk(samples_mutex);
            samples.push_back(s);
            return s;
        };

        // B retries `key` (same body) until it is not refused as in progress: the lease A held
        // lapsed and B ran the request itself.
        const auto take_over = [&](const std::string& key) {
            std::optional<http_response> taken;
            eventually(
                [&] {
                    auto r =
                        post_keyed_payment(b.port, "/v1/pay", key, {{"X-Test-Delay-Ms", "200"}});
                    if (is_in_progress(r)) {
                        return false;
                    }
                    taken = std::move(r);
                    return true;
                },
                8s, 100ms);
            REQUIRE(taken);
            CHECK(taken->header("Idempotency-Status") == "stored");
        };

        // 1. The field report's start. A is killed while it owns a lease, and started again;
        // the retries go to B, which runs the request once the lease lapsed.
        const auto killed_key = unique_key("killed");
        {
            http_client doomed(a->port);
            doomed.send_raw(make_request(
                "POST", "/v1/pay", idempotency_headers(killed_key, {{"X-Test-Delay-Ms", "3000"}}),
                keyed_payment_json));
            REQUIRE(eventually([&] { return up.count(killed_key) == 1; }, 5s, 5ms));
            a->proc.signal(SIGKILL);
            REQUIRE(a->proc.wait(3s) == 128 + SIGKILL);
        }
        a = std::make_unique<proxy_process>(cfg.yaml());
        wait_store_answering(*a);
        take_over(killed_key);
        // A owns a lease (its upstream call takes 2.5 s) and is frozen; the lease (2 s, not
        // extended while A is frozen) lapses and B takes the key over; A, resumed, finds its
        // upstream call past its timeout and its lease lost.
        const auto key = unique_key("frozen");
        http_client frozen(a->port);
        frozen.send_raw(make_request("POST", "/v1/pay",
                                     idempotency_headers(key, {{"X-Test-Delay-Ms", "2500"}}),
                                     keyed_payment_json));
        REQUIRE(eventually([&] { return up.count(key) == 1; }, 5s, 5ms));
        a->proc.signal(SIGSTOP);
        take_over(key);
        a->proc.signal(SIGCONT);
        const auto after_freeze = frozen.read_response(8s);
        REQUIRE(after_freeze);
        CAPTURE(after_freeze->body);
        // Never recorded over B's record: an unknown outcome (504) or an unrecorded answer.
        CHECK((after_freeze->status == 504 ||
               after_freeze->header("Idempotency-Status") == "unrecorded"));
        CHECK(up.count(key) == 2);

        // 2. Guarded traffic on both proxies for the rest of the test.
        std::atomic<bool> stop_load{false};
        std::vector<std::thread> load;
        // Some requests outlast the first lease renewal (lease / 3) and keep it renewed while
        // Redis goes away and comes back; the others only claim and complete.
        const std::vector<std::pair<unsigned short, std::chrono::milliseconds>> loads{
            {a->port, 0ms}, {a->port, 900ms}, {b.port, 0ms}, {a->port, 0ms}};
        for (const auto& [port, delay] : loads) {
            load.emplace_back([&, port, delay] {
                while (!stop_load.load()) {
                    one(port, "outage", delay);
                    // Real time is the subject: a steady load across the outages.
                    std::this_thread::sleep_for(20ms);
                }
            });
        }
        struct joiner {
            std::vector<std::thread>& threads;
            std::atomic<bool>& stop;
            ~joiner() {
                stop = true;
                for (auto& t : threads) {
                    if (t.joinable()) {
                        t.join();
                    }
                }
            }
        } join_load{load, stop_load};

        // 3. About a minute of outages: Redis killed and restarted, each pair (down, up). The
        // first outage is long enough (9 failed attempts) for the backoff to reach its 2 s cap,
        // so the restart comes while a worker waits out a long backoff; some restarts follow
        // each other within a second or two.
        wait_until(
            [&] {
                std::lock_guard lk(samples_mutex);
                return samples.size() >= 8;
            },
            10s, "traffic before the first outage");
        const std::vector<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> cycles{
            {7400ms, 5000ms}, {1000ms, 1000ms}, {3000ms, 600ms}, {500ms, 4000ms},
            {7400ms, 1500ms}, {2000ms, 300ms},  {800ms, 5000ms}, {4000ms, 2500ms},
        };
        const auto outages_started = clock_type::now();
        for (const auto& [down, then_up] : cycles) {
            redis.kill();
            std::this_thread::sleep_for(down); // real time is the subject: the outage's length
            redis.start();
            std::this_thread::sleep_for(then_up); // and the service between two outages
        }
        // 4. As in the report: a guarded request 5 s after the last restart, upstream 1.5 s.
        std::this_thread::sleep_for(5s); // real time is the subject (the report's timing)
        for (int i = 0; i < 6; ++i) {
            const auto s = one(i % 2 == 0 ? a->port : b.port, "after", 1500ms);
            CAPTURE(s.key);
            REQUIRE(s.answer);
            CHECK(s.answer->status == 200);
            CHECK(s.answer->header("Idempotency-Status") == "stored");
        }
        stop_load = true;
        for (auto& t : load) {
            t.join();
        }
        CAPTURE(ms(clock_type::now() - outages_started));

        REQUIRE(samples.size() >= 100);
        std::size_t stored = 0;
        std::size_t refused = 0;
        for (const auto& s : samples) {
            CAPTURE(s.key);
            CAPTURE(s.port);
            CAPTURE(ms(s.took));
            REQUIRE(s.answer); // an answer, not a client-side timeout
            CAPTURE(s.answer->status);
            CAPTURE(s.answer->body);
            CHECK(ms(s.took) <= ms(s.allowed));
            if (s.answer->status == 503) {
                check_problem(*s.answer, 503, "idempotency.store_unavailable");
                ++refused;
            } else {
                CHECK(s.answer->status == 200);
                stored += s.answer->header("Idempotency-Status") == "stored" ? 1 : 0;
            }
        }
        CHECK(stored > 0);
        CHECK(refused > 0);
        CHECK(a->proc.running());
        CHECK(b.proc.running());
        // Each worker's event-loop lag is exported.
        for (const auto* p : {a.get(), &b}) {
            CHECK(p->metric("onceproxy_event_loop_lag_seconds{worker=\"0\"}") >= 0);
            CHECK(p->metric("onceproxy_event_loop_lag_seconds{worker=\"1\"}") >= 0);
        }
    }
}
