// gRPC through onceproxy with real gRPC on both sides (issue 29): Debian's
// python3-grpcio as the client (tests/integration/grpc/client.py, one process per run) and as the
// upstream (tests/integration/grpc/upstream.py), which counts every execution per method and
// idempotency key, so each case checks what a gRPC user sees and that the call took effect once.

#include "support/proxy_fixture.hpp"
#include "support/redis_server.hpp"
#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;

namespace {

const std::string python = "/usr/bin/python3"; // Debian's, with python3-grpcio
const std::string scripts = ONCEPROXY_SOURCE_DIR "/tests/integration/grpc/";

/// upstream.py on 127.0.0.1:<ephemeral>: test.Payments/{Charge,Fail,Slow,Watch}.
struct grpc_upstream {
    temp_dir dir;
    process proc;
    unsigned short port = 0;

    grpc_upstream()
        : proc({python, scripts + "upstream.py", "0", dir.file("counts")},
               dir.file("upstream.log")) {
        // It prints its port once the server is up (its log has stderr too: the first line
        // that is a number).
        wait_until(
            [&] {
                std::istringstream log(proc.log());
                std::string line;
                while (std::getline(log, line) && !log.eof()) {
                    if (!line.empty() && line.size() <= 5 &&
                        line.find_first_not_of("0123456789") == std::string::npos) {
                        port = static_cast<unsigned short>(std::stoi(line));
                        return true;
                    }
                }
                if (!proc.running()) {
                    throw std::runtime_error("upstream.py exited; its log:\n" + proc.log());
                }
                return false;
            },
            10s, "the gRPC upstream prints its port");
    }

    /// Executions of `method` ("Charge", ...) with idempotency-key `key` ("-": none) so far.
    std::uint64_t count(const std::string& method, const std::string& key) const {
        std::istringstream in(read_file(dir.file("counts")));
        std::string m;
        std::string k;
        std::uint64_t n = 0;
        while (in >> m >> k >> n) {
            if (m == "test.Payments/" + method && k == key) {
                return n;
            }
        }
        return 0;
    }
};

/// One run of client.py: a call's status, metadata (binary values in hex) and messages (hex).
struct grpc_result {
    std::string code;
    std::string details;
    header_list initial;
    header_list trailing;
    std::vector<std::string> messages;
    std::string raw; ///< the JSON line, for failure messages

    /// The value of metadata `name` in the initial metadata, then in the trailers ("": none).
    /// A trailers-only answer (the proxy's own) has its metadata in the trailers.
    std::string md(const std::string& name) const {
        for (const auto* list : {&initial, &trailing}) {
            for (const auto& [k, v] : *list) {
                if (k == name) {
                    return v;
                }
            }
        }
        return "";
    }
    /// The initial metadata a replay repeats, sorted: all but idempotency-status and the date
    /// the proxy writes afresh for each answer, as for HTTP (a gRPC answer of the proxy's
    /// carries no content-length).
    header_list recorded_initial() const {
        header_list out;
        for (const auto& h : initial) {
            REQUIRE(h.first != "content-length");
            if (h.first != "idempotency-status" && h.first != "date") {
                out.push_back(h);
            }
        }
        std::sort(out.begin(), out.end());
        return out;
    }
};

header_list metadata_list(const boost::json::value& v) {
    header_list out;
    for (const auto& pair : v.as_array()) {
        const auto& p = pair.as_array();
        out.emplace_back(std::string(p.at(0).as_string()), std::string(p.at(1).as_string()));
    }
    return out;
}

grpc_result one_result(const boost::json::object& o, const std::string& raw) {
    grpc_result r;
    r.raw = raw;
    r.code = std::string(o.at("code").as_string());
    r.details = std::string(o.at("details").as_string());
    r.initial = metadata_list(o.at("initial"));
    r.trailing = metadata_list(o.at("trailing"));
    for (const auto& m : o.at("messages").as_array()) {
        r.messages.emplace_back(m.as_string());
    }
    return r;
}

struct call_options {
    std::string text;      ///< the request message bytes
    header_list metadata;  ///< request metadata
    double timeout_s = 10; ///< the client's deadline (grpc-timeout)
    bool stream = false;   ///< server-streaming call
    int concurrent = 0;    ///< >0: that many identical calls at once
    bool retry = false;    ///< gRPC's retry policy on (UNAVAILABLE, ABORTED; pushback honoured)
};

/// Runs client.py against `target` (bounded by `timeout 60`) and returns its JSON line's calls.
std::vector<grpc_result> run_client(const std::string& target, const std::string& method,
                                    const call_options& o) {
    temp_dir d;
    std::vector<std::string> argv{
        python,      scripts + "client.py",      target, method, "--text", o.text,
        "--timeout", std::to_string(o.timeout_s)};
    for (const auto& [k, v] : o.metadata) {
        argv.push_back("-m");
        argv.push_back(k + "=" + v);
    }
    if (o.stream) {
        argv.push_back("--stream");
    }
    if (o.retry) {
        argv.push_back("--retry");
    }
    if (o.concurrent > 0) {
        argv.push_back("--concurrent");
        argv.push_back(std::to_string(o.concurrent));
    }
    const std::string out = run_command(argv, d.file("stderr")).output;
    boost::system::error_code ec;
    const auto v = boost::json::parse(out, ec);
    if (ec || !v.is_object()) {
        throw std::runtime_error("client.py printed no JSON line: '" + out +
                                 "'; stderr: " + read_file(d.file("stderr")));
    }
    std::vector<grpc_result> results;
    const auto& o_ = v.as_object();
    if (const auto* calls = o_.if_contains("calls")) {
        for (const auto& c : calls->as_array()) {
            results.push_back(one_result(c.as_object(), out));
        }
    } else {
        results.push_back(one_result(o_, out));
    }
    return results;
}

grpc_result call(const std::string& target, const std::string& method, const call_options& o = {}) {
    return run_client(target, method, o).at(0);
}

/// A proxy config for the gRPC upstream: route `payments` guards test.Payments/* (Watch
/// streams) with `idempotency` settings added to `mode: required`; no catch-all route.
proxy_config grpc_config(unsigned short upstream_port, const std::string& idempotency = "") {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.upstream_settings = {"protocol: h2c"};
    c.catch_all = false;
    c.routes = "  - name: payments\n"
               "    match: { grpc: \"test.Payments/*\", streaming: [Watch] }\n"
               "    upstream: app\n"
               "    idempotency: { mode: required" +
               (idempotency.empty() ? std::string() : ", " + idempotency) + " }\n";
    return c;
}

/// onceproxy_requests_total of the route `payments` for `outcome` (-1: no such line).
long long outcomes(const proxy_process& p, const std::string& outcome) {
    return p.metric("onceproxy_requests_total{route=\"payments\",outcome=\"" + outcome + "\"}");
}

/// Whether that counter reaches `n` (bounded: a request is counted as its answer leaves).
bool counted(const proxy_process& p, const std::string& outcome, long long n) {
    return eventually([&] { return outcomes(p, outcome) == n; }, 5s);
}

std::string proxy_target(const proxy_process& p) {
    return "127.0.0.1:" + std::to_string(p.port);
}

/// The proxy's own answer: trailers-only, `code` with `problem` in the onceproxy-problem
/// metadata.
void check_problem(const grpc_result& r, const std::string& code, const std::string& problem) {
    INFO(r.raw);
    CHECK(r.code == code);
    CHECK(r.md("onceproxy-problem") == problem);
    CHECK_FALSE(r.details.empty()); // grpc-message says why
    CHECK(r.messages.empty());
    CHECK(r.initial.empty()); // trailers-only: not the upstream's answer
}

/// A replay repeats the stored answer byte for byte: status, details, messages, trailers (the
/// binary ones included), and the recorded initial metadata.
void check_replay_of(const grpc_result& replay, const grpc_result& first) {
    INFO("first: " << first.raw);
    INFO("replay: " << replay.raw);
    CHECK(first.md("idempotency-status") == "stored");
    CHECK(replay.md("idempotency-status") == "replayed");
    CHECK(replay.code == first.code);
    CHECK(replay.details == first.details);
    CHECK(replay.messages == first.messages);
    CHECK(replay.trailing == first.trailing);
    CHECK(replay.recorded_initial() == first.recorded_initial());
}

std::string hex(const std::string& s) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (const unsigned char c : s) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

call_options keyed(const std::string& key, const std::string& text, header_list extra = {}) {
    call_options o;
    o.text = text;
    o.metadata = {{"idempotency-key", key}};
    o.metadata.insert(o.metadata.end(), extra.begin(), extra.end());
    return o;
}

/// The `store:` lines of a proxy using the Redis at `url`.
std::vector<std::string> redis_store(const std::string& url) {
    return {"type: redis", "redis:", "  url: \"" + url + "\"", "  command_timeout: 250ms",
            "  connect_timeout: 500ms"};
}

/// Waits (bounded) until the proxy's /readyz says its store answers.
void wait_store_ready(const proxy_process& p) {
    wait_until(
        [&] {
            const auto r = p.admin("/readyz");
            return r.status == 200 && r.body.find("store: answering") != std::string::npos;
        },
        10s, "/readyz reports the store answering");
}

} // namespace

TEST_SUITE("grpc") {
    TEST_CASE("a unary call is stored, then replayed byte-identical, and executed once") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        const auto target = proxy_target(proxy);

        const auto key = unique_key("grpc", "charge");
        const auto first = call(target, "/test.Payments/Charge", keyed(key, "order-1"));
        INFO(first.raw);
        CHECK(first.code == "OK");
        CHECK(first.messages == std::vector<std::string>{hex("charged:order-1:1")});
        CHECK(first.md("x-upstream") == "payments");
        CHECK(first.md("x-trace-bin") == "0001feff01");
        CHECK_FALSE(first.md("grpc-status-details-bin").empty());
        const auto replay = call(target, "/test.Payments/Charge", keyed(key, "order-1"));
        check_replay_of(replay, first);
        CHECK(counted(proxy, "stored", 1));
        CHECK(counted(proxy, "replayed", 1));
        CHECK(up.count("Charge", key) == 1);

        SUBCASE("a recordable error (NOT_FOUND) with its details is replayed the same way") {
            const auto k = unique_key("grpc", "notfound");
            const auto o = keyed(k, "order-2", {{"x-want-status", "NOT_FOUND,OK"}});
            const auto a = call(target, "/test.Payments/Fail", o);
            INFO(a.raw);
            CHECK(a.code == "NOT_FOUND");
            CHECK(a.details == "NOT_FOUND test.Payments/Fail #1");
            CHECK_FALSE(a.md("grpc-status-details-bin").empty());
            const auto b = call(target, "/test.Payments/Fail", o);
            check_replay_of(b, a);
            CHECK(up.count("Fail", k) == 1);
        }
    }

    TEST_CASE("the same key with another message: FAILED_PRECONDITION payload_mismatch") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        const auto target = proxy_target(proxy);
        const auto key = unique_key("grpc", "mismatch");
        REQUIRE(call(target, "/test.Payments/Charge", keyed(key, "order-1")).code == "OK");
        const auto r = call(target, "/test.Payments/Charge", keyed(key, "order-2"));
        check_problem(r, "FAILED_PRECONDITION", "idempotency.payload_mismatch");
        CHECK(up.count("Charge", key) == 1);
    }

    TEST_CASE("no idempotency-key: INVALID_ARGUMENT missing_key, nothing executed") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        call_options o;
        o.text = "order-1";
        const auto r = call(proxy_target(proxy), "/test.Payments/Charge", o);
        check_problem(r, "INVALID_ARGUMENT", "idempotency.missing_key");
        CHECK(up.count("Charge", "-") == 0);
    }

    TEST_CASE("concurrent duplicates while the first is in flight: ABORTED in_progress") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        const auto target = proxy_target(proxy);
        const auto key = unique_key("grpc", "inflight");
        // Five identical calls at once; the upstream takes 1.5 s over the one it executes.
        auto o = keyed(key, "order-1", {{"x-sleep-ms", "1500"}});
        o.concurrent = 5;
        const auto calls = run_client(target, "/test.Payments/Slow", o);
        int ok = 0;
        int aborted = 0;
        for (const auto& r : calls) {
            INFO(r.raw);
            if (r.code == "OK") {
                ++ok;
                CHECK(r.md("idempotency-status") == "stored");
            } else {
                ++aborted;
                check_problem(r, "ABORTED", "idempotency.in_progress");
                const auto pushback = r.md("grpc-retry-pushback-ms");
                CHECK_FALSE(pushback.empty());
                CHECK(pushback.find_first_not_of("0123456789") == std::string::npos);
            }
        }
        CHECK(ok == 1);
        CHECK(aborted == 4);
        CHECK(counted(proxy, "in_progress", 4));
        CHECK(up.count("Slow", key) == 1);
        // Once it is stored, a retry is replayed.
        const auto retry = call(target, "/test.Payments/Slow", keyed(key, "order-1"));
        CHECK(retry.md("idempotency-status") == "replayed");
        CHECK(up.count("Slow", key) == 1);
    }

    TEST_CASE("gRPC's retry policy waits out the pushback of an in-flight duplicate, then gets the "
              "replay") {
        grpc_upstream up;
        // A short lease (and an upstream timeout within it): the pushback is the lease left.
        auto c = grpc_config(up.port);
        c.upstream_settings.push_back("timeout: 1500ms");
        c.top = "defaults: { lease: 2s }\n";
        proxy_process proxy(c.yaml());
        const auto key = unique_key("grpc", "retry");
        auto o = keyed(key, "order-1", {{"x-sleep-ms", "1000"}});
        o.concurrent = 2;
        o.retry = true;
        const auto calls = run_client(proxy_target(proxy), "/test.Payments/Slow", o);
        int stored = 0;
        int replayed = 0;
        for (const auto& r : calls) {
            INFO(r.raw);
            CHECK(r.code == "OK");
            CHECK(r.messages == std::vector<std::string>{hex("charged:order-1:1")});
            stored += r.md("idempotency-status") == "stored" ? 1 : 0;
            replayed += r.md("idempotency-status") == "replayed" ? 1 : 0;
        }
        CHECK(stored == 1);
        CHECK(replayed == 1);
        CHECK(up.count("Slow", key) == 1);
        CHECK(counted(proxy, "in_progress", 1));
    }

    TEST_CASE("concurrent duplicates under concurrent: wait: one execution, every call answered") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port, "concurrent: wait").yaml());
        const auto key = unique_key("grpc", "wait");
        auto o = keyed(key, "order-1", {{"x-sleep-ms", "1000"}});
        o.concurrent = 5;
        const auto calls = run_client(proxy_target(proxy), "/test.Payments/Slow", o);
        int stored = 0;
        int replayed = 0;
        for (const auto& r : calls) {
            INFO(r.raw);
            CHECK(r.code == "OK");
            CHECK(r.messages == std::vector<std::string>{hex("charged:order-1:1")});
            CHECK(r.md("x-trace-bin") == "0001feff01");
            stored += r.md("idempotency-status") == "stored" ? 1 : 0;
            replayed += r.md("idempotency-status") == "replayed" ? 1 : 0;
        }
        CHECK(stored == 1);
        CHECK(replayed == 4);
        CHECK(up.count("Slow", key) == 1);
    }

    TEST_CASE("idempotency.grpc sets the statuses a route records and releases") {
        grpc_upstream up;
        proxy_process proxy(
            grpc_config(up.port, "grpc: { record: [OK], release: [UNAVAILABLE, NOT_FOUND] }")
                .yaml());
        const auto target = proxy_target(proxy);
        const auto key = unique_key("grpc", "sets");
        const auto o = keyed(key, "order-1", {{"x-want-status", "NOT_FOUND,OK"}});
        const auto a = call(target, "/test.Payments/Fail", o);
        INFO(a.raw);
        CHECK(a.code == "NOT_FOUND");
        CHECK(a.md("idempotency-status").empty()); // not recorded
        const auto b = call(target, "/test.Payments/Fail", o);
        INFO(b.raw);
        CHECK(b.code == "OK");
        CHECK(b.md("idempotency-status") == "stored");
        CHECK(up.count("Fail", key) == 2);
    }

    TEST_CASE("UNAVAILABLE from the upstream is passed on and releases the key") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        const auto target = proxy_target(proxy);
        const auto key = unique_key("grpc", "unavailable");
        const auto o = keyed(key, "order-1", {{"x-want-status", "UNAVAILABLE,OK"}});
        const auto a = call(target, "/test.Payments/Fail", o);
        INFO(a.raw);
        CHECK(a.code == "UNAVAILABLE");
        CHECK(a.details == "UNAVAILABLE test.Payments/Fail #1"); // the upstream's own answer
        CHECK(a.md("onceproxy-problem").empty());
        CHECK(up.count("Fail", key) == 1);
        CHECK(counted(proxy, "released", 1));
        const auto b = call(target, "/test.Payments/Fail", o);
        INFO(b.raw);
        CHECK(b.code == "OK");
        CHECK(b.md("idempotency-status") == "stored");
        CHECK(b.messages == std::vector<std::string>{hex("charged:order-1:2")});
        CHECK(up.count("Fail", key) == 2);
        const auto c = call(target, "/test.Payments/Fail", o);
        check_replay_of(c, b);
        CHECK(up.count("Fail", key) == 2);
    }

    TEST_CASE("DEADLINE_EXCEEDED after the request was sent: on_upstream_uncertain") {
        grpc_upstream up;
        const auto key = unique_key("grpc", "deadline");

        SUBCASE("hold, DEADLINE_EXCEEDED answered by the upstream: a retry is ABORTED") {
            proxy_process proxy(grpc_config(up.port, "on_upstream_uncertain: hold").yaml());
            const auto target = proxy_target(proxy);
            const auto o = keyed(key, "order-1", {{"x-want-status", "DEADLINE_EXCEEDED,OK"}});
            const auto a = call(target, "/test.Payments/Fail", o);
            INFO(a.raw);
            CHECK(a.code == "DEADLINE_EXCEEDED");
            CHECK(counted(proxy, "held", 1));
            const auto b = call(target, "/test.Payments/Fail", o);
            check_problem(b, "ABORTED", "idempotency.in_progress");
            CHECK_FALSE(b.md("grpc-retry-pushback-ms").empty());
            CHECK(up.count("Fail", key) == 1);
        }
        SUBCASE("release, DEADLINE_EXCEEDED answered by the upstream: a retry executes") {
            proxy_process proxy(grpc_config(up.port, "on_upstream_uncertain: release").yaml());
            const auto target = proxy_target(proxy);
            const auto o = keyed(key, "order-1", {{"x-want-status", "DEADLINE_EXCEEDED,OK"}});
            const auto a = call(target, "/test.Payments/Fail", o);
            INFO(a.raw);
            CHECK(a.code == "DEADLINE_EXCEEDED");
            const auto b = call(target, "/test.Payments/Fail", o);
            INFO(b.raw);
            CHECK(b.code == "OK");
            CHECK(b.md("idempotency-status") == "stored");
            CHECK(up.count("Fail", key) == 2);
        }
        SUBCASE("fail, DEADLINE_EXCEEDED answered by the upstream: UNKNOWN is recorded") {
            proxy_process proxy(grpc_config(up.port, "on_upstream_uncertain: fail").yaml());
            const auto target = proxy_target(proxy);
            const auto o = keyed(key, "order-1", {{"x-want-status", "DEADLINE_EXCEEDED,OK"}});
            const auto a = call(target, "/test.Payments/Fail", o);
            INFO(a.raw);
            CHECK(a.code == "UNKNOWN");
            CHECK(a.md("onceproxy-problem") == "upstream.outcome_unknown");
            CHECK(a.md("idempotency-status") == "stored");
            const auto b = call(target, "/test.Payments/Fail", o);
            INFO(b.raw);
            CHECK(b.code == "UNKNOWN");
            CHECK(b.md("onceproxy-problem") == "upstream.outcome_unknown");
            CHECK(b.md("idempotency-status") == "replayed");
            CHECK(up.count("Fail", key) == 1);
        }
        SUBCASE("hold, the client's deadline (grpc-timeout) passes first: a retry is ABORTED") {
            proxy_process proxy(grpc_config(up.port, "on_upstream_uncertain: hold").yaml());
            const auto target = proxy_target(proxy);
            auto o = keyed(key, "order-1", {{"x-sleep-ms", "3000"}});
            o.timeout_s = 1.0; // ample for the call to reach the upstream
            const auto a = call(target, "/test.Payments/Slow", o);
            INFO(a.raw);
            CHECK(a.code == "DEADLINE_EXCEEDED");
            CHECK(up.count("Slow", key) == 1);
            const auto b = call(target, "/test.Payments/Slow", keyed(key, "order-1"));
            check_problem(b, "ABORTED", "idempotency.in_progress");
            CHECK(up.count("Slow", key) == 1);
        }
        SUBCASE("release, the client's deadline (grpc-timeout) passes first: a retry executes") {
            proxy_process proxy(grpc_config(up.port, "on_upstream_uncertain: release").yaml());
            const auto target = proxy_target(proxy);
            auto o = keyed(key, "order-1", {{"x-sleep-ms", "3000"}});
            o.timeout_s = 1.0; // ample for the call to reach the upstream
            const auto a = call(target, "/test.Payments/Slow", o);
            INFO(a.raw);
            CHECK(a.code == "DEADLINE_EXCEEDED");
            CHECK(up.count("Slow", key) == 1);
            // The metadata is not part of the fingerprint: the retry asks for no sleep.
            const auto b =
                call(target, "/test.Payments/Slow", keyed(key, "order-1", {{"x-sleep-ms", "0"}}));
            INFO(b.raw);
            CHECK(b.code == "OK");
            CHECK(b.md("idempotency-status") == "stored");
            CHECK(up.count("Slow", key) == 2);
        }
    }

    TEST_CASE("a streaming method passes through unguarded: every message, nothing recorded") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        const auto target = proxy_target(proxy);
        const auto key = unique_key("grpc", "watch");
        auto o = keyed(key, "w", {{"x-messages", "4"}});
        o.stream = true;
        for (int i = 1; i <= 2; ++i) {
            const auto r = call(target, "/test.Payments/Watch", o);
            INFO(r.raw);
            CHECK(r.code == "OK");
            CHECK(r.messages == std::vector<std::string>{hex("watch:w:1"), hex("watch:w:2"),
                                                         hex("watch:w:3"), hex("watch:w:4")});
            CHECK(r.md("idempotency-status").empty());
            CHECK(r.md("x-execution") == std::to_string(i));
            CHECK(up.count("Watch", key) == static_cast<std::uint64_t>(i));
        }
        CHECK(counted(proxy, "passthrough", 2));
    }

    TEST_CASE("two replicas over one Redis: stored through one, replayed through the other") {
        redis_server redis;
        grpc_upstream up;
        auto c = grpc_config(up.port);
        c.store = redis_store(redis.url());
        proxy_process a(c.yaml());
        proxy_process b(c.yaml());
        wait_store_ready(a);
        wait_store_ready(b);
        const auto key = unique_key("grpc", "replicas");
        const auto first = call(proxy_target(a), "/test.Payments/Charge", keyed(key, "order-1"));
        INFO(first.raw);
        CHECK(first.code == "OK");
        const auto replay = call(proxy_target(b), "/test.Payments/Charge", keyed(key, "order-1"));
        check_replay_of(replay, first);
        CHECK(up.count("Charge", key) == 1);
    }

    TEST_CASE("a gRPC call no route matches: UNIMPLEMENTED route.not_found") {
        grpc_upstream up;
        proxy_process proxy(grpc_config(up.port).yaml());
        const auto r = call(proxy_target(proxy), "/test.Other/Do", keyed("k", "x"));
        check_problem(r, "UNIMPLEMENTED", "route.not_found");
    }
}
