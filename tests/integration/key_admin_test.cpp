// Key administration seen from outside (SPEC §6, README "Key administration"): the real proxy,
// the real test upstream and, for the Redis cases, a real redis-server shared by two replicas
// and the `onceproxy keys` command. What is asserted is what an operator (the admin API's JSON
// and problems, the CLI's output and exit status) and the upstream (its per-key execution
// counts) observe.

#include "support/http_client.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

constexpr const char* token = "s3cret-admin-token-0123456789abcdef"; // 32 bytes at least
constexpr const char* payment_body = R"({"amount":100,"currency":"EUR"})";

/// The string (or bare number/bool) value of `"name":...` in a flat JSON text ("" if absent).
std::string json_value(const std::string& json, const std::string& name) {
    const std::string needle = "\"" + name + "\":";
    const auto pos = json.find(needle);
    if (pos == std::string::npos) {
        return {};
    }
    auto start = pos + needle.size();
    if (json[start] == '"') {
        ++start;
        return json.substr(start, json.find('"', start) - start);
    }
    return json.substr(start, json.find_first_of(",}", start) - start);
}

const std::string route_yaml = "  - name: pay\n    match: { prefix: /pay }\n    upstream: app\n"
                               "    idempotency: { mode: required }\n";

/// A proxy config with the keys API on (token in `dir`) unless `enabled` is false.
proxy_config admin_config(unsigned short upstream_port, const temp_dir& dir, bool enabled = true,
                          std::vector<std::string> store = {}) {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.routes = route_yaml;
    c.store = std::move(store);
    const std::string file = dir.write("admin-token", std::string(token) + "\n");
    c.admin_settings = {std::string("keys_api: { enabled: ") + (enabled ? "true" : "false") +
                        ", token_file: " + file + " }"};
    return c;
}

std::vector<std::string> redis_store(const std::string& url) {
    return {"type: redis", "redis:", "  url: \"" + url + "\"", "  command_timeout: 500ms",
            "  connect_timeout: 500ms"};
}

std::vector<std::string> postgres_store(const std::string& url) {
    return {"type: postgres", "postgres:", "  url: \"" + url + "\"", "  connect_timeout: 2s",
            "  statement_timeout: 2s"};
}

header_list auth(const std::string& t = token) {
    return {{"Authorization", "Bearer " + t}};
}

http_response keys_api(const proxy_process& p, const std::string& method, const std::string& key,
                       const std::string& extra = "") {
    return fetch(p.admin_port, method, "/admin/v1/keys?route=pay&key=" + key + extra, auth());
}

http_response pay(const proxy_process& p, const std::string& key, header_list extra = {}) {
    header_list h{{"Idempotency-Key", key}, {"Content-Type", "application/json"}};
    h.insert(h.end(), extra.begin(), extra.end());
    return fetch(p.port, "POST", "/pay", h, payment_body);
}

/// A POST whose upstream answer takes `delay`, sent from a thread; join() waits for its answer.
struct slow_request {
    std::optional<http_response> answer;
    std::thread thread;

    slow_request(const proxy_process& p, const std::string& key, std::chrono::milliseconds delay) {
        thread = std::thread([this, &p, key, delay] {
            answer = pay(p, key, {{"X-Test-Delay-Ms", std::to_string(delay.count())}});
        });
    }
    void join() {
        if (thread.joinable()) {
            thread.join();
        }
    }
    ~slow_request() { join(); }
};

/// The force-purge scenario, on whatever store `p` uses: a slow request holds the key, a purge
/// without force is refused, a forced one fences the owner; its late completion records nothing
/// and a retry executes again.
void force_purge_fences_the_owner(const proxy_process& p, const upstream_process& up,
                                  const std::string& key) {
    slow_request slow(p, key, 1500ms);
    REQUIRE(eventually(
        [&] { return json_value(keys_api(p, "GET", key).body, "state") == "in_flight"; }));
    const auto seen = keys_api(p, "GET", key);
    CHECK(seen.status == 200);
    CHECK(std::stoll(json_value(seen.body, "lease_left_ms")) > 0);
    CHECK(std::stoll(json_value(seen.body, "lease_left_ms")) <= 30000);
    CHECK(std::stoll(json_value(seen.body, "owner_age_ms")) >= 0);

    const auto refused = keys_api(p, "DELETE", key);
    CHECK(refused.status == 409);
    CHECK(refused.header("Content-Type") == "application/problem+json");
    CHECK(json_value(refused.body, "code") == "admin.key_in_flight");
    CHECK(json_value(keys_api(p, "GET", key).body, "state") == "in_flight");

    const auto forced = keys_api(p, "DELETE", key, "&force=true");
    CHECK(forced.status == 200);
    CHECK(json_value(forced.body, "purged") == "true");
    CHECK(json_value(forced.body, "was") == "in_flight");

    // The fenced owner's answer arrives; it must not bring the record back.
    slow.join();
    REQUIRE(slow.answer.has_value());
    CHECK(slow.answer->status == 200);
    CHECK(up.count(key) == 1);
    CHECK(json_value(keys_api(p, "GET", key).body, "state") == "absent");
    const auto retry = pay(p, key);
    CHECK(retry.status == 200);
    CHECK(retry.header("Idempotency-Status") != "replayed");
    CHECK(up.count(key) == 2);
    CHECK(p.admin("/metrics")
              .body.find("onceproxy_keys_purged_total{route=\"pay\",forced=\"true\"} 1") !=
          std::string::npos);
}

/// run_cli with its output in `output`: the exit status.
int run_cli(const std::vector<std::string>& args, std::string& output) {
    auto [status, out] = onceproxy::test::run_cli(args);
    output = std::move(out);
    return status;
}

} // namespace

TEST_CASE("keys API: off by default and when disabled; 401 without or with a wrong token") {
    upstream_process up;
    temp_dir dir;
    {
        proxy_config c;
        c.upstream_port = up.port;
        c.routes = route_yaml;
        proxy_process p(c.yaml());
        CHECK(fetch(p.admin_port, "GET", "/admin/v1/keys?route=pay&key=a", auth()).status == 404);
    }
    {
        proxy_process p(admin_config(up.port, dir, false).yaml());
        CHECK(fetch(p.admin_port, "GET", "/admin/v1/keys?route=pay&key=a", auth()).status == 404);
        CHECK(fetch(p.admin_port, "DELETE", "/admin/v1/keys?route=pay&key=a", auth()).status ==
              404);
    }
    proxy_process p(admin_config(up.port, dir).yaml());
    const auto none = fetch(p.admin_port, "GET", "/admin/v1/keys?route=pay&key=a");
    CHECK(none.status == 401);
    CHECK(none.header("Content-Type") == "application/problem+json");
    CHECK(none.header("WWW-Authenticate").rfind("Bearer", 0) == 0);
    CHECK(json_value(none.body, "code") == "admin.unauthorized");
    const auto wrong = fetch(p.admin_port, "DELETE", "/admin/v1/keys?route=pay&key=a",
                             auth("s3cret-admin-token-0123456789abcdex"));
    CHECK(wrong.status == 401);
    CHECK(json_value(wrong.body, "code") == "admin.unauthorized");
    const auto prefix = fetch(p.admin_port, "GET", "/admin/v1/keys?route=pay&key=a",
                              auth("s3cret-admin-token-0123456789abcdef-and-more"));
    CHECK(prefix.status == 401);
    CHECK(fetch(p.admin_port, "GET", "/admin/v1/keys?route=pay&key=a", auth()).status == 200);
    // Bad requests are problems too.
    const auto unknown = keys_api(p, "GET", "a", "&rout=x");
    CHECK(unknown.status == 400);
    CHECK(json_value(unknown.body, "code") == "admin.bad_request");
    CHECK(fetch(p.admin_port, "GET", "/admin/v1/keys?route=nope&key=a", auth()).status == 400);
    CHECK(fetch(p.admin_port, "POST", "/admin/v1/keys?route=pay&key=a", auth()).status == 405);
}

TEST_CASE("keys API config: enabled without a readable, non-empty token file is a config error") {
    temp_dir dir;
    const std::string empty = dir.write("empty-token", "");
    // 31 bytes: one short of the minimum (a trailing line break does not count).
    const std::string short_token = dir.write("short-token", std::string(31, 'x') + "\n");
    const std::string base = "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n"
                             "  keys_api:\n    enabled: true\n";
    const std::string missing_file = dir.write("a.yaml", base + "upstreams: { app: { url: "
                                                                "http://127.0.0.1:1 } }\n");
    const std::string empty_file =
        dir.write("b.yaml", base + "    token_file: " + empty +
                                "\nupstreams: { app: { url: http://127.0.0.1:1 } }\n");
    const std::string absent_file =
        dir.write("c.yaml", base + "    token_file: " + dir.file("nope") +
                                "\nupstreams: { app: { url: http://127.0.0.1:1 } }\n");
    const std::string short_file =
        dir.write("d.yaml", base + "    token_file: " + short_token +
                                "\nupstreams: { app: { url: http://127.0.0.1:1 } }\n");
    std::string out;
    CHECK(run_cli({"--check-config", short_file}, out) == 1);
    CHECK(out.find(short_file + ":6:17: ") != std::string::npos);
    CHECK(out.find("has 31 bytes; expected at least 32") != std::string::npos);
    CHECK(run_cli({"--check-config", missing_file}, out) == 1);
    CHECK(out.find(missing_file + ":5:14: ") != std::string::npos);
    CHECK(out.find("no token_file") != std::string::npos);
    CHECK(run_cli({"--check-config", empty_file}, out) == 1);
    CHECK(out.find(empty_file + ":6:17: ") != std::string::npos);
    CHECK(out.find("is empty") != std::string::npos);
    CHECK(run_cli({"--check-config", absent_file}, out) == 1);
    CHECK(out.find(absent_file + ":6:17: ") != std::string::npos);
    CHECK(out.find("cannot read token_file") != std::string::npos);
}

TEST_CASE("keys API: wrong tokens from one address are throttled: 429 with Retry-After") {
    upstream_process up;
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir).yaml());
    const std::string target = "/admin/v1/keys?route=pay&key=guess";
    const std::string wrong = std::string(token) + "-guess";
    // A fresh address has 10 failures (then one per second): all ten are compared and refused.
    for (int i = 0; i < 10; ++i) {
        const auto r = fetch(p.admin_port, "GET", target, auth(wrong));
        CHECK(r.status == 401);
        CHECK(json_value(r.body, "code") == "admin.unauthorized");
    }
    // The 11th comes well within the second: refused unread. (Searched up to the 20th so that
    // a host slowed to 100 ms per request still sees it; ten more take at least ten seconds.)
    std::optional<http_response> throttled;
    for (int i = 0; i < 10 && !throttled; ++i) {
        auto r = fetch(p.admin_port, "GET", target, auth(wrong));
        if (r.status != 401) {
            throttled = std::move(r);
        }
    }
    REQUIRE(throttled);
    CHECK(throttled->status == 429);
    CHECK(throttled->header("Content-Type") == "application/problem+json");
    CHECK(json_value(throttled->body, "code") == "admin.too_many_attempts");
    const auto retry_after = throttled->header("Retry-After");
    REQUIRE_FALSE(retry_after.empty());
    CHECK(std::stoi(retry_after) >= 1);
    // While throttled, even the right token is not compared.
    CHECK(fetch(p.admin_port, "GET", target, auth()).status == 429);
    // The probes and metrics are not behind the token.
    CHECK(p.admin("/healthz").status == 200);
    CHECK(p.metric("onceproxy_admin_auth_throttled_total") >= 2);
    // After the wait, the right token works again.
    CHECK(eventually([&] { return fetch(p.admin_port, "GET", target, auth()).status == 200; }, 5s,
                     100ms));
}

TEST_CASE("keys API on the memory store: inspect, purge, and a retry executes again") {
    upstream_process up;
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir).yaml());
    const std::string key = unique_key("ka", "mem");

    const auto absent = keys_api(p, "GET", key);
    CHECK(absent.status == 200);
    CHECK(absent.header("Content-Type") == "application/json");
    CHECK(json_value(absent.body, "state") == "absent");
    CHECK(json_value(absent.body, "route") == "pay");
    CHECK(json_value(keys_api(p, "DELETE", key).body, "was") == "absent");

    const auto first = pay(p, key, {{"X-Test-Status", "201"}});
    REQUIRE(first.status == 201);
    REQUIRE(up.count(key) == 1);
    const auto done = keys_api(p, "GET", key);
    CHECK(json_value(done.body, "state") == "completed");
    CHECK(json_value(done.body, "status") == "201");
    CHECK(json_value(done.body, "replayable") == "true");
    CHECK(json_value(done.body, "body_bytes") == std::to_string(first.body.size()));
    CHECK(!json_value(done.body, "recorded_at").empty());
    CHECK(!json_value(done.body, "expires_at").empty());
    CHECK(std::stoll(json_value(done.body, "expires_in_ms")) > 0);
    // The key is scoped by principal: another caller's key of the same name is not this one.
    CHECK(json_value(keys_api(p, "GET", key, "&principal=Bearer%20bob").body, "state") == "absent");

    CHECK(pay(p, key).header("Idempotency-Status") == "replayed");
    CHECK(up.count(key) == 1);

    const auto purged = keys_api(p, "DELETE", key);
    CHECK(purged.status == 200);
    CHECK(json_value(purged.body, "purged") == "true");
    CHECK(json_value(purged.body, "was") == "completed");
    CHECK(json_value(keys_api(p, "GET", key).body, "state") == "absent");
    CHECK(pay(p, key).header("Idempotency-Status") != "replayed");
    CHECK(up.count(key) == 2);
    CHECK(p.admin("/metrics")
              .body.find("onceproxy_keys_purged_total{route=\"pay\",forced=\"false\"} 1") !=
          std::string::npos);
    CHECK(p.log().find("idempotency key purged") != std::string::npos);
    CHECK(p.log().find(key) == std::string::npos); // the key only hashed
}

TEST_CASE("keys API with encryption at rest: a sealed record is inspected as a replay opens it") {
    upstream_process up;
    temp_dir dir;
    const std::string key_file = dir.write("k1", std::string(64, '7') + "\n");
    proxy_process p(admin_config(up.port, dir, true,
                                 {"type: memory",
                                  "encryption:", "  keys: [ { id: k1, file: " + key_file + " } ]"})
                        .yaml());
    const std::string key = unique_key("ka", "sealed");
    const auto first = pay(p, key, {{"X-Test-Status", "201"}});
    REQUIRE(first.status == 201);
    const auto done = keys_api(p, "GET", key);
    CHECK(json_value(done.body, "state") == "completed");
    CHECK(json_value(done.body, "readable") == "true");
    CHECK(json_value(done.body, "status") == "201");
    CHECK(json_value(done.body, "replayable") == "true");
    CHECK(json_value(done.body, "body_bytes") == std::to_string(first.body.size()));
}

TEST_CASE("keys API: the principal addresses the caller's own key") {
    upstream_process up;
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir).yaml());
    const std::string key = unique_key("ka", "principal");
    REQUIRE(pay(p, key, {{"Authorization", "Bearer alice"}}).status == 200);
    CHECK(json_value(keys_api(p, "GET", key).body, "state") == "absent");
    CHECK(json_value(keys_api(p, "GET", key, "&principal=Bearer%20alice").body, "state") ==
          "completed");
    CHECK(json_value(keys_api(p, "GET", key, "&principal=Authorization%3A%20Bearer%20alice").body,
                     "state") == "completed");
    CHECK(json_value(keys_api(p, "GET", key, "&principal=Bearer%20bob").body, "state") == "absent");
}

TEST_CASE("keys API on the memory store: a forced purge fences the owner in flight") {
    upstream_process up(2);
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir).yaml());
    force_purge_fences_the_owner(p, up, unique_key("ka", "mem-force"));
}

TEST_CASE("keys API on Redis: a forced purge fences the owner in flight") {
    redis_server redis;
    upstream_process up(2);
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir, true, redis_store(redis.url())).yaml());
    force_purge_fences_the_owner(p, up, unique_key("ka", "redis-force"));
}

TEST_CASE("keys API on PostgreSQL: a forced purge fences the owner in flight") {
    postgres_server pg;
    upstream_process up(2);
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir, true, postgres_store(pg.url())).yaml());
    wait_store_answering(p);
    force_purge_fences_the_owner(p, up, unique_key("ka", "pg-force"));
}

TEST_CASE("onceproxy keys: inspect and purge on PostgreSQL, seen by the running proxy") {
    postgres_server pg;
    upstream_process up;
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir, true, postgres_store(pg.url())).yaml());
    wait_store_answering(p);
    const std::string key = unique_key("ka", "pg-cli");
    REQUIRE(pay(p, key).status == 200);
    std::string out;
    const std::vector<std::string> address{"--config", p.config_file, "--route",
                                           "pay",      "--key",       key};
    auto with = [&](std::vector<std::string> head) {
        head.insert(head.end(), address.begin(), address.end());
        return head;
    };
    CHECK(run_cli(with({"keys", "inspect"}), out) == 0);
    CHECK(json_value(out, "state") == "completed");
    CHECK(json_value(out, "status") == "200");
    CHECK(run_cli(with({"keys", "purge"}), out) == 0);
    CHECK(json_value(out, "was") == "completed");
    CHECK(run_cli(with({"keys", "inspect"}), out) == 0);
    CHECK(json_value(out, "state") == "absent");
    CHECK(pay(p, key).header("Idempotency-Status") != "replayed");
    CHECK(up.count(key) == 2);
}

TEST_CASE("keys API on Redis: a purge through one replica is seen by the other") {
    redis_server redis;
    upstream_process up;
    temp_dir dir;
    const auto cfg = admin_config(up.port, dir, true, redis_store(redis.url())).yaml();
    proxy_process a(cfg);
    proxy_process b(cfg);
    const std::string key = unique_key("ka", "replicas");
    REQUIRE(pay(a, key).status == 200);
    CHECK(json_value(keys_api(b, "GET", key).body, "state") == "completed");
    CHECK(pay(b, key).header("Idempotency-Status") == "replayed");
    CHECK(json_value(keys_api(b, "DELETE", key).body, "purged") == "true");
    CHECK(json_value(keys_api(a, "GET", key).body, "state") == "absent");
    CHECK(pay(a, key).header("Idempotency-Status") != "replayed");
    CHECK(up.count(key) == 2);
}

TEST_CASE("onceproxy keys: inspect and purge on Redis; the memory store is refused") {
    redis_server redis;
    upstream_process up;
    temp_dir dir;
    proxy_process p(admin_config(up.port, dir, true, redis_store(redis.url())).yaml());
    const std::string key = unique_key("ka", "cli");
    REQUIRE(pay(p, key, {{"Authorization", "Bearer alice"}}).status == 200);

    std::string out;
    const std::vector<std::string> address{"--config", p.config_file, "--route",     "pay", "--key",
                                           key,        "--principal", "Bearer alice"};
    auto with = [&](std::vector<std::string> head) {
        head.insert(head.end(), address.begin(), address.end());
        return head;
    };
    CHECK(run_cli(with({"keys", "inspect"}), out) == 0);
    CHECK(json_value(out, "state") == "completed");
    CHECK(json_value(out, "status") == "200");
    CHECK(run_cli(with({"keys", "purge"}), out) == 0);
    CHECK(json_value(out, "was") == "completed");
    CHECK(out.find("idempotency key purged") != std::string::npos);
    CHECK(run_cli(with({"keys", "inspect"}), out) == 0);
    CHECK(json_value(out, "state") == "absent");
    // The proxy sees it: the retry executes again.
    CHECK(pay(p, key, {{"Authorization", "Bearer alice"}}).header("Idempotency-Status") !=
          "replayed");
    CHECK(up.count(key) == 2);

    // In flight: refused without --force. The request lasts long enough for the command (a
    // process of its own, slow to start under a sanitizer on a loaded machine) to find it there.
    const std::string slow_key = unique_key("ka", "cli-slow");
    slow_request slow(p, slow_key, 4000ms);
    REQUIRE(eventually(
        [&] { return json_value(keys_api(p, "GET", slow_key).body, "state") == "in_flight"; }));
    std::string out2;
    const std::vector<std::string> slow_args{"keys",    "purge", "--config", p.config_file,
                                             "--route", "pay",   "--key",    slow_key};
    CHECK(run_cli(slow_args, out2) == 1);
    CHECK(out2.find("in flight") != std::string::npos);
    slow.join();

    // The memory store lives in the proxy process: the command says so and refuses.
    temp_dir mem_dir;
    proxy_config mem;
    mem.upstream_port = up.port;
    mem.routes = route_yaml;
    const std::string mem_file = mem_dir.write("mem.yaml", mem.yaml());
    CHECK(run_cli({"keys", "inspect", "--config", mem_file, "--route", "pay", "--key", "k"}, out) ==
          2);
    CHECK(out.find("memory store") != std::string::npos);
    CHECK(out.find("admin API") != std::string::npos);
}
