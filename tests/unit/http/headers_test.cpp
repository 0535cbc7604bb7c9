#include "onceproxy/http/headers.hpp"

#include "onceproxy/config/cidr.hpp"

#include <doctest/doctest.h>

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/string_body.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

using namespace onceproxy::http;
namespace bhttp = boost::beast::http;

namespace {

/// "name: value" of every line, in order.
std::vector<std::string> lines(const fields& f) {
    std::vector<std::string> out;
    for (const auto& field : f) {
        out.push_back(std::string(field.name_string()) + ": " + std::string(field.value()));
    }
    return out;
}

fields make(const std::vector<std::pair<std::string, std::string>>& in) {
    fields f;
    for (const auto& [n, v] : in) {
        f.insert(n, v);
    }
    return f;
}

} // namespace

TEST_SUITE("headers") {

    TEST_CASE("strip_hop_by_hop removes the fixed hop-by-hop set and keeps end-to-end headers") {
        auto f = make({{"Host", "example.test"},
                       {"Keep-Alive", "timeout=5"},
                       {"TE", "trailers"},
                       {"Trailer", "X-Sum"},
                       {"Transfer-Encoding", "chunked"},
                       {"Upgrade", "websocket"},
                       {"Proxy-Authorization", "Basic eA=="},
                       {"Proxy-Connection", "keep-alive"},
                       {"proxy-whatever", "1"},
                       {"Authorization", "Bearer t"},
                       {"Content-Length", "12"},
                       {"Idempotency-Key", "abc"}});
        strip_hop_by_hop(f);
        CHECK(lines(f) == std::vector<std::string>{"Host: example.test", "Authorization: Bearer t",
                                                   "Content-Length: 12", "Idempotency-Key: abc"});
    }

    TEST_CASE("strip_hop_by_hop removes Connection and every header it names") {
        SUBCASE("one Connection line with a list, names in another case") {
            auto f = make({{"Connection", "keep-alive, X-Secret ,  x-other"},
                           {"x-secret", "1"},
                           {"X-OTHER", "2"},
                           {"X-Secret", "3"},
                           {"X-Kept", "4"}});
            strip_hop_by_hop(f);
            CHECK(lines(f) == std::vector<std::string>{"X-Kept: 4"});
        }
        SUBCASE("several Connection lines") {
            auto f = make({{"Connection", "X-A"},
                           {"X-A", "1"},
                           {"X-B", "2"},
                           {"connection", "X-B"},
                           {"X-C", "3"}});
            strip_hop_by_hop(f);
            CHECK(lines(f) == std::vector<std::string>{"X-C: 3"});
        }
        SUBCASE("Connection naming a header that is absent changes nothing else") {
            auto f = make({{"Connection", "close, X-Missing"}, {"Accept", "*/*"}});
            strip_hop_by_hop(f);
            CHECK(lines(f) == std::vector<std::string>{"Accept: */*"});
        }
        SUBCASE("an empty Connection list") {
            auto f = make({{"Connection", ""}, {"Accept", "*/*"}});
            strip_hop_by_hop(f);
            CHECK(lines(f) == std::vector<std::string>{"Accept: */*"});
        }
    }

    TEST_CASE("strip_hop_by_hop keeps a nominated field that is in `keep`") {
        const std::vector<std::string_view> keep{"Idempotency-Key", "Authorization"};
        SUBCASE("the key and the principal survive, other nominated fields go") {
            auto f = make({{"Connection", "idempotency-key, AUTHORIZATION, X-Drop"},
                           {"Idempotency-Key", "k1"},
                           {"Authorization", "Bearer a"},
                           {"X-Drop", "1"},
                           {"X-Kept", "2"}});
            strip_hop_by_hop(f, keep);
            CHECK(lines(f) == std::vector<std::string>{"Idempotency-Key: k1",
                                                       "Authorization: Bearer a", "X-Kept: 2"});
        }
        SUBCASE("without `keep` (responses) a nominated field still goes") {
            auto f = make({{"Connection", "Authorization"}, {"Authorization", "Bearer a"}});
            strip_hop_by_hop(f);
            CHECK(lines(f).empty());
        }
        SUBCASE("`keep` does not save a field that is hop-by-hop in its own right") {
            const std::vector<std::string_view> hop{"Upgrade", "Proxy-Authorization", "TE"};
            auto f = make({{"Connection", "Upgrade, Proxy-Authorization, TE"},
                           {"Upgrade", "websocket"},
                           {"Proxy-Authorization", "Basic eA=="},
                           {"TE", "trailers"},
                           {"Accept", "*/*"}});
            strip_hop_by_hop(f, hop);
            CHECK(lines(f) == std::vector<std::string>{"Accept: */*"});
        }
    }

    TEST_CASE("request_fields_in_use: the fixed set plus the route's key, scope and fingerprint") {
        SUBCASE("built-in idempotency settings") {
            const onceproxy::config::idempotency_config idem;
            const auto in_use = request_fields_in_use(idem);
            for (const auto* name : {"Host", "Content-Length", "Content-Type", "Authorization",
                                     "Cookie", "Idempotency-Key"}) {
                INFO(name);
                CHECK(std::find(in_use.begin(), in_use.end(), std::string_view(name)) !=
                      in_use.end());
            }
        }
        SUBCASE("a route with its own key, scope and fingerprint headers keeps them all") {
            onceproxy::config::idempotency_config idem;
            idem.key.header = "X-Request-Key";
            idem.scope_headers = {"X-Tenant"};
            idem.fingerprint_headers = {"X-Signature"};
            auto f = make({{"Connection", "keep-alive, Host, Content-Type, Content-Length, Cookie, "
                                          "Authorization, x-request-key, X-Tenant, X-Signature, "
                                          "X-Other"},
                           {"Host", "h"},
                           {"Content-Type", "application/json"},
                           {"Content-Length", "2"},
                           {"Cookie", "s=1"},
                           {"Authorization", "Bearer a"},
                           {"X-Request-Key", "k"},
                           {"X-Tenant", "t"},
                           {"X-Signature", "sig"},
                           {"X-Other", "o"}});
            strip_hop_by_hop(f, request_fields_in_use(idem));
            CHECK(lines(f) == std::vector<std::string>{
                                  "Host: h", "Content-Type: application/json", "Content-Length: 2",
                                  "Cookie: s=1", "Authorization: Bearer a", "X-Request-Key: k",
                                  "X-Tenant: t", "X-Signature: sig"});
        }
    }

    TEST_CASE("strip_hop_by_hop works on responses too") {
        bhttp::response<bhttp::string_body> res{bhttp::status::ok, 11};
        res.set(bhttp::field::connection, "close");
        res.set(bhttp::field::transfer_encoding, "chunked");
        res.set(bhttp::field::content_type, "text/plain");
        strip_hop_by_hop(res);
        CHECK(lines(res) == std::vector<std::string>{"Content-Type: text/plain"});
    }

    TEST_CASE("add_forwarded from an untrusted peer replaces every forwarding header") {
        SUBCASE("nothing yet: this hop's values") {
            auto f = make({{"Host", "shop.example"}});
            add_forwarded(f, "10.1.2.3", "http");
            CHECK(f["X-Forwarded-For"] == "10.1.2.3");
            CHECK(f["X-Forwarded-Proto"] == "http");
            CHECK(f["X-Forwarded-Host"] == "shop.example");
            CHECK(f["Forwarded"] == "for=10.1.2.3;host=shop.example;proto=http");
        }
        SUBCASE("a forged chain is dropped, not extended") {
            auto f = make({{"Host", "shop.example"},
                           {"X-Forwarded-For", "203.0.113.7, 198.51.100.2"},
                           {"X-Forwarded-For", "192.0.2.1"},
                           {"X-Forwarded-Proto", "ftp"},
                           {"X-Forwarded-Host", "evil.example"},
                           {"Forwarded", "for=203.0.113.7;proto=https"}});
            add_forwarded(f, "::1", "https");
            CHECK(f["X-Forwarded-For"] == "::1");
            CHECK(f["X-Forwarded-Proto"] == "https");
            CHECK(f["X-Forwarded-Host"] == "shop.example");
            CHECK(f["Forwarded"] == "for=\"[::1]\";host=shop.example;proto=https");
            CHECK(count_lines(f, "x-forwarded-for") == 1);
            CHECK(count_lines(f, "x-forwarded-proto") == 1);
            CHECK(count_lines(f, "x-forwarded-host") == 1);
            CHECK(count_lines(f, "forwarded") == 1);
        }
        SUBCASE("an untrusted peer outside the trusted blocks is treated the same") {
            const std::vector<onceproxy::config::cidr> trusted{
                *onceproxy::config::parse_cidr("10.0.0.0/8")};
            auto f = make({{"X-Forwarded-For", "6.6.6.6"}, {"Forwarded", "for=6.6.6.6"}});
            add_forwarded(f, "192.168.1.5", "http", trusted);
            CHECK(f["X-Forwarded-For"] == "192.168.1.5");
            CHECK(f["Forwarded"] == "for=192.168.1.5;proto=http");
        }
        SUBCASE("no Host (HTTP/1.0): no X-Forwarded-Host, no host=") {
            auto f = make({{"X-Forwarded-Host", "evil.example"}});
            add_forwarded(f, "10.1.2.3", "http");
            CHECK(count_lines(f, "x-forwarded-host") == 0);
            CHECK(f["Forwarded"] == "for=10.1.2.3;proto=http");
        }
        SUBCASE("a Host with a port is quoted in Forwarded (':' is not a token character)") {
            auto f = make({{"Host", "127.0.0.1:8080"}});
            add_forwarded(f, "127.0.0.1", "http");
            CHECK(f["X-Forwarded-Host"] == "127.0.0.1:8080");
            CHECK(f["Forwarded"] == "for=127.0.0.1;host=\"127.0.0.1:8080\";proto=http");
        }
        SUBCASE("quotes and backslashes in a quoted value are escaped") {
            auto f = make({{"Host", "a\"b\\c d"}});
            add_forwarded(f, "10.1.2.3", "http");
            CHECK(f["Forwarded"] == "for=10.1.2.3;host=\"a\\\"b\\\\c d\";proto=http");
        }
    }

    TEST_CASE("add_forwarded from a trusted proxy extends its chain") {
        const std::vector<onceproxy::config::cidr> trusted{
            *onceproxy::config::parse_cidr("10.0.0.0/8"),
            *onceproxy::config::parse_cidr("fd00::/8")};
        SUBCASE("every X-Forwarded-For line is kept (RFC 9110 §5.3), proto and host too") {
            auto f = make({{"Host", "shop.example"},
                           {"X-Forwarded-For", "203.0.113.7"},
                           {"X-Forwarded-For", "198.51.100.2"},
                           {"X-Forwarded-Proto", "https"},
                           {"X-Forwarded-Host", "www.shop.example"},
                           {"Forwarded", "for=203.0.113.7;proto=https"},
                           {"Forwarded", "for=198.51.100.2"}});
            add_forwarded(f, "10.0.0.1", "http", trusted);
            CHECK(f["X-Forwarded-For"] == "203.0.113.7, 198.51.100.2, 10.0.0.1");
            CHECK(f["X-Forwarded-Proto"] == "https"); // the scheme the client really used
            CHECK(f["X-Forwarded-Host"] == "www.shop.example");
            CHECK(f["Forwarded"] == "for=203.0.113.7;proto=https, for=198.51.100.2, "
                                    "for=10.0.0.1;host=shop.example;proto=http");
            CHECK(count_lines(f, "forwarded") == 1);
        }
        SUBCASE("a trusted proxy that sent nothing: this hop's values") {
            auto f = make({{"Host", "shop.example"}});
            add_forwarded(f, "fd00::7", "https", trusted);
            CHECK(f["X-Forwarded-For"] == "fd00::7");
            CHECK(f["X-Forwarded-Proto"] == "https");
            CHECK(f["X-Forwarded-Host"] == "shop.example");
            CHECK(f["Forwarded"] == "for=\"[fd00::7]\";host=shop.example;proto=https");
        }
        SUBCASE("an IPv4-mapped peer address matches an IPv4 block") {
            auto f = make({{"X-Forwarded-For", "203.0.113.7"}});
            add_forwarded(f, "::ffff:10.2.3.4", "http", trusted);
            CHECK(f["X-Forwarded-For"] == "203.0.113.7, ::ffff:10.2.3.4");
        }
    }

    TEST_CASE("add_forwarded: the forwarding fields it does not set, and a broken chain") {
        const std::vector<onceproxy::config::cidr> trusted{
            *onceproxy::config::parse_cidr("10.0.0.0/8")};
        const auto forged = [] {
            return make({{"Host", "shop.example"},
                         {"X-Real-IP", "6.6.6.6"},
                         {"X-Forwarded-Port", "443"},
                         {"X-Forwarded-Prefix", "/admin"},
                         {"X_Forwarded_For", "6.6.6.6"},
                         {"x_real_ip", "6.6.6.6"},
                         {"X_Forwarded_Host", "evil.example"},
                         {"X-Other_Thing", "kept"}});
        };
        SUBCASE("an untrusted peer: all of them are removed") {
            auto f = forged();
            add_forwarded(f, "192.168.1.5", "http", trusted);
            for (const char* name : {"X-Real-IP", "X-Forwarded-Port", "X-Forwarded-Prefix",
                                     "X_Forwarded_For", "x_real_ip", "X_Forwarded_Host"}) {
                CAPTURE(name);
                CHECK(count_lines(f, name) == 0);
            }
            CHECK(f["X-Other_Thing"] == "kept");
            CHECK(f["X-Forwarded-For"] == "192.168.1.5");
        }
        SUBCASE("a trusted proxy: its X-Real-IP, -Port and -Prefix stay; underscores never do") {
            auto f = forged();
            add_forwarded(f, "10.0.0.1", "http", trusted);
            CHECK(f["X-Real-IP"] == "6.6.6.6");
            CHECK(f["X-Forwarded-Port"] == "443");
            CHECK(f["X-Forwarded-Prefix"] == "/admin");
            CHECK(count_lines(f, "X_Forwarded_For") == 0);
            CHECK(count_lines(f, "x_real_ip") == 0);
            CHECK(count_lines(f, "X_Forwarded_Host") == 0);
        }
        SUBCASE("a trusted proxy's Forwarded with an unclosed quote is replaced, not extended") {
            for (const char* broken : {"for=\"1.2.3.4", "for=\"a\\\"", "for=a\x01"}) {
                CAPTURE(broken);
                auto f = make({{"Host", "shop.example"}, {"Forwarded", broken}});
                add_forwarded(f, "10.0.0.1", "http", trusted);
                CHECK(f["Forwarded"] == "for=10.0.0.1;host=shop.example;proto=http");
            }
            auto f = make({{"Forwarded", "for=\"[2001:db8::1]\";proto=\"a\\\"b\""}});
            add_forwarded(f, "10.0.0.1", "http", trusted);
            CHECK(f["Forwarded"] ==
                  "for=\"[2001:db8::1]\";proto=\"a\\\"b\", for=10.0.0.1;proto=http");
        }
    }

    TEST_CASE("valid_host_value: uri-host [\":\" port] (RFC 9110 §7.2)") {
        for (const char* ok : {"", "shop.example", "shop.example:8080", "127.0.0.1:80", "[::1]",
                               "[::1]:8080", "[2001:db8::1]", "a_b-c~d", "x"}) {
            CAPTURE(ok);
            CHECK(valid_host_value(ok));
        }
        for (const char* bad :
             {"a,b", "a:1:2", "[::1", "::1", "[::1]x", "[::1]:x", "a:b", ":80", "a;b", "a b", "a/b",
              "a@b", "a%41", "[]", "[x]", "a:123456", "a\"b"}) {
            CAPTURE(bad);
            CHECK_FALSE(valid_host_value(bad));
        }
    }

    TEST_CASE("refuse_request_head: a standard method in another case is refused") {
        for (const char* method : {"post", "Post", "get", "pUT", "patch", "propfind"}) {
            CAPTURE(method);
            request_head h;
            h.method_string(method);
            h.target("/pay");
            h.version(11);
            h.set(bhttp::field::host, "x");
            CHECK_FALSE(refuse_request_head(h).empty());
        }
        for (const char* method : {"POST", "GET", "PURGE", "mymethod", "X-Custom"}) {
            CAPTURE(method);
            request_head h;
            h.method_string(method);
            h.target("/pay");
            h.version(11);
            h.set(bhttp::field::host, "x");
            CHECK(refuse_request_head(h).empty());
        }
    }

    TEST_CASE("check_framing accepts the unambiguous shapes") {
        CHECK(check_framing(fields{}) == framing_error::none);
        CHECK(check_framing(make({{"Content-Length", "0"}})) == framing_error::none);
        CHECK(check_framing(make({{"Content-Length", "12345"}})) == framing_error::none);
        CHECK(check_framing(make({{"Content-Length", " 7 "}})) == framing_error::none);
        CHECK(check_framing(make({{"Transfer-Encoding", "chunked"}})) == framing_error::none);
        CHECK(check_framing(make({{"Transfer-Encoding", "Chunked"}})) == framing_error::none);
    }

    TEST_CASE("check_framing refuses request smuggling shapes (RFC 9112 §6.3)") {
        CHECK(check_framing(make({{"Content-Length", "5"}, {"Transfer-Encoding", "chunked"}})) ==
              framing_error::content_length_and_transfer_encoding);
        CHECK(check_framing(make({{"Transfer-Encoding", "chunked"}, {"content-length", "0"}})) ==
              framing_error::content_length_and_transfer_encoding);
        CHECK(check_framing(make({{"Content-Length", "5"}, {"Content-Length", "5"}})) ==
              framing_error::repeated_content_length);
        CHECK(check_framing(make({{"Content-Length", "5, 5"}})) ==
              framing_error::repeated_content_length);
        for (const char* bad : {"", "-1", "+5", "5a", "0x10", "5 5"}) {
            CAPTURE(bad);
            CHECK(check_framing(make({{"Content-Length", bad}})) != framing_error::none);
        }
        CHECK(check_framing(make({{"Transfer-Encoding", "gzip"}})) ==
              framing_error::bad_transfer_encoding);
        CHECK(check_framing(make({{"Transfer-Encoding", "chunked, gzip"}})) ==
              framing_error::bad_transfer_encoding);
        CHECK(check_framing(make({{"Transfer-Encoding", "gzip, chunked"}})) ==
              framing_error::bad_transfer_encoding);
        CHECK(check_framing(
                  make({{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}})) ==
              framing_error::bad_transfer_encoding);
        CHECK(check_framing(make({{"Transfer-Encoding", "identity"}})) ==
              framing_error::bad_transfer_encoding);
    }

    TEST_CASE("count_lines is case-insensitive and counts lines, not list members") {
        const auto f = make({{"Via", "a, b"}, {"via", "c"}, {"VIA", "d"}, {"Other", "x"}});
        CHECK(count_lines(f, "via") == 3);
        CHECK(count_lines(f, "Other") == 1);
        CHECK(count_lines(f, "absent") == 0);
    }

} // TEST_SUITE
