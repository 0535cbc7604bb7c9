// SIGHUP reload (issue 9 item 5), with the real binary and real signals: a new config serves new
// requests, requests in flight finish on the config they started with, a rejected config (broken,
// or changing what only a restart can change) leaves the running one in place, and the
// listening sockets stay open throughout.

#include "support/http_client.hpp"
#include "support/log_lines.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// Replaces the proxy's config file the way a ConfigMap update does: written aside, then renamed
/// over (a reader never sees half a file).
void rewrite_config(const proxy_process& p, const std::string& yaml) {
    const auto tmp = p.config_file + ".next";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << yaml;
    }
    REQUIRE(std::rename(tmp.c_str(), p.config_file.c_str()) == 0);
}

long long reloads(const proxy_process& p, const std::string& result) {
    return p.metric("onceproxy_config_reloads_total{result=\"" + result + "\"}");
}

/// The `sha256` label of onceproxy_config_info.
std::string config_hash(const proxy_process& p) {
    const auto text = p.admin("/metrics").body;
    const std::string prefix = "onceproxy_config_info{sha256=\"";
    const auto at = text.find(prefix);
    if (at == std::string::npos) {
        return {};
    }
    return text.substr(at + prefix.size(), 16);
}

std::string route(const std::string& name, const std::string& prefix) {
    return "  - name: " + name + "\n    match: { prefix: " + prefix + " }\n    upstream: app\n";
}

/// A config with routes `routes` and no catch-all (an unrouted path is a 404).
std::string config_with(unsigned short upstream_port, const std::string& routes,
                        std::vector<std::string> limits = {}) {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.catch_all = false;
    c.routes = routes;
    c.limits = std::move(limits);
    return c.yaml();
}

/// A reload was answered (the metric of `result` reached `count`), bounded.
bool reloaded(const proxy_process& p, const std::string& result, long long count) {
    return eventually([&] { return reloads(p, result) >= count; });
}

} // namespace

TEST_SUITE("reload") {
    TEST_CASE("SIGHUP: a route added to the file is served; counters and the config hash follow") {
        upstream_process up;
        proxy_process p(config_with(up.port, route("a", "/a")));
        CHECK(fetch(p.port, "GET", "/a/1").status == 200);
        CHECK(fetch(p.port, "GET", "/b/1").status == 404);
        CHECK(reloads(p, "success") == 0);
        const auto hash_before = config_hash(p);
        CHECK(hash_before.size() == 16);
        CHECK(p.metric("onceproxy_config_last_reload_success_timestamp_seconds") > 0);

        rewrite_config(p, config_with(up.port, route("a", "/a") + route("b", "/b")));
        p.proc.signal(SIGHUP);
        REQUIRE(reloaded(p, "success", 1));
        const auto r = fetch(p.port, "GET", "/b/1");
        CHECK(r.status == 200);
        CHECK(json_member(r.body, "path") == "/b/1");
        CHECK(fetch(p.port, "GET", "/a/2").status == 200);

        // The new route has its series; the old one kept its counts across the reload. (A
        // plain request is counted once its answer is written: the client may read it first.)
        CHECK(eventually([&] {
            return p.metric("onceproxy_requests_total{route=\"b\",outcome=\"passthrough\"}") == 1 &&
                   p.metric("onceproxy_requests_total{route=\"a\",outcome=\"passthrough\"}") == 2;
        }));
        CHECK(config_hash(p) != hash_before);
        CHECK(reloads(p, "error") == 0);
        CHECK(reloads(p, "restart_required") == 0);
        const auto line = find_log_line(p.log(), "config reloaded");
        REQUIRE(line);
        CHECK(log_field(*line, "component") == "config");
        CHECK(log_field(*line, "sha256") == config_hash(p));
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("--watch-config: a file swapped in place is reloaded without a signal") {
        upstream_process up;
        proxy_process p(config_with(up.port, route("a", "/a")), 0, {}, {}, {"--watch-config", "1"});
        CHECK(fetch(p.port, "GET", "/b/1").status == 404);
        // Nothing changed: the watch does not reload. Real time is the subject: past a check
        // tick (1 s).
        std::this_thread::sleep_for(1500ms);
        CHECK(reloads(p, "success") == 0);

        rewrite_config(p, config_with(up.port, route("a", "/a") + route("b", "/b")));
        REQUIRE(reloaded(p, "success", 1));
        CHECK(fetch(p.port, "GET", "/b/1").status == 200);
        const auto line = find_log_line(p.log(), "reloading the config");
        REQUIRE(line);
        CHECK(log_field(*line, "cause") == "config file changed");

        // A broken version is refused once, not again on every check.
        rewrite_config(p, "listen: [\n");
        REQUIRE(reloaded(p, "error", 1));
        std::this_thread::sleep_for(2500ms); // real time is the subject: two more check ticks
        CHECK(reloads(p, "error") == 1);
        CHECK(fetch(p.port, "GET", "/b/2").status == 200);
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("--watch-config refuses an interval that is not 1 to 3600 seconds") {
        temp_dir dir;
        for (const char* bad : {"0", "3601", "x", "1s", ""}) {
            CAPTURE(bad);
            process proc({ONCEPROXY_BIN, "--config", "/nonexistent.yaml", "--watch-config", bad},
                         dir.file("out.log"));
            CHECK(proc.wait(5s) == 2);
            CHECK(proc.log().find("--watch-config needs a number of seconds") != std::string::npos);
        }
    }

    TEST_CASE("SIGHUP: a broken file keeps the running config; the error has file:line:column") {
        upstream_process up;
        proxy_process p(config_with(up.port, route("a", "/a")));
        const auto hash_before = config_hash(p);
        // Line 2, column 1: an unknown key (config_with starts with the listen line).
        const auto good = config_with(up.port, route("b", "/b"));
        REQUIRE(good.rfind("listen: 127.0.0.1:0\n", 0) == 0);
        rewrite_config(p, "listen: 127.0.0.1:0\nlisten_port: 9\n" + good.substr(20));
        p.proc.signal(SIGHUP);
        REQUIRE(reloaded(p, "error", 1));
        CHECK(reloads(p, "success") == 0);
        CHECK(fetch(p.port, "GET", "/a/1").status == 200);
        CHECK(fetch(p.port, "GET", "/b/1").status == 404);
        CHECK(config_hash(p) == hash_before);
        const auto log = p.log();
        INFO("proxy log:\n" << log);
        const auto line = find_log_line(log, "listen_port");
        REQUIRE(line);
        CHECK(log_field(*line, "level") == "error");
        CHECK(log_field(*line, "component") == "config");
        CHECK(log_field(*line, "file") == p.config_file);
        CHECK(log_field(*line, "line") == "2");
        CHECK(log_field(*line, "column") == "1");
        CHECK(log_field(*line, "msg").find(p.config_file + ":2:1:") == 0);
        CHECK(find_log_line(log, "the running config stays"));

        // A good file afterwards is taken.
        rewrite_config(p, good);
        p.proc.signal(SIGHUP);
        REQUIRE(reloaded(p, "success", 1));
        CHECK(fetch(p.port, "GET", "/b/1").status == 200);
        CHECK(fetch(p.port, "GET", "/a/1").status == 404);
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("SIGHUP: a change of the listen address needs a restart and is refused as a whole") {
        upstream_process up;
        proxy_process p(config_with(up.port, route("a", "/a")));
        auto moved = config_with(up.port, route("a", "/a") + route("b", "/b"));
        moved.replace(moved.find("listen: 127.0.0.1:0"), 19,
                      "listen: 127.0.0.1:" + std::to_string(free_port()));
        moved += "workers: 3\n";
        moved.erase(moved.find("workers: 2\n"), 11);
        rewrite_config(p, moved);
        p.proc.signal(SIGHUP);
        REQUIRE(reloaded(p, "restart_required", 1));
        CHECK(reloads(p, "success") == 0);
        // Nothing of the new file was taken, not even the route.
        CHECK(fetch(p.port, "GET", "/a/1").status == 200);
        CHECK(fetch(p.port, "GET", "/b/1").status == 404);
        const auto log = p.log();
        INFO("proxy log:\n" << log);
        const auto line = find_log_line(log, "needs a restart");
        REQUIRE(line);
        CHECK(log_field(*line, "level") == "warn");
        CHECK(log_field(*line, "fields") == "listen, workers");
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("SIGHUP: a slow request in flight finishes on the route it started on") {
        upstream_process up;
        proxy_process p(config_with(up.port, route("slow", "/slow") + route("a", "/a")));
        http_client c(p.port);
        c.send_raw(make_request("GET", "/slow/1", {{"X-Test-Delay-Ms", "1500"}}));
        wait_until([&] { return up.total() == 1; }, 5s, "the upstream has the request");

        // The new config drops the route the request is on.
        rewrite_config(p, config_with(up.port, route("a", "/a")));
        p.proc.signal(SIGHUP);
        REQUIRE(reloaded(p, "success", 1));
        CHECK(fetch(p.port, "GET", "/slow/2").status == 404);

        const auto r = c.read_response(5s);
        REQUIRE(r);
        CHECK(r->status == 200);
        CHECK(json_member(r->body, "path") == "/slow/1");
        CHECK(eventually([&] {
            return p.metric("onceproxy_requests_total{route=\"slow\",outcome=\"passthrough\"}") ==
                   1;
        }));
        // The connection goes on, on the new config.
        c.send_raw(make_request("GET", "/slow/3"));
        const auto next = c.read_response(5s);
        REQUIRE(next);
        CHECK(next->status == 404);
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("SIGHUP: clients connecting during several reloads see no refused connection and "
              "no failed request") {
        upstream_process up;
        const auto one = config_with(up.port, route("a", "/a"));
        const auto two = config_with(up.port, route("a", "/a") + route("b", "/b"));
        proxy_process p(one);
        std::atomic<bool> stop{false};
        std::atomic<unsigned> ok{0};
        std::atomic<unsigned> failed{0};
        std::string first_failure;
        std::thread client([&] {
            const auto bound = clock_type::now() + 20s;
            while (!stop && clock_type::now() < bound) {
                try {
                    const auto r = fetch(p.port, "GET", "/a/loop");
                    if (r.status == 200) {
                        ++ok;
                        continue;
                    }
                    if (failed++ == 0) {
                        first_failure = "status " + std::to_string(r.status) + ": " + r.body;
                    }
                } catch (const std::exception& e) {
                    if (failed++ == 0) {
                        first_failure = e.what();
                    }
                }
            }
        });
        for (int i = 1; i <= 6; ++i) {
            rewrite_config(p, i % 2 == 1 ? two : one);
            p.proc.signal(SIGHUP);
            CHECK(reloaded(p, "success", i));
            const unsigned served = ok;
            wait_until([&] { return ok > served + 2; }, 5s, "requests served after the reload");
        }
        stop = true;
        client.join();
        INFO("first failure: " << first_failure);
        CHECK(failed == 0);
        CHECK(ok > 10);
        CHECK(reloads(p, "success") == 6);
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("SIGHUP: a rotated Redis password in password_file is used from the next "
              "connection") {
        redis_server srv;
        srv.cli({"ACL", "SETUSER", "onceproxy", "on", ">first-pw", "~*", "+@all"});
        upstream_process up;
        temp_dir secrets;
        const auto file = secrets.write("redis-password", "first-pw\n");
        proxy_config c;
        c.upstream_port = up.port;
        c.routes = "  - name: pay\n    match: { prefix: /pay }\n    upstream: app\n"
                   "    idempotency: { mode: required }\n";
        c.store = {"type: redis", "redis:", "  url: \"" + srv.url() + "/0\"",
                   "  username: onceproxy", "  password_file: " + file};
        proxy_process p(c.yaml());
        unsigned n = 0;
        const auto stored = [&] {
            const auto key = "rotation-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
            return fetch(p.port, "POST", "/pay",
                         {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                         R"({"amount":1})")
                       .header("Idempotency-Status") == "stored";
        };
        REQUIRE_MESSAGE(eventually(stored), "proxy log:\n" << p.log());

        srv.cli({"ACL", "SETUSER", "onceproxy", "resetpass", ">second-pw"});
        secrets.write("redis-password", "second-pw\n");
        p.proc.signal(SIGHUP);
        REQUIRE(reloaded(p, "success", 1));
        // Drop the connections authenticated with the old password: they reconnect with the new.
        srv.cli({"CLIENT", "KILL", "USER", "onceproxy"});
        CHECK(eventually(stored));
        const auto log = p.log();
        INFO("proxy log:\n" << log);
        CHECK(find_log_line(log, "password changed"));
        CHECK(find_log_line(log, "redis connection lost"));
        CHECK(log.find("second-pw") == std::string::npos);
        const int status = p.terminate();
        CHECK_MESSAGE(status == 0, "proxy log:\n" << p.log());
    }
}
