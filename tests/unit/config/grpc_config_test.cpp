// The gRPC parts of a route: match.grpc, match.streaming and idempotency.grpc (docs/grpc.md).

#include "onceproxy/config/load.hpp"
#include "onceproxy/config/route_table.hpp"
#include "support/config_errors.hpp"

#include <doctest/doctest.h>

#include <string>

namespace cfg = onceproxy::config;
using onceproxy::test::describe;
using onceproxy::test::errors_of;

namespace {

constexpr const char* h2c_upstream = "upstreams:\n"
                                     "  app: { url: \"http://127.0.0.1:3000\" }\n"
                                     "  grpc: { url: \"http://127.0.0.1:50051\", protocol: h2c }\n";

/// The first error's message containing `needle`, or "" (with every error in the failure).
bool has_error(const std::string& yaml, const std::string& needle) {
    const auto errors = errors_of(yaml);
    for (const auto& e : errors) {
        if (e.to_string().find(needle) != std::string::npos) {
            return true;
        }
    }
    MESSAGE(describe(errors));
    return false;
}

} // namespace

TEST_CASE("grpc match: a service's methods, or one method, of gRPC calls only") {
    const auto c =
        cfg::load_string(std::string(h2c_upstream) +
                             "routes:\n"
                             "  - name: charge\n"
                             "    match: { grpc: \"pay.v1.Payments/Charge\" }\n"
                             "    upstream: grpc\n"
                             "    idempotency: { mode: required }\n"
                             "  - name: payments\n"
                             "    match: { grpc: \"pay.v1.Payments/*\", streaming: [Watch] }\n"
                             "    upstream: grpc\n"
                             "    idempotency: { mode: required }\n"
                             "  - { name: rest, match: { prefix: / }, upstream: app }\n",
                         "test.yaml");
    REQUIRE(c->routes.size() == 3);
    CHECK(c->routes[0].match.path == "/pay.v1.Payments/Charge");
    CHECK(c->routes[0].match.kind == cfg::path_match_kind::exact);
    CHECK(c->routes[1].match.path == "/pay.v1.Payments/");
    CHECK(c->routes[1].match.streaming == std::vector<std::string>{"Watch"});
    const auto find = [&](const char* path, bool grpc) {
        const auto* r = cfg::find_route(*c, "POST", path, grpc);
        return r == nullptr ? std::string() : r->name;
    };
    CHECK(find("/pay.v1.Payments/Charge", true) == "charge");
    CHECK(find("/pay.v1.Payments/Refund", true) == "payments");
    CHECK(find("/pay.v1.Payments/Refund", false) == "rest"); // not a gRPC call
    CHECK(find("/pay.v1.payments/Refund", true) == "rest");  // gRPC paths are case-sensitive
    CHECK(find("/pay.v1.PaymentsX/Refund", true) == "rest");
    CHECK(cfg::find_route(*c, "GET", "/pay.v1.Payments/Charge", true)->name == "rest");
    // The default gRPC status sets.
    const auto& idem = c->routes[0].idempotency;
    CHECK(idem.grpc_record == cfg::default_grpc_record_statuses());
    CHECK(idem.grpc_release == cfg::default_grpc_release_statuses());
    CHECK(idem.grpc_record.test(0));
    CHECK(idem.grpc_release.test(14));
    CHECK_FALSE(idem.grpc_record.test(4)); // DEADLINE_EXCEEDED: uncertain
    CHECK_FALSE(idem.grpc_release.test(4));
}

TEST_CASE("idempotency.grpc: status names in any case, or numbers") {
    const auto c = cfg::load_string(std::string(h2c_upstream) +
                                        "routes:\n"
                                        "  - name: payments\n"
                                        "    match: { grpc: \"pay.Payments/*\" }\n"
                                        "    upstream: grpc\n"
                                        "    idempotency:\n"
                                        "      mode: required\n"
                                        "      grpc: { record: [ok, 5, ALREADY_EXISTS], release: "
                                        "[Unavailable, 4] }\n",
                                    "test.yaml");
    const auto& idem = c->routes[0].idempotency;
    CHECK(idem.grpc_record.count() == 3);
    CHECK(idem.grpc_record.test(0));
    CHECK(idem.grpc_record.test(5));
    CHECK(idem.grpc_record.test(6));
    CHECK(idem.grpc_release.count() == 2);
    CHECK(idem.grpc_release.test(14));
    CHECK(idem.grpc_release.test(4));
}

TEST_CASE("grpc match: errors name the line") {
    const std::string head = std::string(h2c_upstream) + "routes:\n";
    CHECK(has_error(head + "  - { name: a, match: { grpc: \"pay.Payments/*\" }, upstream: app }\n",
                    "needs protocol h2c"));
    CHECK(has_error(head + "  - { name: a, match: { grpc: \"Payments\" }, upstream: grpc }\n",
                    "invalid grpc match"));
    CHECK(has_error(head + "  - { name: a, match: { grpc: \"/pay.P/M\" }, upstream: grpc }\n",
                    "invalid grpc match"));
    CHECK(has_error(head +
                        "  - { name: a, match: { grpc: \"pay.P/M\", path: /x }, upstream: grpc }\n",
                    "a grpc match takes no 'path'"));
    CHECK(has_error(head + "  - { name: a, match: { path: /x, streaming: [W] }, upstream: app }\n",
                    "it needs a grpc match"));
    CHECK(has_error(head + "  - name: a\n"
                           "    match: { grpc: \"pay.P/Watch\", streaming: [Watch] }\n"
                           "    upstream: grpc\n"
                           "    idempotency: { mode: required }\n",
                    "declares it streaming"));
    CHECK(has_error(head + "  - name: a\n"
                           "    match: { grpc: \"pay.P/*\" }\n"
                           "    upstream: grpc\n"
                           "    idempotency: { mode: required, grpc: { record: [OKAY] } }\n",
                    "invalid gRPC status 'OKAY'"));
    CHECK(has_error(head + "  - name: a\n"
                           "    match: { grpc: \"pay.P/*\" }\n"
                           "    upstream: grpc\n"
                           "    idempotency: { mode: required, grpc: { release: [17] } }\n",
                    "invalid gRPC status '17'"));
    // Unguarded, a method may be named and declared streaming (it is plain proxying anyway).
    CHECK(errors_of(head + "  - { name: a, match: { grpc: \"pay.P/Watch\", streaming: [Watch] }, "
                           "upstream: grpc }\n")
              .empty());
}
