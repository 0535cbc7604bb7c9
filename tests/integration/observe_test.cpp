// Observe mode (issue 13 item 1), driven from outside: the real onceproxy binary in front of the
// real test upstream, once with the embedded memory store and once with a real redis-server. A
// route in `mode: observe` claims, fingerprints and records as `required` does, but every
// request reaches the upstream; what enforcement would have done is counted in
// onceproxy_observed_total{route,would} and logged with the key hashed. Every assertion is what
// a client, the upstream (its execution counts) or an operator (/metrics, the log) observes.

#include "support/http_client.hpp"
#include "support/log_lines.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include <signal.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

const std::string observed_route = R"(  - name: observed
    match: { path: /v1/observed }
    upstream: app
    idempotency: { mode: observe }
)";

/// One upstream and one proxy with an observed route, on the memory store or on Redis.
struct observe_setup {
    std::unique_ptr<redis_server> redis; ///< only for the Redis variant; outlives the proxy
    upstream_process upstream{2};
    std::unique_ptr<proxy_process> proxy;

    explicit observe_setup(bool with_redis) {
        proxy_config c;
        c.upstream_port = upstream.port;
        c.routes = observed_route;
        if (with_redis) {
            redis = std::make_unique<redis_server>();
            c.store = {"type: redis", "redis:", "  url: \"" + redis->url() + "/0\"",
                       "  command_timeout: 250ms", "  connect_timeout: 500ms"};
        }
        proxy = std::make_unique<proxy_process>(c.yaml());
    }
};

observe_setup& memory_setup() {
    static observe_setup s(false);
    return s;
}

observe_setup& redis_setup() {
    static observe_setup s(true);
    return s;
}

long long observed(const proxy_process& p, const std::string& would) {
    return p.metric("onceproxy_observed_total{route=\"observed\",would=\"" + would + "\"}");
}

long long requests(const proxy_process& p, const std::string& outcome) {
    return p.metric("onceproxy_requests_total{route=\"observed\",outcome=\"" + outcome + "\"}");
}

/// Every would-be counter of the observed route, to compare before and after.
struct observed_counts {
    long long replay, conflict, mismatch, missing_key, invalid_key, not_replayable;
    explicit observed_counts(const proxy_process& p)
        : replay(observed(p, "replay")), conflict(observed(p, "conflict")),
          mismatch(observed(p, "mismatch")), missing_key(observed(p, "missing_key")),
          invalid_key(observed(p, "invalid_key")), not_replayable(observed(p, "not_replayable")) {}
};

const std::string order_body = R"({"amount":1000,"currency":"eur"})";

http_response post(const proxy_process& p, const std::string& key, const std::string& body,
                   header_list extra = {}) {
    extra.emplace_back("Content-Type", "application/json");
    extra.emplace_back("Idempotency-Key", key);
    return fetch(p.port, "POST", "/v1/observed", extra, body);
}

/// What the test upstream put in its answer: its unique execution id.
std::string execution_id(const http_response& r) {
    boost::system::error_code ec;
    const auto v = boost::json::parse(r.body, ec);
    if (ec || !v.is_object() || !v.as_object().contains("execution_id")) {
        return {};
    }
    const auto& id = v.as_object().at("execution_id");
    return id.is_string() ? std::string(id.as_string()) : std::string();
}

/// An upstream answer passed on as plain proxying would: no header of the idempotency layer.
void check_plain_answer(const http_response& r) {
    INFO("body: " << r.body);
    CHECK(r.status == 200);
    CHECK(r.header("Idempotency-Status").empty());
    CHECK(r.header("Idempotency-Expires").empty());
    CHECK_FALSE(execution_id(r).empty());
}

/// The observe lines of the proxy's log whose `would` is `would`.
std::vector<boost::json::object> observe_lines(const proxy_process& p, const std::string& would) {
    std::vector<boost::json::object> out;
    for (auto& o : process_log_lines(p.log())) {
        if (log_field(o, "component") == "observe" && log_field(o, "would") == would) {
            out.push_back(std::move(o));
        }
    }
    return out;
}

bool is_lower_hex(const std::string& s) {
    if (s.empty()) {
        return false;
    }
    for (const char c : s) {
        if (!std::isxdigit(static_cast<unsigned char>(c)) ||
            std::isupper(static_cast<unsigned char>(c))) {
            return false;
        }
    }
    return true;
}

// --- the checks, run on each store ------------------------------------------------------------

void duplicate_of_completed_key(observe_setup& s) {
    const auto& p = *s.proxy;
    const auto key = unique_key("observe", "replay");
    const observed_counts before(p);
    const auto stored_before = requests(p, "stored");
    const auto passthrough_before = requests(p, "passthrough");

    const auto first = post(p, key, order_body);
    check_plain_answer(first);
    const auto second = post(p, key, order_body);
    check_plain_answer(second);
    // Enforcement would have replayed the first answer; observe mode ran the request again.
    CHECK(s.upstream.count(key) == 2);
    CHECK(execution_id(second) != execution_id(first));

    const observed_counts after(p);
    CHECK(after.replay == before.replay + 1);
    CHECK(after.conflict == before.conflict);
    CHECK(after.mismatch == before.mismatch);
    CHECK(after.missing_key == before.missing_key);
    CHECK(requests(p, "stored") == stored_before + 1);           // the first was recorded
    CHECK(requests(p, "passthrough") == passthrough_before + 1); // the duplicate was not

    // The log names the route, what would have happened and the key's hash, never the key.
    REQUIRE(eventually(
        [&] { return static_cast<long long>(observe_lines(p, "replay").size()) >= after.replay; }));
    const auto lines = observe_lines(p, "replay");
    const auto& line = lines.back();
    CHECK(log_field(line, "route") == "observed");
    CHECK(log_field(line, "level") == "info");
    const auto hash = log_field(line, "key_hash");
    CHECK(is_lower_hex(hash));
    CHECK(hash.find(key) == std::string::npos);
    CHECK(p.log().find(key) == std::string::npos);
}

void concurrent_duplicate(observe_setup& s) {
    const auto& p = *s.proxy;
    const auto key = unique_key("observe", "conflict");
    const observed_counts before(p);

    // The first attempt holds the key for 800 ms at the upstream.
    http_client slow(p.port);
    slow.send_raw(make_request("POST", "/v1/observed",
                               {{"Content-Type", "application/json"},
                                {"Idempotency-Key", key},
                                {"X-Test-Delay-Ms", "800"}},
                               order_body));
    REQUIRE(eventually([&] { return s.upstream.count(key) == 1; }, 5s));
    // Enforcement would answer 409 in_progress; observe mode forwards at once, next to the first.
    const auto dup = post(p, key, order_body);
    check_plain_answer(dup);
    CHECK(s.upstream.count(key) == 2);
    const auto first = slow.read_response(5s);
    REQUIRE(first);
    check_plain_answer(*first);

    const observed_counts mid(p);
    CHECK(mid.conflict == before.conflict + 1);
    CHECK(mid.replay == before.replay);
    REQUIRE(eventually([&] { return !observe_lines(p, "conflict").empty(); }));

    // The duplicate claimed nothing and did not block the first: its record was completed, so
    // a later retry is a would-be replay.
    check_plain_answer(post(p, key, order_body));
    CHECK(s.upstream.count(key) == 3);
    const observed_counts after(p);
    CHECK(after.replay == mid.replay + 1);
    CHECK(after.conflict == mid.conflict);
}

void mismatching_body(observe_setup& s) {
    const auto& p = *s.proxy;
    const auto key = unique_key("observe", "mismatch");
    const observed_counts before(p);
    check_plain_answer(post(p, key, order_body));
    // Same key, another body: enforcement would answer 422 payload_mismatch.
    check_plain_answer(post(p, key, R"({"amount":5,"currency":"eur"})"));
    CHECK(s.upstream.count(key) == 2);
    const observed_counts after(p);
    CHECK(after.mismatch == before.mismatch + 1);
    CHECK(after.replay == before.replay);
    REQUIRE(eventually([&] { return !observe_lines(p, "mismatch").empty(); }));
}

void missing_and_invalid_key(observe_setup& s) {
    const auto& p = *s.proxy;
    const observed_counts before(p);
    const auto total_before = s.upstream.total();
    // No key: enforcement would answer 400 missing_key.
    check_plain_answer(
        fetch(p.port, "POST", "/v1/observed", {{"Content-Type", "application/json"}}, order_body));
    // A key with a space inside a bare token: enforcement would answer 400 invalid_key.
    check_plain_answer(fetch(p.port, "POST", "/v1/observed",
                             {{"Content-Type", "application/json"}, {"Idempotency-Key", "a b"}},
                             order_body));
    CHECK(s.upstream.total() == total_before + 2);
    const observed_counts after(p);
    CHECK(after.missing_key == before.missing_key + 1);
    CHECK(after.invalid_key == before.invalid_key + 1);
    REQUIRE(eventually([&] { return !observe_lines(p, "missing_key").empty(); }));
    const auto line = observe_lines(p, "missing_key").back();
    CHECK(log_field(line, "route") == "observed");
    CHECK(log_field(line, "key_hash").empty()); // there is no key to hash
    REQUIRE(eventually([&] { return !observe_lines(p, "invalid_key").empty(); }));
    CHECK(p.log().find("\"a b\"") == std::string::npos);
}

/// Last on each proxy: flips the route to `required` with a reload. The record written in
/// observe mode is the first attempt's: a duplicate's answer was never recorded over it.
void flip_to_required(observe_setup& s) {
    const auto& p = *s.proxy;
    const auto key = unique_key("observe", "flip");
    const auto first = post(p, key, order_body);
    check_plain_answer(first);
    check_plain_answer(post(p, key, order_body)); // the duplicate runs again, unrecorded
    REQUIRE(s.upstream.count(key) == 2);

    std::string yaml;
    {
        std::ifstream in(p.config_file);
        std::ostringstream all;
        all << in.rdbuf();
        yaml = all.str();
    }
    const auto at = yaml.find("mode: observe");
    REQUIRE(at != std::string::npos);
    yaml.replace(at, 13, "mode: required");
    {
        const auto tmp = p.config_file + ".next";
        std::ofstream out(tmp, std::ios::trunc);
        out << yaml;
        out.close();
        REQUIRE(std::rename(tmp.c_str(), p.config_file.c_str()) == 0);
    }
    const auto reloads = p.metric("onceproxy_config_reloads_total{result=\"success\"}");
    REQUIRE(::kill(p.proc.pid(), SIGHUP) == 0);
    REQUIRE(eventually([&] {
        return p.metric("onceproxy_config_reloads_total{result=\"success\"}") == reloads + 1;
    }));

    const auto replay = post(p, key, order_body);
    CHECK(replay.status == 200);
    CHECK(replay.header("Idempotency-Status") == "replayed");
    CHECK(execution_id(replay) == execution_id(first));
    CHECK(s.upstream.count(key) == 2);
}

void still_healthy(observe_setup& s) {
    CHECK(s.proxy->proc.running());
    const auto log = s.proxy->log();
    CHECK(log.find("AddressSanitizer") == std::string::npos);
    CHECK(log.find("runtime error:") == std::string::npos);
}

} // namespace

TEST_SUITE("observe") {

    TEST_CASE("memory: a duplicate of a completed key executes again, counted would=replay") {
        duplicate_of_completed_key(memory_setup());
    }
    TEST_CASE("memory: a concurrent duplicate executes beside the first, counted would=conflict") {
        concurrent_duplicate(memory_setup());
    }
    TEST_CASE("memory: a different body under one key executes, counted would=mismatch") {
        mismatching_body(memory_setup());
    }
    TEST_CASE("memory: a missing or malformed key is forwarded, counted missing_key/invalid_key") {
        missing_and_invalid_key(memory_setup());
    }
    TEST_CASE("memory: flipped to required, the record observe mode kept is the first answer") {
        flip_to_required(memory_setup());
        still_healthy(memory_setup());
    }

    TEST_CASE("redis: a duplicate of a completed key executes again, counted would=replay") {
        duplicate_of_completed_key(redis_setup());
    }
    TEST_CASE("redis: a concurrent duplicate executes beside the first, counted would=conflict") {
        concurrent_duplicate(redis_setup());
    }
    TEST_CASE("redis: a different body under one key executes, counted would=mismatch") {
        mismatching_body(redis_setup());
    }
    TEST_CASE("redis: a missing or malformed key is forwarded, counted missing_key/invalid_key") {
        missing_and_invalid_key(redis_setup());
    }
    TEST_CASE("redis: flipped to required, the record observe mode kept is the first answer") {
        flip_to_required(redis_setup());
        still_healthy(redis_setup());
    }

} // TEST_SUITE
