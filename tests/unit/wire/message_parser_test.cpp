#include "onceproxy/wire/message_parser.hpp"

#include <doctest/doctest.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include <string>
#include <string_view>

using onceproxy::wire::request_parser;
using onceproxy::wire::response_parser;
namespace bhttp = boost::beast::http;

namespace {

/// Feeds `wire` to `p` in one buffer, as often as the parser takes bytes (a read that brought
/// the whole message); the last error.
template <class Parser>
boost::system::error_code feed(Parser& p, std::string_view wire) {
    boost::system::error_code ec;
    while (!wire.empty() && !p.is_done()) {
        const auto used = p.put(boost::asio::buffer(wire.data(), wire.size()), ec);
        wire.remove_prefix(used);
        if (ec || used == 0) {
            break;
        }
    }
    return ec;
}

const std::string chunked_head =
    "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

} // namespace

TEST_SUITE("message_parser") {
    TEST_CASE("a chunk extension with a control character is refused, even quoted") {
        for (const char* chunk :
             {"5;a=\"x\ny\"\r\nhello\r\n0\r\n\r\n", "5;a=\"x\ry\"\r\nhello\r\n0\r\n\r\n",
              "5;a=\"x\x01y\"\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0;a=\"x\ny\"\r\n\r\n"}) {
            CAPTURE(chunk);
            request_parser p;
            const auto ec = feed(p, chunked_head + chunk);
            CHECK(ec); // bad_chunk_extension, or a bad line ending on the last chunk's line
            CHECK(ec != bhttp::error::need_more);
            CHECK_FALSE(p.is_done());
        }
        request_parser ok;
        CHECK_FALSE(feed(ok, chunked_head + "5;a=\"x\ty\";b=c\r\nhello\r\n0\r\n\r\n"));
        CHECK(ok.is_done());
        CHECK(ok.get().body() == "hello");
    }

    TEST_CASE("an obsolete line fold in a request's trailer section is refused") {
        for (const char* end : {"0\r\nX-A: b\r\n c\r\n\r\n", "0\r\nX-A: b\r\n\tc\r\n\r\n",
                                "0\r\nX-A: b\r\nX-B: c\r\n d\r\n\r\n"}) {
            CAPTURE(end);
            request_parser p;
            CHECK(feed(p, chunked_head + "5\r\nhello\r\n" + end) == bhttp::error::bad_value);
        }
        request_parser ok;
        CHECK_FALSE(feed(ok, chunked_head + "5\r\nhel\n \r\n0\r\nX-A: b\r\nX-B: c\r\n\r\n"));
        CHECK(ok.is_done());
        CHECK(ok.trailers()["X-B"] == "c");
        request_parser none;
        CHECK_FALSE(feed(none, chunked_head + "0\r\n\r\n"));
        CHECK(none.is_done());
    }

    TEST_CASE("a response with a transfer coding is refused only when asked") {
        const std::string wire =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nzz\r\n0\r\n\r\n";
        response_parser plain;
        CHECK_FALSE(feed(plain, wire));
        CHECK(plain.is_done());
        response_parser strict;
        strict.refuse_transfer_codings();
        CHECK(feed(strict, wire) == bhttp::error::bad_transfer_encoding);
        response_parser chunked_only;
        chunked_only.refuse_transfer_codings();
        CHECK_FALSE(
            feed(chunked_only, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"));
    }

    TEST_CASE("a response's Content-Length is kept once, in plain digits") {
        response_parser p;
        CHECK_FALSE(feed(p, "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 02\r\n"
                            "\r\nok"));
        CHECK(p.get()[bhttp::field::content_length] == "2");
        CHECK(p.get().count(bhttp::field::content_length) == 1);
        CHECK(p.get().body() == "ok");
    }
}
