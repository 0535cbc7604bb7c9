// The egress listener (issue 33) driven from outside: an app calls the real onceproxy binary's
// egress port, which sends to the real test upstream and retries what is safe to retry. The test
// upstream fails on demand (X-Test-Fail-*) the first N executions of a key and logs when each
// attempt arrived (/__attempts), so every assertion is something the app or the upstream
// observes: statuses, headers, how many attempts reached the upstream under which key, the gaps
// between them, and the proxy's /metrics.

#include "support/http_client.hpp"
#include "support/problem_check.hpp"
#include "support/process.hpp"
#include "support/proxy_fixture.hpp"
#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using namespace onceproxy::test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string unique_key(const std::string& name) {
    return onceproxy::test::unique_key("egress", name);
}

} // namespace

TEST_SUITE("egress: the test upstream itself") {

    // These talk to the test upstream directly: they show that the faults the egress cases rely
    // on behave as documented, so a failure below comes from the proxy, not the test machinery.

    TEST_CASE("X-Test-Fail-Times: the first N executions of a key fail, later ones answer 200") {
        upstream_process upstream;
        const auto key = unique_key("fail-times");
        const header_list h{{"Idempotency-Key", key},
                            {"X-Test-Fail-Times", "2"},
                            {"X-Test-Header", "Retry-After: 1"}};
        const auto first = fetch(upstream.port, "POST", "/v1/pay", h, "{}");
        const auto second = fetch(upstream.port, "POST", "/v1/pay", h, "{}");
        const auto third = fetch(upstream.port, "POST", "/v1/pay", h, "{}");
        CHECK(first.status == 503);
        CHECK(first.header("Retry-After") == "1");
        CHECK(second.status == 503);
        CHECK(second.header("Retry-After") == "1");
        CHECK(third.status == 200);
        CHECK_FALSE(third.has_header("Retry-After")); // X-Test-Header goes with the failures
        CHECK(json_member(third.body, "key") == key);
        CHECK(upstream.count(key) == 3);

        const auto at = upstream.attempts(key);
        REQUIRE(at.size() == 3);
        CHECK(at[0] <= at[1]);
        CHECK(at[1] <= at[2]);
        CHECK(upstream.attempts(unique_key("never-sent")).empty());
    }

    TEST_CASE("X-Test-Fail-Status picks the failing status; X-Test-Header without "
              "X-Test-Fail-Times stays on every answer") {
        upstream_process upstream;
        const auto key = unique_key("fail-status");
        const header_list h{
            {"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}, {"X-Test-Fail-Status", "429"}};
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 429);
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 200);

        const auto plain = fetch(upstream.port, "GET", "/x", {{"X-Test-Header", "X-Extra: 1"}});
        CHECK(plain.status == 200);
        CHECK(plain.header("X-Extra") == "1");
    }

    TEST_CASE("without a key, X-Test-Fault-Id counts the executions; with neither: 400") {
        upstream_process upstream;
        const auto a = unique_key("fault-a");
        const auto b = unique_key("fault-b");
        const auto with_id = [](const std::string& id) {
            return header_list{{"X-Test-Fault-Id", id}, {"X-Test-Fail-Times", "1"}};
        };
        CHECK(fetch(upstream.port, "GET", "/x", with_id(a)).status == 503);
        CHECK(fetch(upstream.port, "GET", "/x", with_id(b)).status == 503); // its own count
        CHECK(fetch(upstream.port, "GET", "/x", with_id(a)).status == 200);
        CHECK(fetch(upstream.port, "GET", "/x", with_id(b)).status == 200);
        CHECK(upstream.attempts(a).size() == 2);
        CHECK(upstream.count(a) == 0); // /__count counts Idempotency-Keys only

        CHECK(fetch(upstream.port, "GET", "/x", {{"X-Test-Fail-Times", "1"}}).status == 400);
    }

    TEST_CASE("X-Test-Fail-With: reset closes without an answer, then the key answers 200") {
        upstream_process upstream;
        const auto key = unique_key("reset");
        const header_list h{
            {"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}, {"X-Test-Fail-With", "reset"}};
        {
            http_client c(upstream.port);
            c.send_raw(make_request("POST", "/x", h, "{}"));
            CHECK_FALSE(c.read_response(5s));
        }
        CHECK(fetch(upstream.port, "POST", "/x", h, "{}").status == 200);
        CHECK(upstream.count(key) == 2);
        CHECK(upstream.attempts(key).size() == 2);
    }

    TEST_CASE("X-Test-Fail-With: hang holds the connection X-Test-Fail-Hang-Ms, then closes") {
        upstream_process upstream;
        const auto key = unique_key("hang");
        const header_list h{{"Idempotency-Key", key},
                            {"X-Test-Fail-Times", "1"},
                            {"X-Test-Fail-With", "hang"},
                            {"X-Test-Fail-Hang-Ms", "300"}};
        http_client c(upstream.port);
        const auto start = clock_type::now();
        c.send_raw(make_request("POST", "/x", h, "{}"));
        CHECK(c.wait_closed(5s));
        CHECK(clock_type::now() - start >= 300ms);
        CHECK(fetch(upstream.port, "POST", "/x", h, "{}").status == 200);
    }

    TEST_CASE("POST /__reset clears the attempt log and restarts the fault counts") {
        upstream_process upstream;
        const auto key = unique_key("reset-log");
        const header_list h{{"Idempotency-Key", key}, {"X-Test-Fail-Times", "1"}};
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 503);
        CHECK(upstream.attempts(key).size() == 1);
        upstream.reset();
        CHECK(upstream.attempts(key).empty());
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 503);
        CHECK(fetch(upstream.port, "POST", "/x", h).status == 200);
    }
}
