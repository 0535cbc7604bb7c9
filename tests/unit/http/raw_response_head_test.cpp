#include "onceproxy/http/raw_response_head.hpp"

#include "onceproxy/http/headers.hpp"
#include "onceproxy/wire/head_writer.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <doctest/doctest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>

#include <array>
#include <string>
#include <string_view>
#include <vector>

using namespace onceproxy::http;
using onceproxy::wire::raw_header_store;
using onceproxy::wire::response_parser;
namespace bhttp = boost::beast::http;

namespace {

/// Parses the head `wire` into `p` (fields into `raw` when given).
void parse_head(response_parser& p, std::string_view wire, raw_header_store* raw) {
    p.keep_raw_fields(raw);
    boost::system::error_code ec;
    p.put(boost::asio::buffer(wire.data(), wire.size()), ec);
    REQUIRE((!ec || ec == bhttp::error::need_more));
    REQUIRE(p.is_header_done());
}

/// The head the raw path writes for the answer `wire`.
std::string raw_head(std::string_view wire, std::span<const added_field> added = {},
                     unsigned version = 11) {
    raw_header_store raw;
    response_parser p;
    parse_head(p, wire, &raw);
    std::string out = "left over";
    serialize_raw_response_head(version, p.get().result_int(), raw, added, out);
    return out;
}

/// The head the Beast path (strip_hop_by_hop, fields::set, serialize_head) writes.
std::string beast_head(std::string_view wire, std::span<const added_field> added = {},
                       unsigned version = 11) {
    response_parser p;
    parse_head(p, wire, nullptr);
    auto& res = p.get();
    strip_hop_by_hop(res);
    for (const auto& f : added) {
        res.set(f.name, f.value);
    }
    res.version(version);
    std::string out;
    onceproxy::wire::serialize_head(res, out);
    return out;
}

} // namespace

TEST_SUITE("raw_response_head") {

    TEST_CASE("an answer without hop-by-hop fields passes whole, case and all") {
        const auto out = raw_head("HTTP/1.1 200 OK\r\nContent-Type: text/PLAIN\r\n"
                                  "x-lower-case: Value With Spaces\r\nContent-Length: 0\r\n\r\n");
        CHECK(out == "HTTP/1.1 200 OK\r\nContent-Type: text/PLAIN\r\n"
                     "x-lower-case: Value With Spaces\r\nContent-Length: 0\r\n\r\n");
    }

    TEST_CASE("the fixed hop-by-hop set is left out") {
        const auto out =
            raw_head("HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nX-A: 1\r\nTE: trailers\r\n"
                     "Trailer: X-Sum\r\nTransfer-Encoding: chunked\r\nUpgrade: h2c\r\n"
                     "X-B: 2\r\n\r\n");
        CHECK(out == "HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B: 2\r\n\r\n");
    }

    TEST_CASE("Proxy-* fields are left out, whatever their case") {
        const auto out = raw_head("HTTP/1.1 407 Proxy Authentication Required\r\n"
                                  "Proxy-Authenticate: Basic\r\nproxy-x-custom: 1\r\n"
                                  "PROXY-Connection: keep-alive\r\nX-Proxyish: kept\r\n"
                                  "Content-Length: 0\r\n\r\n");
        CHECK(out == "HTTP/1.1 407 Proxy Authentication Required\r\nX-Proxyish: kept\r\n"
                     "Content-Length: 0\r\n\r\n");
    }

    TEST_CASE("Connection and every field it names are left out, on any Connection line") {
        const auto out = raw_head("HTTP/1.1 200 OK\r\nX-Hop: 1\r\nConnection: x-hop, Close\r\n"
                                  "X-Keep: 2\r\nconnection: X-OTHER\r\nx-other: 3\r\n"
                                  "X-Hop: 4\r\nContent-Length: 0\r\n\r\n");
        CHECK(out == "HTTP/1.1 200 OK\r\nX-Keep: 2\r\nContent-Length: 0\r\n\r\n");
    }

    TEST_CASE("duplicate fields keep their order; Set-Cookie lines stay apart") {
        const auto out = raw_head("HTTP/1.1 200 OK\r\nSet-Cookie: a=1; Path=/\r\n"
                                  "Set-Cookie: b=2, c=3\r\nVary: Accept\r\nVary: Origin\r\n"
                                  "Content-Length: 0\r\n\r\n");
        CHECK(out == "HTTP/1.1 200 OK\r\nSet-Cookie: a=1; Path=/\r\nSet-Cookie: b=2, c=3\r\n"
                     "Vary: Accept\r\nVary: Origin\r\nContent-Length: 0\r\n\r\n");
    }

    TEST_CASE("repeated fields apart from each other keep their places") {
        // Beast's `fields` would move the second X-A up next to the first; the order of lines
        // with different names carries no meaning (RFC 9110 §5.3), the wire's is kept.
        const auto out = raw_head("HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B: 2\r\nx-a: 3\r\n\r\n");
        CHECK(out == "HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B: 2\r\nx-a: 3\r\n\r\n");
    }

    TEST_CASE("empty values pass as empty lines") {
        const auto out = raw_head("HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Blank:   \r\n\r\n");
        CHECK(out == "HTTP/1.1 200 OK\r\nX-Empty: \r\nX-Blank: \r\n\r\n");
    }

    TEST_CASE("added fields go last, in order") {
        const std::array<added_field, 3> added{
            {{"Transfer-Encoding", "chunked"}, {"Trailer", "X-Sum"}, {"Connection", "close"}}};
        const auto out = raw_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                                  "Trailer: X-Sum\r\nX-A: 1\r\n\r\n",
                                  added);
        CHECK(out == "HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n"
                     "Trailer: X-Sum\r\nConnection: close\r\n\r\n");
    }

    TEST_CASE("the status line: version, reason as received or the standard one") {
        CHECK(raw_head("HTTP/1.0 404 Gone Fishing\r\n\r\n") == "HTTP/1.1 404 Gone Fishing\r\n\r\n");
        CHECK(raw_head("HTTP/1.1 404 \r\n\r\n") == "HTTP/1.1 404 Not Found\r\n\r\n");
        CHECK(raw_head("HTTP/1.1 299 \r\n\r\n") == beast_head("HTTP/1.1 299 \r\n\r\n"));
        CHECK(raw_head("HTTP/1.1 101 Switching Protocols\r\n\r\n", {}, 10) ==
              "HTTP/1.0 101 Switching Protocols\r\n\r\n");
    }

    TEST_CASE("the same bytes as the Beast path for the same answer") {
        const std::vector<std::string> answers{
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nDate: x\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\nConnection: keep-alive\r\n"
            "Keep-Alive: timeout=5\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Accept: abc=\r\n\r\n",
            "HTTP/1.1 200 OK\r\nConnection: X-A\r\nX-A: 1\r\nx-b: B\r\nSet-Cookie: a\r\n"
            "Set-Cookie: b\r\nProxy-Foo: 1\r\nX-Empty:\r\n\r\n",
        };
        const std::array<added_field, 2> chunked_close{
            {{"Transfer-Encoding", "chunked"}, {"Connection", "close"}}};
        for (const auto& a : answers) {
            CAPTURE(a);
            CHECK(raw_head(a) == beast_head(a));
            CHECK(raw_head(a, chunked_close) == beast_head(a, chunked_close));
        }
    }

    TEST_CASE("transfer_codings: the upstream's codings but chunked, in order") {
        const auto codings = [](std::string_view wire) {
            raw_header_store raw;
            response_parser p;
            parse_head(p, wire, &raw);
            return transfer_codings(raw);
        };
        CHECK(codings("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == "gzip");
        CHECK(codings("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").empty());
        CHECK(codings("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n"
                      "Transfer-Encoding: br, CHUNKED\r\n\r\n") == "gzip, br");
        CHECK(codings("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").empty());
    }

    TEST_CASE("a response's Content-Length list or repeated lines pass on as one plain value") {
        const std::array<std::string_view, 3> answers{
            "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nX-A: b\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\nContent-Length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 002\r\nX-A: b\r\n\r\n"};
        for (const auto wire : answers) {
            CAPTURE(wire);
            CHECK(raw_head(wire) == "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n");
            CHECK(beast_head(wire) == "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n");
        }
    }
}
