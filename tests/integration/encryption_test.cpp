// Encryption at rest of records (store.encryption), seen from outside: real onceproxy processes,
// the real test upstream (its per-key execution counts), a real redis-server and redis-cli for
// the raw stored bytes. A record sealed by one replica replays on another holding the same key,
// never under a key set that cannot open it (counted, answered 409, not executed again), and
// keys rotate by reload.

#include "store/redis_record.hpp"
#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string key_a = std::string(64, 'a');                                               // hex
const std::string key_b = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; // hex

/// `store:` lines with encryption keys (id, file) in order; `redis_url` empty: memory store.
std::vector<std::string> store_lines(const std::string& redis_url, const std::string& prefix,
                                     const std::vector<std::pair<std::string, std::string>>& keys) {
    std::vector<std::string> lines;
    if (!redis_url.empty()) {
        lines = {"type: redis",
                 "redis:",
                 "  url: \"" + redis_url + "/0\"",
                 "  key_prefix: \"" + prefix + "\"",
                 "  command_timeout: 250ms",
                 "  connect_timeout: 500ms"};
    }
    if (!keys.empty()) {
        lines.emplace_back("encryption:");
        lines.emplace_back("  keys:");
        for (const auto& [id, file] : keys) {
            lines.push_back("    - { id: " + id + ", file: " + file + " }");
        }
    }
    return lines;
}

std::string config(unsigned short upstream_port, std::vector<std::string> store) {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.store = std::move(store);
    c.routes = "  - name: pay\n    match: { prefix: /pay }\n    upstream: app\n"
               "    idempotency: { mode: required }\n";
    return c.yaml();
}

http_response post(unsigned short port, const std::string& key) {
    return fetch(port, "POST", "/pay/1",
                 {{"Idempotency-Key", key}, {"Content-Type", "application/json"}},
                 R"({"amount":100})");
}

long long decrypt_failures(const proxy_process& p, const std::string& reason) {
    return p.metric("onceproxy_record_decrypt_failures_total{route=\"pay\",reason=\"" + reason +
                    "\"}");
}

void rewrite_config(const proxy_process& p, const std::string& yaml) {
    const auto tmp = p.config_file + ".next";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << yaml;
    }
    REQUIRE(std::rename(tmp.c_str(), p.config_file.c_str()) == 0);
}

void reload(proxy_process& p, long long count) {
    p.proc.signal(SIGHUP);
    REQUIRE_MESSAGE(eventually([&] {
                        return p.metric("onceproxy_config_reloads_total{result=\"success\"}") >=
                               count;
                    }),
                    p.log());
}

/// The Redis keys under `prefix`.
std::set<std::string> redis_keys(const redis_server& redis, const std::string& prefix) {
    std::istringstream in(redis.cli({"--scan", "--pattern", prefix + "*"}));
    std::set<std::string> keys;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty()) {
            keys.insert(line);
        }
    }
    return keys;
}

/// The stored answer of Redis key `k` (the payload of its value, redis_record.hpp), as raw bytes.
std::string raw_payload(const redis_server& redis, const std::string& k) {
    auto value = redis.cli({"GET", k});
    if (!value.empty() && value.back() == '\n') {
        value.pop_back(); // redis-cli's line end
    }
    const auto v = onceproxy::store::redis_record::parse(value);
    return v ? value.substr(v->payload_offset) : "(not a record: " + value.substr(0, 16) + ")";
}

/// The key id of a sealed payload: the marker byte (0xe6, or 0xe5 from earlier versions), a
/// length byte, then the id in clear.
std::string key_id_of(const std::string& payload) {
    if (payload.size() < 2 || (static_cast<unsigned char>(payload[0]) != 0xe6 &&
                               static_cast<unsigned char>(payload[0]) != 0xe5)) {
        return "(not sealed: " + payload.substr(0, 16) + ")";
    }
    return payload.substr(2, static_cast<unsigned char>(payload[1]));
}

} // namespace

TEST_SUITE("encryption at rest") {
    TEST_CASE("memory store: sealed records replay; rotation by reload; a removed key never "
              "replays nor executes again") {
        upstream_process up;
        temp_dir keys;
        const auto k1 = keys.write("k1", key_a + "\n");
        const auto k2 = keys.write("k2", key_b);
        proxy_process p(config(up.port, store_lines("", "", {{"k1", k1}})));

        const auto key = unique_key("enc", "mem");
        const auto first = post(p.port, key);
        REQUIRE(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        const auto again = post(p.port, key);
        CHECK(again.status == 200);
        CHECK(again.header("Idempotency-Status") == "replayed");
        CHECK(again.body == first.body);
        CHECK(up.count(key) == 1);

        // k2 added as the primary: the k1 record still replays, new ones are sealed with k2.
        rewrite_config(p, config(up.port, store_lines("", "", {{"k2", k2}, {"k1", k1}})));
        reload(p, 1);
        CHECK(post(p.port, key).body == first.body);
        const auto key2 = unique_key("enc", "mem2");
        const auto second = post(p.port, key2);
        CHECK(second.header("Idempotency-Status") == "stored");
        CHECK(post(p.port, key2).header("Idempotency-Status") == "replayed");

        // k1 removed: its record does not open. Not replayed, not executed again: 409.
        rewrite_config(p, config(up.port, store_lines("", "", {{"k2", k2}})));
        reload(p, 2);
        const auto refused = post(p.port, key);
        check_problem(refused, 409, "idempotency.response_not_replayable");
        CHECK(refused.body.find(json_member(first.body, "execution_id")) == std::string::npos);
        CHECK(up.count(key) == 1);
        CHECK(decrypt_failures(p, "unknown_key") == 1);
        CHECK(post(p.port, key2).body == second.body); // k2's record still replays
        CHECK(up.count(key2) == 1);

        // Encryption turned off: a sealed record is not replayed either.
        rewrite_config(p, config(up.port, store_lines("", "", {})));
        reload(p, 3);
        check_problem(post(p.port, key2), 409, "idempotency.response_not_replayable");
        CHECK(decrypt_failures(p, "unknown_key") == 2);
        CHECK(up.count(key2) == 1);
        CHECK(p.terminate() == 0);
    }

    TEST_CASE("redis: one replica's record replays on another with the same keys; the stored "
              "bytes hold no plaintext; other keys are refused and counted") {
        redis_server redis;
        upstream_process up;
        temp_dir keys;
        const auto k1 = keys.write("k1", key_a);
        const auto wrong = keys.write("wrong", key_b); // same id, other bytes
        const std::string prefix = "enc-a:";
        const auto same = config(up.port, store_lines(redis.url(), prefix, {{"k1", k1}}));
        proxy_process a(same), b(same);
        proxy_process c(config(up.port, store_lines(redis.url(), prefix, {{"k1", wrong}})));
        proxy_process plain(config(up.port, store_lines(redis.url(), prefix, {})));
        wait_store_answering(a);
        wait_store_answering(b);
        wait_store_answering(c);
        wait_store_answering(plain);

        const auto key = unique_key("enc", "redis");
        const auto first = post(a.port, key);
        REQUIRE(first.status == 200);
        CHECK(first.header("Idempotency-Status") == "stored");
        const auto exec_id = json_member(first.body, "execution_id");
        REQUIRE(!exec_id.empty());

        const auto replay = post(b.port, key);
        CHECK(replay.status == 200);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == first.body);

        // The raw stored value: sealed with k1, no body or header text in clear.
        const auto stored = redis_keys(redis, prefix);
        REQUIRE(stored.size() == 1);
        const auto raw = raw_payload(redis, *stored.begin());
        CAPTURE(raw);
        CHECK(key_id_of(raw) == "k1");
        CHECK(raw.find(exec_id) == std::string::npos);
        CHECK(raw.find("execution_id") == std::string::npos);
        CHECK(raw.find("application/json") == std::string::npos);

        // Another key under the same id, and a replica without encryption: never replayed,
        // never executed again.
        const auto by_c = post(c.port, key);
        check_problem(by_c, 409, "idempotency.response_not_replayable");
        CHECK(by_c.body.find(exec_id) == std::string::npos);
        CHECK(decrypt_failures(c, "authentication") == 1);
        const auto by_plain = post(plain.port, key);
        check_problem(by_plain, 409, "idempotency.response_not_replayable");
        CHECK(decrypt_failures(plain, "unknown_key") == 1);
        CHECK(up.count(key) == 1);

        // A record written in plaintext (before encryption was on) is not trusted by a replica
        // that encrypts.
        const auto old_key = unique_key("enc", "plaintext");
        CHECK(post(plain.port, old_key).header("Idempotency-Status") == "stored");
        check_problem(post(a.port, old_key), 409, "idempotency.response_not_replayable");
        CHECK(decrypt_failures(a, "plaintext") == 1);
        CHECK(up.count(old_key) == 1);

        // A sealed record copied under another store key does not open there.
        const auto victim = unique_key("enc", "victim");
        CHECK(post(a.port, victim).header("Idempotency-Status") == "stored");
        const auto now = redis_keys(redis, prefix);
        std::string victim_key;
        for (const auto& k : now) {
            if (k != *stored.begin() && key_id_of(raw_payload(redis, k)) == "k1") {
                victim_key = k;
            }
        }
        REQUIRE(!victim_key.empty());
        // DUMP/RESTORE keeps the bytes exactly: the victim's record now holds `key`'s sealed
        // answer under the victim's store key.
        redis.cli({"DEL", victim_key});
        CHECK(redis.cli({"COPY", *stored.begin(), victim_key}).find('1') != std::string::npos);
        check_problem(post(b.port, victim), 409, "idempotency.response_not_replayable");
        CHECK(decrypt_failures(b, "authentication") == 1);
        CHECK(up.count(victim) == 1);
    }

    TEST_CASE("redis: rotation by reload; old records replay, new ones are sealed with the new "
              "key (seen in the raw value)") {
        redis_server redis;
        upstream_process up;
        temp_dir keys;
        const auto k1 = keys.write("k1", key_a);
        const auto k2 = keys.write("k2", key_b + "\n");
        const std::string prefix = "enc-r:";
        proxy_process p(config(up.port, store_lines(redis.url(), prefix, {{"k1", k1}})));
        wait_store_answering(p);
        const auto old_key = unique_key("enc", "rot-old");
        const auto old_answer = post(p.port, old_key);
        REQUIRE(old_answer.header("Idempotency-Status") == "stored");
        const auto before = redis_keys(redis, prefix);
        REQUIRE(before.size() == 1);
        CHECK(key_id_of(raw_payload(redis, *before.begin())) == "k1");

        rewrite_config(p,
                       config(up.port, store_lines(redis.url(), prefix, {{"k2", k2}, {"k1", k1}})));
        reload(p, 1);
        wait_store_answering(p);
        const auto replay = post(p.port, old_key);
        CHECK(replay.header("Idempotency-Status") == "replayed");
        CHECK(replay.body == old_answer.body);

        const auto new_key = unique_key("enc", "rot-new");
        CHECK(post(p.port, new_key).header("Idempotency-Status") == "stored");
        auto after = redis_keys(redis, prefix);
        REQUIRE(after.size() == 2);
        after.erase(*before.begin());
        CHECK(key_id_of(raw_payload(redis, *after.begin())) == "k2");
        CHECK(key_id_of(raw_payload(redis, *before.begin())) == "k1");
        CHECK(post(p.port, new_key).header("Idempotency-Status") == "replayed");
        CHECK(up.count(old_key) == 1);
        CHECK(up.count(new_key) == 1);
        CHECK(decrypt_failures(p, "authentication") == 0);
        CHECK(decrypt_failures(p, "unknown_key") == 0);
        CHECK(p.terminate() == 0);
    }
    TEST_CASE("redis: a record whose created field was altered in Redis is refused, not "
              "replayed nor executed again") {
        redis_server redis;
        upstream_process up;
        temp_dir keys;
        const auto k1 = keys.write("k1", key_a);
        const std::string prefix = "enc-c:";
        proxy_process p(config(up.port, store_lines(redis.url(), prefix, {{"k1", k1}})));
        wait_store_answering(p);
        const auto key = unique_key("enc", "created");
        const auto first = post(p.port, key);
        REQUIRE(first.header("Idempotency-Status") == "stored");
        REQUIRE(post(p.port, key).header("Idempotency-Status") == "replayed");
        const auto stored = redis_keys(redis, prefix);
        REQUIRE(stored.size() == 1);
        CHECK(key_id_of(raw_payload(redis, *stored.begin())) == "k1");

        // Rewrites <created ms> of the value (2c<n>:<owner><n>:<fingerprint><created ms>;...)
        // in place, one second earlier, keeping the TTL: the sealed bytes stay as they were.
        const std::string shift_created = R"(
local v = redis.call('GET', KEYS[1])
local ol, at = string.match(v, '^(%d+):()', 3)
at = at + tonumber(ol)
local fl, at2 = string.match(v, '^(%d+):()', at)
at = at2 + tonumber(fl)
local ct, semi = string.match(v, '^(%d+)();', at)
redis.call('SET', KEYS[1], string.sub(v, 1, at - 1) .. (tonumber(ct) - 1000) ..
           string.sub(v, semi), 'KEEPTTL')
return ct)";
        const auto was = redis.cli({"EVAL", shift_created, "1", *stored.begin()});
        INFO("created was " << was);
        REQUIRE(was.find_first_of("0123456789") != std::string::npos);

        const auto again = post(p.port, key);
        check_problem(again, 409, "idempotency.response_not_replayable");
        CHECK(again.body.find(json_member(first.body, "execution_id")) == std::string::npos);
        CHECK(decrypt_failures(p, "authentication") == 1);
        CHECK(up.count(key) == 1);
        CHECK(p.terminate() == 0);
    }
}
