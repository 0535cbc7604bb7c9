#include "onceproxy/metrics/family.hpp"

#include "onceproxy/metrics/registry.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

using namespace onceproxy::metrics;

namespace {

/// A registry in which every family is rendered: a route, a store that follows a master,
/// workers, inbound TLS, a request with its store round trips, an egress route and its
/// upstream.
std::string render_everything() {
    registry reg({"payments"});
    reg.series_named(scope::egress_route, "payments");
    reg.series_named(scope::upstream, "provider");
    reg.route(0).counter(family::requests, outcome::stored).inc();
    reg.route(0).counter(family::store_round_trips, outcome::stored).add(2);
    reg.store_follows_master = true;
    reg.set_workers(2);
    reg.gauge(family::tls_certificate_expiry).set(1700000000);
    reg.set_config("0123456789abcdef", 1700000000);
    return reg.render();
}

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

/// Whether `text` names `metric` as a whole word (onceproxy_buffered_bytes is not named by
/// onceproxy_buffered_bytes_limit).
bool names(const std::string& text, std::string_view metric) {
    for (auto at = text.find(metric); at != std::string::npos; at = text.find(metric, at + 1)) {
        const auto end = at + metric.size();
        const char next = end < text.size() ? text[end] : ' ';
        const bool word =
            (next >= 'a' && next <= 'z') || (next >= '0' && next <= '9') || next == '_';
        if (!word) {
            return true;
        }
    }
    return false;
}

constexpr std::string_view type_name(kind k) {
    switch (k) {
    case kind::counter:
        return "counter";
    case kind::gauge:
        return "gauge";
    case kind::histogram:
        return "histogram";
    }
    return "";
}

} // namespace

TEST_CASE("families: each name is declared once") {
    std::set<std::string_view> seen;
    for (const auto& f : family_table) {
        CAPTURE(f.name);
        CHECK(seen.insert(f.name).second);
    }
}

TEST_CASE("families: every family of the table is rendered, with its type, help and series") {
    const auto text = render_everything();
    for (const auto& f : family_table) {
        CAPTURE(f.name);
        const std::string name(f.name);
        CHECK(text.find("# TYPE " + name + " " + std::string(type_name(f.type)) + "\n") !=
              std::string::npos);
        CHECK((text.find("# HELP " + name + " ") != std::string::npos) == !f.help.empty());
        const std::string series = f.type == kind::histogram ? name + "_bucket" : name;
        CHECK(text.find("\n" + series + (f.label.empty() && f.per == scope::process ? " " : "{")) !=
              std::string::npos);
        if (!f.label.empty()) {
            const std::string first = f.per == scope::upstream  ? "upstream=\"provider\","
                                      : f.per == scope::process ? ""
                                                                : "route=\"payments\",";
            CHECK(text.find("\n" + name + "{" + first + std::string(f.label) + "=\"") !=
                  std::string::npos);
        }
    }
}

TEST_CASE("families: every family is documented in docs/operations.md") {
    const auto doc = read_file(ONCEPROXY_SOURCE_DIR "/docs/operations.md");
    REQUIRE(!doc.empty());
    for (const auto& f : family_table) {
        CAPTURE(f.name);
        CHECK(names(doc, f.name));
    }
}
