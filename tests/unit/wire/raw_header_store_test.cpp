#include "onceproxy/wire/raw_header_store.hpp"

#include "onceproxy/wire/message_parser.hpp"

#include <doctest/doctest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include <string>
#include <string_view>

using onceproxy::wire::raw_header_store;
using onceproxy::wire::response_parser;
namespace bhttp = boost::beast::http;

namespace {

/// Feeds `wire` to `p` in one go (as a read that brought it all would).
boost::system::error_code feed(response_parser& p, std::string_view wire) {
    boost::system::error_code ec;
    while (!wire.empty() && !p.is_done()) {
        const auto used = p.put(boost::asio::buffer(wire.data(), wire.size()), ec);
        wire.remove_prefix(used);
        if (ec == bhttp::error::need_more) {
            ec = {};
            break;
        }
        if (ec || used == 0) {
            break;
        }
    }
    return ec;
}

} // namespace

TEST_SUITE("raw_header_store") {

    TEST_CASE("fields keep their order, case, duplicates and empty values") {
        raw_header_store s;
        CHECK(s.empty());
        s.append(bhttp::field::set_cookie, "Set-Cookie", "a=1; Path=/");
        s.append(bhttp::field::unknown, "X-Odd-CASE", "MiXeD Value");
        s.append(bhttp::field::set_cookie, "set-cookie", "b=2");
        s.append(bhttp::field::unknown, "X-Empty", "");
        REQUIRE(s.size() == 4);
        CHECK(s[0].name == bhttp::field::set_cookie);
        CHECK(s[0].name_string == "Set-Cookie");
        CHECK(s[0].value == "a=1; Path=/");
        CHECK(s[0].line == "Set-Cookie: a=1; Path=/\r\n");
        CHECK(s[1].name == bhttp::field::unknown);
        CHECK(s[1].name_string == "X-Odd-CASE");
        CHECK(s[1].value == "MiXeD Value");
        CHECK(s[2].name_string == "set-cookie");
        CHECK(s[2].value == "b=2");
        CHECK(s[3].value.empty());
        CHECK(s[3].line == "X-Empty: \r\n");
        CHECK(s.lines() == "Set-Cookie: a=1; Path=/\r\nX-Odd-CASE: MiXeD Value\r\n"
                           "set-cookie: b=2\r\nX-Empty: \r\n");
    }

    TEST_CASE("value_of answers the first line, or nothing") {
        raw_header_store s;
        s.append(bhttp::field::trailer, "Trailer", "X-Sum");
        s.append(bhttp::field::trailer, "Trailer", "X-Other");
        CHECK(s.value_of(bhttp::field::trailer) == "X-Sum");
        CHECK(s.value_of(bhttp::field::upgrade).empty());
    }

    TEST_CASE("values are trimmed of spaces and tabs at both ends, as Beast's fields does") {
        raw_header_store s;
        s.append(bhttp::field::unknown, "X-A", " \t a b \t");
        CHECK(s[0].value == "a b");
        CHECK(s.lines() == "X-A: a b\r\n");
    }

    TEST_CASE("clear forgets the fields and the reason, and the store is reused") {
        raw_header_store s;
        s.reason("Not Found");
        s.append(bhttp::field::content_type, "Content-Type", "text/plain");
        s.clear();
        CHECK(s.empty());
        CHECK(s.lines().empty());
        CHECK(s.reason().empty());
        s.append(bhttp::field::content_length, "Content-Length", "3");
        REQUIRE(s.size() == 1);
        CHECK(s[0].line == "Content-Length: 3\r\n");
    }

    TEST_CASE("clear gives back the storage of an unusually large head") {
        raw_header_store s;
        for (int i = 0; i < 1000; ++i) {
            s.append(bhttp::field::unknown, "X-Field", std::string(40, 'v'));
        }
        s.clear();
        CHECK(s.empty());
        s.append(bhttp::field::unknown, "X-After", "1");
        CHECK(s.lines() == "X-After: 1\r\n");
    }
}

TEST_SUITE("message_parser keep_raw_fields") {

    TEST_CASE("the header goes to the store, the status and body to the message") {
        raw_header_store s;
        s.append(bhttp::field::unknown, "X-Stale", "from the previous answer");
        response_parser p;
        p.keep_raw_fields(&s);
        CHECK(s.empty()); // cleared for this answer
        const auto ec = feed(p, "HTTP/1.1 201 Made It\r\nContent-Length: 2\r\nX-A:  v \r\n"
                                "Set-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\nhi");
        REQUIRE_FALSE(ec);
        CHECK(p.is_done());
        CHECK(p.get().result_int() == 201);
        CHECK(p.get().version() == 11);
        CHECK(p.get().body() == "hi");
        CHECK(p.get().begin() == p.get().end()); // no field in the message
        CHECK(s.reason() == "Made It");
        CHECK(s.lines() == "Content-Length: 2\r\nX-A: v\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n");
        CHECK(p.content_length().value_or(0) == 2u);
    }

    TEST_CASE("an empty reason phrase stays empty") {
        raw_header_store s;
        response_parser p;
        p.keep_raw_fields(&s);
        REQUIRE_FALSE(feed(p, "HTTP/1.1 204 \r\nX-A: 1\r\n\r\n"));
        CHECK(p.get().result_int() == 204);
        CHECK(s.reason().empty());
    }

    TEST_CASE("trailers of a chunked body still go apart, not to the store") {
        raw_header_store s;
        response_parser p;
        p.keep_raw_fields(&s);
        const auto ec =
            feed(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n"
                    "\r\n3\r\nabc\r\n0\r\nX-Sum: 42\r\n\r\n");
        REQUIRE_FALSE(ec);
        CHECK(p.is_done());
        CHECK(p.chunked());
        CHECK(p.get().body() == "abc");
        CHECK(s.size() == 2);
        CHECK(s.lines() == "Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n");
        REQUIRE(p.has_trailers());
        CHECK(p.trailers()["X-Sum"] == "42");
    }

    TEST_CASE("the header limit applies as without the store") {
        raw_header_store s;
        response_parser p;
        p.keep_raw_fields(&s);
        p.header_limit(64);
        const auto ec = feed(p, "HTTP/1.1 200 OK\r\nX-Long: " + std::string(100, 'x') + "\r\n\r\n");
        CHECK(ec == bhttp::error::header_limit);
    }

    TEST_CASE("the trailer limit applies as without the store") {
        raw_header_store s;
        response_parser p;
        p.keep_raw_fields(&s);
        p.trailer_limit(16);
        const auto ec =
            feed(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum: " +
                        std::string(40, '4') + "\r\n\r\n");
        CHECK(ec == bhttp::error::header_limit);
    }

    TEST_CASE("without keep_raw_fields the fields go to the message as before") {
        response_parser p;
        REQUIRE_FALSE(feed(p, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-A: 1\r\n\r\n"));
        CHECK(p.get()["X-A"] == "1");
        CHECK(p.get().reason() == "OK");
    }
}
