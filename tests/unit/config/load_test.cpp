#include "onceproxy/config/load.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <unistd.h>

namespace cfg = onceproxy::config;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::string conf_path(const char* name) {
    return std::string{ONCEPROXY_SOURCE_DIR} + "/conf/" + name;
}

std::string data_path(const std::string& name) {
    return std::string{ONCEPROXY_TEST_DATA} + "/config/" + name;
}

/// The errors load_string/load_file threw, or an empty list when it loaded.
template <class Load>
std::vector<cfg::config_error> errors_of(Load load) {
    try {
        load();
    } catch (const cfg::config_errors& e) {
        return e.errors();
    }
    return {};
}

std::vector<cfg::config_error> errors_of_text(const std::string& yaml) {
    return errors_of([&] { return cfg::load_string(yaml, "test.yaml"); });
}

std::string describe(const std::vector<cfg::config_error>& errors) {
    std::string out;
    for (const auto& e : errors) {
        out += e.to_string() + "\n";
    }
    return out;
}

cfg::status_set statuses(std::initializer_list<std::pair<std::size_t, std::size_t>> ranges) {
    cfg::status_set s;
    for (const auto& [first, last] : ranges) {
        for (std::size_t i = first; i <= last; ++i) {
            s.set(i);
        }
    }
    return s;
}

constexpr const char* minimal_upstream = "upstreams: { app: { url: \"http://127.0.0.1:3000\" } }\n";

} // namespace

TEST_CASE("conf/minimal.yaml loads with the expected resolved values") {
    const auto c = cfg::load_file(conf_path("minimal.yaml"));
    CHECK(c->source_file == conf_path("minimal.yaml"));
    CHECK(c->listen.host == "127.0.0.1");
    CHECK(c->listen.port == 8080);
    CHECK(c->workers == std::max(1U, std::thread::hardware_concurrency()));
    REQUIRE(c->upstreams.size() == 1);
    CHECK(c->upstreams[0].name == "app");
    CHECK(c->upstreams[0].host == "127.0.0.1");
    CHECK(c->upstreams[0].port == 3000);
    CHECK_FALSE(c->upstreams[0].tls);
    CHECK(c->store.type == cfg::store_type::memory);
    REQUIRE(c->admin.listen.has_value());
    CHECK(c->admin.listen->host == "127.0.0.1");
    CHECK(c->admin.listen->port == 9901);
    REQUIRE(c->routes.size() == 2);
    const auto& pay = c->routes[0];
    CHECK(pay.name == "payments");
    CHECK(pay.match.kind == cfg::path_match_kind::exact);
    CHECK(pay.match.path == "/v1/payments");
    CHECK(pay.match.methods == std::vector<std::string>{"POST"});
    CHECK(pay.idempotency.mode == cfg::idempotency_mode::required);
    // Built-in defaults fill every unset field.
    CHECK(pay.idempotency.methods == std::vector<std::string>{"POST", "PATCH"});
    CHECK(pay.idempotency.key.header == "Idempotency-Key");
    CHECK(pay.idempotency.ttl == 24h);
    CHECK(pay.idempotency.lease == 30s);
    CHECK(pay.idempotency.mismatch_status == 422);
    CHECK(pay.idempotency.record == statuses({{200, 499}}));
    CHECK(pay.idempotency.release == statuses({{408, 408}, {425, 425}, {429, 429}, {500, 599}}));
    CHECK(c->routes[1].idempotency.mode == cfg::idempotency_mode::off);
    CHECK(c->routes[1].match.kind == cfg::path_match_kind::prefix);
}

TEST_CASE("conf/example.yaml loads and shows every knob") {
    const auto c = cfg::load_file(conf_path("example.yaml"));
    REQUIRE(c->admin.listen.has_value());
    CHECK(c->admin.listen->port == 9901);
    CHECK(c->limits.max_response_bytes == 64U * 1024 * 1024);
    CHECK(c->store.memory.max_bytes == 256U * 1024 * 1024);
    CHECK(c->store.redis.command_timeout == 250ms);
    REQUIRE(c->routes.size() == 6);
    CHECK(c->routes[0].idempotency.scope_headers ==
          std::vector<std::string>{"Authorization", "Cookie"});
    CHECK_FALSE(c->routes[0].idempotency.record_set_cookie);
    CHECK(c->routes[1].idempotency.key.json_pointer == "/id");
    CHECK(c->routes[1].idempotency.ttl == 30 * 24h);
    CHECK(c->routes[2].match.kind == cfg::path_match_kind::pattern);
    CHECK(c->routes[2].idempotency.ttl == 24h); // from defaults
    CHECK(c->routes[3].idempotency.mode == cfg::idempotency_mode::off);
    CHECK_FALSE(c->routes[3].limits.max_request_bytes.has_value()); // uploads: none
    CHECK(c->routes[4].match.grpc == "payments.v1.Payments/*");
    CHECK(c->routes[4].match.path == "/payments.v1.Payments/");
    CHECK(c->routes[4].match.streaming == std::vector<std::string>{"Watch"});
    CHECK(c->routes[5].limits.max_request_bytes == c->limits.max_request_bytes);
}

// The example documents every knob "with its built-in default": this keeps that true by
// construction, so a default changed in config.hpp without the example (or the reverse) fails.
TEST_CASE("conf/example.yaml documents exactly the built-in defaults") {
    const auto c = cfg::load_file(conf_path("example.yaml"));
    const cfg::config builtin;

    REQUIRE_FALSE(c->routes.empty());
    REQUIRE(c->routes[0].name == "payments");
    auto documented = c->routes[0].idempotency;
    const cfg::idempotency_config idem;
    // `mode` is off when unset, so the example has to set it to show a guarded route.
    CHECK(documented.mode == cfg::idempotency_mode::required);
    documented.mode = idem.mode;
    CHECK(documented.scope_headers == idem.scope_headers); // the field most likely to drift
    CHECK(documented.exclude_headers == idem.exclude_headers);
    CHECK(documented.record_set_cookie == idem.record_set_cookie);
    CHECK(documented == idem);
    const cfg::route_match match;
    CHECK(c->routes[0].match.path_params == match.path_params);
    CHECK(c->routes[0].match.trailing_slash == match.trailing_slash);
    CHECK(c->routes[0].match.letter_case == match.letter_case);
    // Routes that set nothing but `mode` resolve to the same values, defaults block included.
    CHECK(c->routes[2].name == "orders");
    auto orders = c->routes[2].idempotency;
    orders.mode = idem.mode;
    CHECK(orders == idem);

    CHECK(c->listen == builtin.listen);
    CHECK(c->admin.readiness == builtin.admin.readiness);
    CHECK(c->admin.keys_api == builtin.admin.keys_api);
    CHECK(c->admin.max_connections == builtin.admin.max_connections);
    CHECK(c->admin.header_timeout == builtin.admin.header_timeout);
    CHECK(c->admin.idle_timeout == builtin.admin.idle_timeout);
    CHECK(c->access_log == builtin.access_log);
    CHECK(c->log == builtin.log);
    CHECK(c->limits == builtin.limits);
    CHECK(c->store == builtin.store);
    CHECK(c->trusted_proxies == builtin.trusted_proxies);

    REQUIRE(c->egress.has_value());
    const cfg::egress_config egress;
    CHECK(c->egress->listen == egress.listen);
    CHECK(c->egress->budget == egress.budget);
    CHECK(c->egress->breaker == egress.breaker);
    REQUIRE(c->egress->routes.size() == 1);
    REQUIRE(c->egress->routes[0].retry.has_value());
    CHECK(*c->egress->routes[0].retry == cfg::retry_config{});

    REQUIRE(c->upstreams.size() == 3);
    CHECK(c->upstreams[1].protocol == cfg::upstream_protocol::h2c);
    const auto& app = c->upstreams[0];
    cfg::upstream_config up; // the address is the example's own; every setting is built-in
    up.name = app.name;
    up.url = app.url;
    up.tls = app.tls;
    up.host = app.host;
    up.port = app.port;
    CHECK(app == up);
}

TEST_CASE("record_set_cookie is read, inherited from defaults and overridden by a route") {
    const auto c = cfg::load_string(std::string{minimal_upstream} +
                                        "defaults: { mode: required, record_set_cookie: true }\n"
                                        "routes:\n"
                                        "  - { name: a, match: { path: /a }, upstream: app }\n"
                                        "  - name: b\n"
                                        "    match: { path: /b }\n"
                                        "    upstream: app\n"
                                        "    idempotency: { record_set_cookie: false }\n",
                                    "inline.yaml");
    CHECK(c->routes[0].idempotency.record_set_cookie);
    CHECK_FALSE(c->routes[1].idempotency.record_set_cookie);
    CHECK_FALSE(cfg::idempotency_config{}.record_set_cookie);

    const auto errors =
        errors_of_text(std::string{minimal_upstream} +
                       "defaults: { record_set_cookie: sometimes }\n"
                       "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 2);
}

TEST_CASE("the built-in scope is Authorization and Cookie, and Set-Cookie is not recorded") {
    const cfg::idempotency_config idem;
    CHECK(idem.scope_headers == std::vector<std::string>{"Authorization", "Cookie"});
    CHECK_FALSE(idem.record_set_cookie);
    CHECK(idem.exclude_headers.empty());
}

TEST_CASE("defaults are inherited by routes and overridden field by field") {
    ::setenv("ONCEPROXY_TEST_REDIS_HOST", "redis.internal", 1);
    const auto c = cfg::load_file(data_path("good/inheritance.yaml"));
    ::unsetenv("ONCEPROXY_TEST_REDIS_HOST");

    CHECK(c->listen.host == "::1");
    CHECK(c->listen.port == 8443);
    CHECK_FALSE(c->tls.has_value());
    CHECK(c->workers == 3);
    CHECK_FALSE(c->access_log);
    CHECK(c->admin.readiness.require_store);
    CHECK(c->limits.max_request_bytes == 64U * 1024);
    CHECK(c->limits.max_header_bytes == 16U * 1024); // built-in
    CHECK(c->limits.header_timeout == 500ms);
    CHECK(c->limits.drain_timeout == 2min);

    REQUIRE(c->upstreams.size() == 2);
    CHECK(c->upstreams[0].host == "app.internal");
    CHECK(c->upstreams[0].port == 80);
    CHECK_FALSE(c->upstreams[1].tls);
    CHECK(c->upstreams[1].host == "billing.example.com");
    CHECK(c->upstreams[1].port == 8443);
    CHECK(c->upstreams[1].connect_timeout == 250ms);
    CHECK(c->upstreams[1].max_connections == 8);

    CHECK(c->store.type == cfg::store_type::redis);
    CHECK(c->store.redis.url == "redis://redis.internal:6379/2");
    CHECK(c->store.redis.key_prefix == "p:");
    CHECK(c->store.redis.tls_ca_file == "/etc/${literal}/ca.pem");
    CHECK(c->store.redis.command_timeout == 100ms);
    CHECK(c->store.redis.connect_timeout == 500ms); // built-in
    CHECK(c->store.redis.maxmemory_policy == cfg::maxmemory_check::warn);

    REQUIRE(c->routes.size() == 3);
    const auto& pay = c->routes[0].idempotency;
    CHECK(c->routes[0].upstream_index == 1);
    CHECK(pay.mode == cfg::idempotency_mode::required);            // route
    CHECK(pay.methods == std::vector<std::string>{"POST", "PUT"}); // defaults, upper-cased
    CHECK(pay.ttl == 7 * 24h);                                     // route over defaults
    CHECK(pay.lease == 20s);                                       // defaults
    CHECK(pay.wait_timeout == 10s);                                // built-in
    CHECK(pay.key.json_pointer == "/data/id");                     // route's key source ...
    CHECK(pay.key.header == "Idempotency-Key"); // ... replaces the inherited header as a whole
    CHECK(pay.key.max_length == 64);            // other key fields still inherited
    CHECK(pay.mismatch_status == 409);
    CHECK(pay.concurrent == cfg::concurrent_policy::wait);
    CHECK(pay.stripe_compat);
    CHECK(pay.on_store_error == cfg::store_error_policy::fail_open);
    CHECK(pay.record == statuses({{200, 299}}));
    CHECK(pay.release == statuses({{409, 409}, {500, 599}}));

    const auto& orders = c->routes[1].idempotency;
    CHECK(c->routes[1].upstream_index == 0);
    CHECK(orders.mode == cfg::idempotency_mode::optional); // no block: defaults' mode
    CHECK(orders.key.header == "X-Request-Key");
    CHECK(orders.key.json_pointer.empty());
    CHECK(orders.ttl == 1h);
    CHECK(orders.mismatch_status == 422);
    CHECK_FALSE(orders.stripe_compat);

    CHECK(c->routes[2].idempotency.mode == cfg::idempotency_mode::off);
}

TEST_CASE("a route without an idempotency block is off unless defaults set a mode") {
    const auto c = cfg::load_string(std::string{minimal_upstream} +
                                        "defaults: { ttl: 1h }\n"
                                        "routes:\n"
                                        "  - { name: all, match: { prefix: / }, upstream: app }\n",
                                    "inline.yaml");
    CHECK(c->routes[0].idempotency.mode == cfg::idempotency_mode::off);
    CHECK(c->routes[0].idempotency.ttl == 1h);
}

TEST_CASE("bad files: each error names its line and what was expected") {
    // Every file in bad/ carries its expectations as comments: `# expect: LINE: text`, where
    // text is a substring of "path: message". The file must produce exactly those errors.
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(data_path("bad"))) {
        if (entry.path().extension() == ".yaml") {
            files.push_back(entry.path());
        }
    }
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 25);

    for (const auto& file : files) {
        CAPTURE(file.filename().string());
        struct expectation {
            int line;
            std::string text;
        };
        std::vector<expectation> expected;
        std::ifstream in(file);
        std::string line;
        while (std::getline(in, line)) {
            const std::string tag = "# expect: ";
            if (line.rfind(tag, 0) == 0) {
                const auto colon = line.find(": ", tag.size());
                expected.push_back({std::stoi(line.substr(tag.size(), colon - tag.size())),
                                    line.substr(colon + 2)});
            }
        }
        REQUIRE_FALSE(expected.empty());

        const auto errors = errors_of([&] { return cfg::load_file(file.string()); });
        CAPTURE(describe(errors));
        CHECK(errors.size() == expected.size());
        for (const auto& want : expected) {
            CAPTURE(want.line);
            CAPTURE(want.text);
            const bool found = std::any_of(errors.begin(), errors.end(), [&](const auto& e) {
                const std::string text = e.path.empty() ? e.message : e.path + ": " + e.message;
                return e.line == want.line && e.column > 0 && e.file == file.string() &&
                       text.find(want.text) != std::string::npos;
            });
            CHECK(found);
        }
    }
}

TEST_CASE("all errors are reported at once, in file order") {
    const auto file = data_path("bad/many_errors.yaml");
    const auto errors = errors_of([&] { return cfg::load_file(file); });
    REQUIRE(errors.size() == 5);
    for (std::size_t i = 1; i < errors.size(); ++i) {
        CHECK(errors[i - 1].line <= errors[i].line);
    }
    CHECK(errors[0].to_string() ==
          file +
              ":7:1: listn: unknown key 'listn'; allowed keys: listen, tls, http2, admin, workers, "
              "limits, upstreams, store, defaults, routes, egress, access_log, log, "
              "trusted_proxies");
    try {
        cfg::load_file(file);
        FAIL("expected config_errors");
    } catch (const cfg::config_errors& e) {
        const std::string what = e.what();
        CHECK(what.find("5 configuration errors") == 0);
        CHECK(what.find(file + ":17:") != std::string::npos);
    }
}

TEST_CASE("a missing file is one error naming the file") {
    const auto errors = errors_of([] { return cfg::load_file("/nonexistent/onceproxy.yaml"); });
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].file == "/nonexistent/onceproxy.yaml");
    CHECK(errors[0].message.find("cannot open the file") != std::string::npos);
    CHECK(errors[0].to_string().find("/nonexistent/onceproxy.yaml: cannot open") == 0);
}

TEST_CASE("empty and multi-document files are rejected") {
    CHECK(errors_of_text("").size() == 1);
    CHECK(errors_of_text("# only a comment\n").size() == 1);
    const auto errors =
        errors_of_text(std::string{minimal_upstream} +
                       "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n"
                       "---\n"
                       "listen: 1.2.3.4:5\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].message.find("single YAML document") != std::string::npos);
    CHECK(errors[0].line == 4);
}

// Found by the config fuzz target: yaml-cpp 0.7's LoadAll never returns on a stray ',' at the
// top level (endless empty documents), so `--check-config` hung on a 2-byte file.
TEST_CASE("a stray top-level ',' is a syntax error, not a hang") {
    for (const char* text : {",\n", ",isten: nope\nroutes: [ {name: 1} ]\n", "a: 1\n,\n"}) {
        CAPTURE(text);
        const auto errors = errors_of_text(text);
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].message.find("YAML syntax error") != std::string::npos);
    }
}

TEST_CASE("${VAR} substitution from the environment") {
    const std::string routes = "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n";
    ::setenv("ONCEPROXY_TEST_PORT", "4000", 1);
    ::setenv("ONCEPROXY_TEST_TTL", "90s", 1);
    ::setenv("ONCEPROXY_TEST_TRICKY", "a: b # c", 1);

    SUBCASE("in strings, durations and partial values") {
        const auto c = cfg::load_string(
            "upstreams: { app: { url: \"http://127.0.0.1:${ONCEPROXY_TEST_PORT}\" } }\n"
            "defaults: { ttl: \"${ONCEPROXY_TEST_TTL}\" }\n"
            "store: { redis: { tls_ca_file: \"${ONCEPROXY_TEST_TRICKY}\" } }\n" +
                routes,
            "env.yaml");
        CHECK(c->upstreams[0].port == 4000);
        CHECK(c->routes[0].idempotency.ttl == 90s);
        // The value is substituted after parsing: YAML syntax in it stays text.
        CHECK(c->store.redis.tls_ca_file == "a: b # c");
    }
    SUBCASE("$${ is a literal ${ and a lone $ stays") {
        const auto c =
            cfg::load_string(std::string{minimal_upstream} +
                                 "store: { redis: { tls_ca_file: \"$${X}$a$\" } }\n" + routes,
                             "env.yaml");
        CHECK(c->store.redis.tls_ca_file == "${X}$a$");
    }
    SUBCASE("an unset variable or a malformed reference is an error on its line") {
        ::unsetenv("ONCEPROXY_TEST_UNSET");
        const auto errors = errors_of_text(std::string{minimal_upstream} +
                                           "defaults:\n"
                                           "  ttl: ${ONCEPROXY_TEST_UNSET}\n"
                                           "  lease: ${1BAD}\n"
                                           "  wait_timeout: ${OPEN\n" +
                                           routes);
        REQUIRE(errors.size() == 3);
        CHECK(errors[0].line == 3);
        CHECK(errors[0].path == "defaults.ttl");
        CHECK(errors[0].message.find("ONCEPROXY_TEST_UNSET is not set") != std::string::npos);
        CHECK(errors[1].line == 4);
        CHECK(errors[1].message.find("invalid variable reference") != std::string::npos);
        CHECK(errors[2].line == 5);
        CHECK(errors[2].message.find("unterminated") != std::string::npos);
    }
    ::unsetenv("ONCEPROXY_TEST_PORT");
    ::unsetenv("ONCEPROXY_TEST_TTL");
    ::unsetenv("ONCEPROXY_TEST_TRICKY");
}

TEST_CASE("lease equal to the upstream timeout is accepted; off routes are not checked") {
    const std::string up = "upstreams: { app: { url: \"http://h\", timeout: 30s } }\n";
    CHECK(errors_of_text(up + "routes: [{ name: a, match: { prefix: / }, upstream: app,\n"
                              "  idempotency: { mode: required, lease: 30s } }]\n")
              .empty());
    CHECK(errors_of_text(up + "routes: [{ name: a, match: { prefix: / }, upstream: app,\n"
                              "  idempotency: { mode: off, lease: 1s } }]\n")
              .empty());
    // Inherited from defaults: the defaults' lease is blamed.
    const auto errors =
        errors_of_text(up + "defaults: { lease: 10s }\n"
                            "routes: [{ name: a, match: { prefix: / }, upstream: app,\n"
                            "  idempotency: { mode: optional } }]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 2);
    CHECK(errors[0].path == "defaults.lease");
    // A route without an idempotency block of its own blames the defaults too.
    const auto inherited =
        errors_of_text(up + "defaults:\n  mode: required\n  lease: 10s\n"
                            "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n");
    REQUIRE(inherited.size() == 1);
    CHECK(inherited[0].line == 4);
    CHECK(inherited[0].column == 10);
    CHECK(inherited[0].path == "defaults.lease");
}

TEST_CASE("principal client_cert needs tls.client_ca_file (else every principal is empty)") {
    const std::string up = std::string{minimal_upstream};
    auto errors = errors_of_text(up + "routes:\n"
                                      "  - name: pay\n"
                                      "    match: { prefix: / }\n"
                                      "    upstream: app\n"
                                      "    idempotency: { mode: required,\n"
                                      "                   scope: { principal: client_cert } }\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 7);
    CHECK(errors[0].path == "routes[0].idempotency.scope.principal");
    CHECK(errors[0].message.find("needs tls.client_ca_file") != std::string::npos);
    // From defaults: one error at the defaults, not one per route; a route with idempotency off
    // and one that scopes by headers are not concerned.
    errors = errors_of_text(up + "defaults: { mode: required, scope: { principal: client_cert } }\n"
                                 "routes:\n"
                                 "  - { name: a, match: { prefix: /a }, upstream: app }\n"
                                 "  - { name: b, match: { prefix: /b }, upstream: app }\n"
                                 "  - { name: c, match: { prefix: /c }, upstream: app,\n"
                                 "      idempotency: { mode: off } }\n"
                                 "  - { name: d, match: { prefix: /d }, upstream: app,\n"
                                 "      idempotency: { scope: { principal: headers } } }\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 2);
    CHECK(errors[0].path == "defaults.scope.principal");
    CHECK(errors_of_text(up +
                         "routes: [{ name: a, match: { prefix: / }, upstream: app,\n"
                         "  idempotency: { mode: off, scope: { principal: client_cert } } }]\n")
              .empty());
}

TEST_CASE("upstream urls") {
    const auto load_url = [](const std::string& url) {
        return cfg::load_string(
            "upstreams: { app: { url: \"" + url +
                "\" } }\nroutes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
            "u.yaml");
    };
    auto c = load_url("http://[::1]:3000/");
    CHECK(c->upstreams[0].host == "::1");
    CHECK(c->upstreams[0].port == 3000);
    c = load_url("http://[fd00::1]");
    CHECK(c->upstreams[0].host == "fd00::1");
    CHECK(c->upstreams[0].port == 80);
    for (const char* bad : {"ftp://h", "http://", "http://h:0", "http://h:70000", "http://u@h",
                            "http://h/x", "http://h?q", "http://h:abc", "127.0.0.1:3000"}) {
        CAPTURE(bad);
        const auto errors = errors_of([&] { return load_url(bad); });
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].path == "upstreams.app.url");
    }
}

TEST_CASE("https:// upstreams: tls settings, checked where they are written") {
    const auto load = [](const std::string& upstream) {
        return cfg::load_string("upstreams:\n  app:\n" + upstream +
                                    "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
                                "u.yaml");
    };
    auto c = load("    url: https://payments.internal\n");
    REQUIRE(c);
    CHECK(c->upstreams[0].tls);
    CHECK(c->upstreams[0].port == 443);
    CHECK(c->upstreams[0].tls_settings == cfg::upstream_tls_config{});
    CHECK(c->upstreams[0].tls_settings.verify);

    c = load("    url: https://10.0.0.7:8443\n"
             "    tls: { verify: false, server_name: payments.internal }\n");
    REQUIRE(c);
    CHECK_FALSE(c->upstreams[0].tls_settings.verify);
    CHECK(c->upstreams[0].tls_settings.server_name == "payments.internal");
    CHECK(c->upstreams[0].tls_settings.reload_interval == std::chrono::seconds(5)); // default

    c = load("    url: https://10.0.0.7:8443\n"
             "    tls: { reload_interval: 250ms }\n");
    REQUIRE(c);
    CHECK(c->upstreams[0].tls_settings.reload_interval == std::chrono::milliseconds(250));
    c = load("    url: https://10.0.0.7:8443\n"
             "    tls: { reload_interval: 0 }\n");
    REQUIRE(c);
    CHECK(c->upstreams[0].tls_settings.reload_interval.count() == 0); // SIGHUP only

    struct bad_case {
        std::string upstream;
        std::string path;
        int line;
        std::string message;
    };
    for (const auto& bad : std::vector<bad_case>{
             {"    url: http://h\n    tls: { verify: true }\n", "upstreams.app.tls", 4,
              "tls settings on upstream 'app' with the http:// url"},
             {"    url: https://h\n    tls: { ca_file: /nonexistent/ca.pem }\n",
              "upstreams.app.tls.ca_file", 4, "cannot read '/nonexistent/ca.pem'"},
             {"    url: https://h\n    tls: { client_key_file: k.pem }\n",
              "upstreams.app.tls.client_key_file", 4, "client_cert_file and client_key_file go"},
             {"    url: https://h\n    tls: { server_name: \"a b\" }\n",
              "upstreams.app.tls.server_name", 4, "invalid server_name 'a b'"},
             {"    url: https://h\n    tls: { verify: maybe }\n", "upstreams.app.tls.verify", 4,
              ""},
             {"    url: https://h\n    tls: { cafile: x }\n", "upstreams.app.tls.cafile", 4, ""},
             {"    url: https://h\n    tls: { reload_interval: soon }\n",
              "upstreams.app.tls.reload_interval", 4, ""},
         }) {
        CAPTURE(bad.upstream);
        const auto errors = errors_of([&] { return load(bad.upstream); });
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].path == bad.path);
        CHECK(errors[0].line == bad.line);
        CHECK(errors[0].message.find(bad.message) != std::string::npos);
    }

    // The readiness check of an https:// upstream may GET a path (over the upstream's TLS).
    const auto readiness = cfg::load_string("admin:\n"
                                            "  listen: 127.0.0.1:9901\n"
                                            "  readiness:\n"
                                            "    upstream: { name: app, http_path: /healthz }\n"
                                            "upstreams: { app: { url: \"https://h\" } }\n"
                                            "routes: [{ name: a, match: { prefix: / }, "
                                            "upstream: app }]\n",
                                            "r.yaml");
    REQUIRE(readiness->admin.readiness.upstream);
    CHECK(readiness->admin.readiness.upstream->http_path == "/healthz");
}

TEST_CASE("route names are restricted") {
    const auto errors =
        errors_of_text(std::string{minimal_upstream} +
                       "routes: [{ name: \"a b\", match: { prefix: / }, upstream: app }]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].message.find("invalid route name") != std::string::npos);
}

TEST_CASE("store.memory.max_bytes_per_holder: max_bytes / 16 unless set, never above it") {
    const auto load_memory = [](const std::string& block) {
        return cfg::load_string(std::string{minimal_upstream} + "store:\n  memory:\n" + block +
                                    "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
                                "memory.yaml");
    };
    CHECK(cfg::load_string(std::string{minimal_upstream} +
                               "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
                           "memory.yaml")
              ->store.memory.max_bytes_per_holder == 16U * 1024 * 1024);
    CHECK(load_memory("    max_bytes: 1MiB\n")->store.memory.max_bytes_per_holder == 64U * 1024);
    CHECK(load_memory("    max_bytes: 1MiB\n    max_bytes_per_holder: 1MiB\n")
              ->store.memory.max_bytes_per_holder == 1024U * 1024);

    const auto errors = errors_of(
        [&] { return load_memory("    max_bytes: 1MiB\n    max_bytes_per_holder: 2MiB\n"); });
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "store.memory.max_bytes_per_holder");
    CHECK(errors[0].line == 5);
    CHECK(errors[0].column > 0);
    CHECK(errors[0].message.find("must not exceed max_bytes") != std::string::npos);
    CHECK(errors_of([&] { return load_memory("    max_bytes_per_holder: 0\n"); }).size() == 1);
}

TEST_CASE("store.redis.key_prefix: visible text without braces, 1 to 64 bytes") {
    const auto load_prefix = [](const std::string& value) {
        return cfg::load_string(
            std::string{minimal_upstream} + "store:\n  redis:\n    key_prefix: " + value +
                "\nroutes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
            "prefix.yaml");
    };
    CHECK(cfg::load_string(std::string{minimal_upstream} +
                               "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
                           "prefix.yaml")
              ->store.redis.key_prefix == "onceproxy:");
    CHECK(load_prefix("\"billing:prod:\"")->store.redis.key_prefix == "billing:prod:");
    CHECK(load_prefix(std::string(64, 'k'))->store.redis.key_prefix == std::string(64, 'k'));

    const std::vector<std::pair<std::string, std::string>> refused{
        {"\"\"", "is empty"},
        {std::string(65, 'k'), "65 bytes; at most 64"},
        {"\"a b\"", "whitespace or a control character"},
        {"\"a\\tb\"", "whitespace or a control character"},
        {"\"a\\nb\"", "whitespace or a control character"},
        {"\"a\\x7fb\"", "whitespace or a control character"},
        {"\"a{tag}:\"", "reserved for Redis Cluster hash tags"},
        {"\"a}\"", "reserved for Redis Cluster hash tags"},
        {"[a]", "expected a string"},
    };
    for (const auto& [value, message] : refused) {
        CAPTURE(value);
        const auto errors = errors_of([&] { return load_prefix(value); });
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].file == "prefix.yaml");
        CHECK(errors[0].path == "store.redis.key_prefix");
        CHECK(errors[0].line == 4);
        CHECK(errors[0].column == 17);
        CHECK(errors[0].message.find(message) != std::string::npos);
    }
}

TEST_CASE("per-route limits: defaults from limits:, own sizes, none on plain routes only") {
    const auto c =
        cfg::load_string(std::string{minimal_upstream} +
                             "limits: { max_request_bytes: 2MiB, max_response_bytes: 8MiB }\n"
                             "routes:\n"
                             "  - name: uploads\n"
                             "    match: { prefix: /uploads }\n"
                             "    upstream: app\n"
                             "    limits: { max_request_bytes: none, max_response_bytes: 1GiB }\n"
                             "  - name: rest\n"
                             "    match: { prefix: / }\n"
                             "    upstream: app\n",
                         "limits.yaml");
    REQUIRE(c->routes.size() == 2);
    CHECK_FALSE(c->routes[0].limits.max_request_bytes.has_value());
    CHECK(c->routes[0].limits.max_response_bytes == std::size_t{1} << 30);
    CHECK(c->routes[1].limits.max_request_bytes == std::size_t{2} << 20);
    CHECK(c->routes[1].limits.max_response_bytes == std::size_t{8} << 20);

    const auto errors =
        errors_of_text(std::string{minimal_upstream} + "routes:\n"
                                                       "  - name: pay\n"
                                                       "    match: { prefix: /pay }\n"
                                                       "    upstream: app\n"
                                                       "    limits: { max_request_bytes: none }\n"
                                                       "    idempotency: { mode: required }\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 6);
    CHECK(errors[0].message.find("only allowed on a route without idempotency") !=
          std::string::npos);
    CHECK(errors_of_text(std::string{minimal_upstream} +
                         "routes: [{ name: a, match: { prefix: / }, upstream: app, "
                         "limits: { max_request_bytes: lots } }]\n")
              .size() == 1);
}

TEST_CASE("limits.max_buffered_bytes and max_body_time: read, and a budget no body fits refused") {
    const std::string plain_route = "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n";
    const cfg::config builtin;
    CHECK(builtin.limits.max_buffered_bytes == 64U * 1024 * 1024);
    CHECK(builtin.limits.max_body_time == 60s);
    const auto c = cfg::load_string(
        std::string{minimal_upstream} +
            "limits: { max_buffered_bytes: 8MiB, max_body_time: 5s }\n" + plain_route,
        "limits.yaml");
    CHECK(c->limits.max_buffered_bytes == std::size_t{8} << 20);
    CHECK(c->limits.max_body_time == 5s);

    auto errors = errors_of_text(std::string{minimal_upstream} +
                                 "limits:\n"
                                 "  max_request_bytes: 2MiB\n"
                                 "  max_buffered_bytes: 1MiB\n" +
                                 plain_route);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 4);
    CHECK(errors[0].column == 23);
    CHECK(errors[0].message.find("expected at least max_request_bytes") != std::string::npos);

    // A guarded route may not allow a body the budget can never hold; a plain one streams.
    errors =
        errors_of_text(std::string{minimal_upstream} + "limits: { max_buffered_bytes: 1MiB }\n"
                                                       "routes:\n"
                                                       "  - name: pay\n"
                                                       "    match: { prefix: /pay }\n"
                                                       "    upstream: app\n"
                                                       "    limits: { max_request_bytes: 2MiB }\n"
                                                       "    idempotency: { mode: required }\n"
                                                       "  - name: uploads\n"
                                                       "    match: { prefix: /up }\n"
                                                       "    upstream: app\n"
                                                       "    limits: { max_request_bytes: 2MiB }\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 7);
    CHECK(errors[0].message.find("above limits.max_buffered_bytes") != std::string::npos);
    CHECK(errors_of_text(std::string{minimal_upstream} + "limits: { max_body_time: 0s }\n" +
                         plain_route)
              .size() == 1);
}

// What this binary cannot serve is a config error, with its place: --check-config, a start and a
// reload all refuse it the same way.
TEST_CASE("an unreadable inbound TLS file is refused with file:line:column") {
    const auto errors = errors_of([] {
        return cfg::load_string("tls: { cert_file: /nonexistent/c.pem, key_file: k.pem }\n"
                                "upstreams:\n"
                                "  app: { url: \"http://127.0.0.1:3000\" }\n"
                                "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
                                "t.yaml");
    });
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 1);
    CHECK(errors[0].column == 19);
    CHECK(errors[0].path == "tls.cert_file");
    CHECK(errors[0].message == "cannot read cert_file '/nonexistent/c.pem'");
}

TEST_CASE("admin.keys_api: off by default; enabled reads its token file, one line break dropped") {
    const std::string one_route = "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n";
    CHECK_FALSE(cfg::config{}.admin.keys_api.enabled);
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("onceproxy-keys-api-" + std::to_string(::getpid())))
                                .string();
    std::filesystem::create_directories(dir);
    const std::string token = dir + "/token";
    const std::string value = "t0ken-0123456789abcdef0123456789"; // 32 bytes
    { std::ofstream(token) << value << "\n"; }
    const auto c = cfg::load_string(
        std::string{minimal_upstream} +
            "admin:\n  keys_api: { enabled: true, token_file: " + token + " }\n" + one_route,
        "inline.yaml");
    CHECK(c->admin.keys_api.enabled);
    CHECK(c->admin.keys_api.token == value);
    CHECK(c->admin.keys_api.token_file == token);

    // Shorter than 32 bytes: a config error at the token_file.
    const std::string short_token = dir + "/short";
    { std::ofstream(short_token) << "t0ken\n"; }
    const auto too_short = errors_of_text(
        std::string{minimal_upstream} +
        "admin:\n  keys_api: { enabled: true, token_file: " + short_token + " }\n" + one_route);
    REQUIRE(too_short.size() == 1);
    CHECK(too_short[0].line == 3);
    CHECK(too_short[0].path == "admin.keys_api.token_file");
    CHECK(too_short[0].message.find("has 5 bytes; expected at least 32") != std::string::npos);

    const auto no_file = errors_of_text(std::string{minimal_upstream} +
                                        "admin:\n  keys_api: { enabled: true }\n" + one_route);
    REQUIRE(no_file.size() == 1);
    CHECK(no_file[0].line == 3);
    CHECK(no_file[0].message.find("no token_file") != std::string::npos);
    const auto unreadable = errors_of_text(
        std::string{minimal_upstream} + "admin:\n  keys_api: { enabled: true, token_file: " + dir +
        "/none }\n" + one_route);
    REQUIRE(unreadable.size() == 1);
    CHECK(unreadable[0].message.find("cannot read token_file") != std::string::npos);
    // Disabled, the file is not read.
    CHECK(errors_of_text(std::string{minimal_upstream} +
                         "admin:\n  keys_api: { enabled: false, token_file: " + dir + "/none }\n" +
                         one_route)
              .empty());
    std::filesystem::remove_all(dir);
}

TEST_CASE("admin: max_connections, header_timeout and idle_timeout, checked") {
    const std::string one_route = "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n";
    const auto c = cfg::load_string(std::string{minimal_upstream} +
                                        "admin:\n  listen: 127.0.0.1:0\n  max_connections: 4\n"
                                        "  header_timeout: 2s\n  idle_timeout: 9s\n" +
                                        one_route,
                                    "inline.yaml");
    CHECK(c->admin.max_connections == 4);
    CHECK(c->admin.header_timeout == std::chrono::seconds(2));
    CHECK(c->admin.idle_timeout == std::chrono::seconds(9));
    const auto bad = errors_of_text(std::string{minimal_upstream} +
                                    "admin:\n  max_connections: 0\n  header_timeout: 0s\n"
                                    "  idle_timeout: soon\n" +
                                    one_route);
    REQUIRE(bad.size() == 3);
    CHECK(bad[0].path == "admin.max_connections");
    CHECK(bad[0].line == 3);
    CHECK(bad[1].path == "admin.header_timeout");
    CHECK(bad[2].path == "admin.idle_timeout");
}

TEST_CASE("store.redis.cluster: seed nodes instead of url, checked with file:line:column") {
    const auto load_cluster = [](const std::string& block) {
        return cfg::load_string(std::string{minimal_upstream} +
                                    "store:\n  type: redis\n  redis:\n" + block +
                                    "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
                                "cluster.yaml");
    };
    auto c = load_cluster("    cluster:\n      nodes: [\"10.0.0.5:7000\", \"[::1]:7001\", "
                          "\"redis-0.redis:6379\"]\n      tls: true\n");
    REQUIRE(c->store.redis.cluster.nodes.size() == 3);
    CHECK(c->store.redis.cluster.nodes[1] == "[::1]:7001");
    CHECK(c->store.redis.cluster.tls);
    CHECK(load_cluster("    key_prefix: \"x:\"\n")->store.redis.cluster.nodes.empty());

    const std::vector<std::tuple<std::string, std::string, std::string, int>> refused{
        {"    url: \"redis://a:1\"\n    cluster: { nodes: [\"a:1\"] }\n", "store.redis.cluster",
         "either url", 6},
        {"    cluster: { tls: true }\n", "store.redis.cluster.nodes", "missing required key", 5},
        {"    cluster: { nodes: [] }\n", "store.redis.cluster.nodes", "at least one node", 5},
        {"    cluster: { nodes: [\"a:1\", \"b\"] }\n", "store.redis.cluster.nodes[1]",
         "expected host:port", 5},
        {"    cluster: { nodes: [\"::1:7000\"] }\n", "store.redis.cluster.nodes[0]", "brackets", 5},
        {"    cluster: { nodes: [\"a:0\"] }\n", "store.redis.cluster.nodes[0]", "1..65535", 5},
        {"    cluster: { nodes: [\":7000\"] }\n", "store.redis.cluster.nodes[0]", "missing host",
         5},
        {"    cluster: { nodes: [\"a:1\"], replicas: 1 }\n", "store.redis.cluster.replicas", "", 5},
    };
    for (const auto& [block, path, message, line] : refused) {
        CAPTURE(block);
        const auto errors = errors_of([&] { return load_cluster(block); });
        REQUIRE_MESSAGE(errors.size() == 1, describe(errors));
        CHECK(errors[0].file == "cluster.yaml");
        CHECK(errors[0].path == path);
        CHECK(errors[0].line == line);
        CHECK(errors[0].message.find(message) != std::string::npos);
    }
}

TEST_CASE("upstreams.*.max_tunnels: read, 256 by default, 0 allowed, bad values located") {
    CHECK(cfg::upstream_config{}.max_tunnels == 256);
    const auto c = cfg::load_string(
        "upstreams:\n"
        "  app: { url: \"http://127.0.0.1:3000\", max_connections: 4, max_tunnels: 8 }\n"
        "  ws: { url: \"http://127.0.0.1:3001\", max_tunnels: 0 }\n"
        "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n",
        "inline.yaml");
    CHECK(c->upstreams[0].max_connections == 4);
    CHECK(c->upstreams[0].max_tunnels == 8);
    CHECK(c->upstreams[1].max_tunnels == 0);

    const auto errors =
        errors_of_text("upstreams:\n"
                       "  app: { url: \"http://127.0.0.1:3000\", max_tunnels: many }\n"
                       "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n");
    REQUIRE(errors.size() == 1);
    INFO(describe(errors));
    CHECK(errors[0].line == 2);
    CHECK(errors[0].column > 1);
    CHECK(errors[0].path.find("max_tunnels") != std::string::npos);
}

TEST_CASE("routes[].limits.max_tunnels: unset by default, read when set") {
    const auto c = cfg::load_string(std::string{minimal_upstream} +
                                        "routes:\n"
                                        "  - name: chat\n"
                                        "    match: { prefix: /chat/ }\n"
                                        "    upstream: app\n"
                                        "    limits: { max_tunnels: 2 }\n"
                                        "  - { name: rest, match: { prefix: / }, upstream: app }\n",
                                    "inline.yaml");
    CHECK(c->routes[0].limits.max_tunnels == std::optional<std::size_t>(2));
    CHECK_FALSE(c->routes[1].limits.max_tunnels.has_value());
    const auto errors =
        errors_of_text(std::string{minimal_upstream} + "routes:\n"
                                                       "  - name: chat\n"
                                                       "    match: { prefix: /chat/ }\n"
                                                       "    upstream: app\n"
                                                       "    limits: { max_tunnels: -1 }\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 6);
}

TEST_CASE("upstreams.*.late_answer_timeout: three times the timeout by default, 0s turns it "
          "off, and below the timeout it is an error at its key") {
    const std::string routes = "routes: [{ name: a, match: { prefix: / }, upstream: app }]\n";
    const auto with = [&](const std::string& settings) {
        return "upstreams:\n  app: { url: \"http://h\", timeout: 2s" + settings + " }\n" + routes;
    };
    CHECK(cfg::load_string(with(""), "t.yaml")->upstreams[0].late_answer_timeout == 6s);
    CHECK(cfg::load_string(with(", late_answer_timeout: 0s"), "t.yaml")
              ->upstreams[0]
              .late_answer_timeout == 0s);
    CHECK(cfg::load_string(with(", late_answer_timeout: 10s"), "t.yaml")
              ->upstreams[0]
              .late_answer_timeout == 10s);
    const auto errors = errors_of_text(with(", late_answer_timeout: 1s"));
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 2);
    CHECK(errors[0].path == "upstreams.app.late_answer_timeout");
    CHECK(errors[0].message.find("shorter than the timeout 2s") != std::string::npos);
}
