#include "http/body_relay.hpp"

#include <doctest/doctest.h>

#include <boost/asio/buffer.hpp>

#include <string>
#include <string_view>

using namespace onceproxy::http;

namespace {

/// The bytes a gather write sends.
std::string flatten(const gather& g) {
    std::string out;
    for (const auto& b : g.buffers()) {
        out.append(static_cast<const char*>(b.data()), b.size());
    }
    return out;
}

} // namespace

TEST_SUITE("body_relay") {

    TEST_CASE("frame_response: answers without a body") {
        for (const unsigned status : {100u, 204u, 304u}) {
            CAPTURE(status);
            const auto f = frame_response(status, false, false, 11, true);
            CHECK(f.no_body);
            CHECK_FALSE(f.rechunk);
            CHECK(f.keep);
        }
        const auto head = frame_response(200, true, false, 10, true);
        CHECK(head.no_body);
        CHECK(head.keep); // nothing to delimit, so an HTTP/1.0 client keeps its connection
    }

    TEST_CASE("frame_response: a Content-Length passes through") {
        const auto f = frame_response(200, false, true, 11, true);
        CHECK_FALSE(f.no_body);
        CHECK_FALSE(f.rechunk);
        CHECK(f.keep);
        CHECK(frame_response(200, false, true, 10, true).keep);
    }

    TEST_CASE("frame_response: an unsized body is chunked for HTTP/1.1, close-delimited for 1.0") {
        const auto v11 = frame_response(200, false, false, 11, true);
        CHECK(v11.rechunk);
        CHECK(v11.keep);
        const auto v10 = frame_response(200, false, false, 10, true);
        CHECK_FALSE(v10.rechunk);
        CHECK_FALSE(v10.keep); // the close is what ends the body
    }

    TEST_CASE("frame_response: a connection that may not carry on says so") {
        CHECK_FALSE(frame_response(200, false, true, 11, false).keep);
        CHECK_FALSE(frame_response(200, false, false, 11, false).keep);
    }

    TEST_CASE("gather: a head, one chunk and a tail in one write") {
        CHECK(flatten(gather("HEAD\r\n\r\n", "hello", true, "0\r\n\r\n")) ==
              "HEAD\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        CHECK(flatten(gather("H", "hello", false, "")) == "Hhello");
        // An empty piece is no chunk: a zero-size chunk would end the body.
        CHECK(flatten(gather("H", "", true, "")) == "H");
        CHECK(flatten(gather({}, std::string(300, 'x'), true, {})).starts_with("12c\r\n"));
    }

    TEST_CASE("last_chunk: trailers that may travel, never those the proxy vouches for") {
        boost::beast::http::fields t;
        t.insert("X-Checksum", "abc");
        t.insert("Content-Digest", "sha-256=:x:");
        t.insert("Idempotency-Key", "k");
        t.insert("Authorization", "secret");
        t.insert("Content-Length", "5");
        const std::string_view in_use[] = {"Idempotency-Key"};
        CHECK(last_chunk(t, trailer_side::to_upstream, in_use) ==
              "0\r\nContent-Digest: sha-256=:x:\r\n\r\n");
        CHECK(last_chunk(t, trailer_side::to_client, in_use) ==
              "0\r\nX-Checksum: abc\r\nContent-Digest: sha-256=:x:\r\n\r\n");
        CHECK(last_chunk({}, trailer_side::to_upstream) == "0\r\n\r\n");
    }

    TEST_CASE("trailer_may_travel: an allowlist for requests, a denylist for responses") {
        for (const char* name : {"Expect", "Proxy-Authorization", "Content-Encoding", "Host",
                                 "X-Forwarded-For", "Idempotency-Key", "X-Checksum"}) {
            CAPTURE(name);
            CHECK_FALSE(trailer_may_travel(name, trailer_side::to_upstream));
        }
        for (const char* name :
             {"Content-Digest", "repr-digest", "Digest", "Signature", "Signature-Input"}) {
            CAPTURE(name);
            CHECK(trailer_may_travel(name, trailer_side::to_upstream));
        }
        for (const char* name : {"Proxy-Authenticate", "proxy-x", "Idempotency-Status",
                                 "x-forwarded-for", "Set-Cookie", "Transfer-Encoding"}) {
            CAPTURE(name);
            CHECK_FALSE(trailer_may_travel(name, trailer_side::to_client));
        }
        for (const char* name : {"Server-Timing", "grpc-status", "X-Checksum"}) {
            CAPTURE(name);
            CHECK(trailer_may_travel(name, trailer_side::to_client));
        }
    }
}
