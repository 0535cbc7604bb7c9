#include "redis/resp_reader.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using onceproxy::redis::redis_reply;
using onceproxy::redis::resp_reader;

namespace {

/// The replies read from `bytes` fed in two reads, the first of `split` bytes.
std::vector<redis_reply> read_split(const std::string& bytes, std::size_t split) {
    resp_reader r;
    std::vector<redis_reply> got;
    for (const auto& part : {bytes.substr(0, split), bytes.substr(split)}) {
        REQUIRE(r.feed(part.data(), part.size()) == resp_reader::status::need_more);
        redis_reply rep;
        while (r.next(rep) == resp_reader::status::reply) {
            got.push_back(rep);
        }
    }
    return got;
}

} // namespace

TEST_CASE("resp_reader: replies split anywhere across reads come out whole and in order") {
    static constexpr char wire[] =
        "+OK\r\n$5\r\nhe\0lo\r\n:42\r\n*2\r\n$1\r\na\r\n$-1\r\n-ERR boom\r\n";
    const std::string bytes(wire, sizeof wire - 1);
    for (std::size_t split = 0; split <= bytes.size(); ++split) {
        CAPTURE(split);
        const auto got = read_split(bytes, split);
        REQUIRE(got.size() == 5);
        CHECK(got[0].type == redis_reply::kind::status);
        CHECK(got[0].str == "OK");
        CHECK(got[1].type == redis_reply::kind::string);
        CHECK(got[1].str == std::string("he\0lo", 5));
        CHECK(got[2].integer == 42);
        REQUIRE(got[3].elements.size() == 2);
        CHECK(got[3].elements[1].type == redis_reply::kind::nil);
        CHECK(got[4].is_error("ERR"));
    }
}

TEST_CASE("resp_reader: bytes that are not RESP are a protocol error") {
    resp_reader r;
    const std::string junk = "HTTP/1.1 200 OK\r\n";
    r.feed(junk.data(), junk.size());
    redis_reply rep;
    CHECK(r.next(rep) == resp_reader::status::protocol_error);
}

TEST_CASE("resp_reader: an array header with an absurd element count is refused, not allocated") {
    // hiredis would allocate the element table from the count alone (7.8 GB here).
    resp_reader r;
    const std::string huge = "*977777777\r\n:1\r\n";
    r.feed(huge.data(), huge.size());
    redis_reply rep;
    CHECK(r.next(rep) == resp_reader::status::protocol_error);

    // A large but plausible array still reads.
    resp_reader ok;
    std::string many = "*1000\r\n";
    for (int i = 0; i < 1000; ++i) {
        many += ":1\r\n";
    }
    ok.feed(many.data(), many.size());
    REQUIRE(ok.next(rep) == resp_reader::status::reply);
    CHECK(rep.elements.size() == 1000);
}

TEST_CASE(
    "resp_reader: nested arrays, split anywhere, and arrays longer than their first reserve") {
    static constexpr char wire[] = "*3\r\n*2\r\n:1\r\n*1\r\n$2\r\nab\r\n*0\r\n*-1\r\n+OK\r\n";
    const std::string bytes(wire, sizeof wire - 1);
    for (std::size_t split = 0; split <= bytes.size(); ++split) {
        CAPTURE(split);
        const auto got = read_split(bytes, split);
        REQUIRE(got.size() == 2);
        const auto& top = got[0];
        REQUIRE(top.type == redis_reply::kind::array);
        REQUIRE(top.elements.size() == 3);
        REQUIRE(top.elements[0].elements.size() == 2);
        CHECK(top.elements[0].elements[0].integer == 1);
        REQUIRE(top.elements[0].elements[1].elements.size() == 1);
        CHECK(top.elements[0].elements[1].elements[0].str == "ab");
        CHECK(top.elements[1].type == redis_reply::kind::array);
        CHECK(top.elements[1].elements.empty());
        CHECK(top.elements[2].type == redis_reply::kind::nil);
        CHECK(got[1].type == redis_reply::kind::status);
        CHECK(got[1].str == "OK");
    }

    // Elements beyond the first reserve move while the array grows; each keeps its contents.
    std::string many = "*3000\r\n";
    for (int i = 0; i < 3000; ++i) {
        many += "*2\r\n:" + std::to_string(i) + "\r\n$1\r\nv\r\n";
    }
    resp_reader r;
    r.feed(many.data(), many.size());
    redis_reply rep;
    REQUIRE(r.next(rep) == resp_reader::status::reply);
    REQUIRE(rep.elements.size() == 3000);
    for (int i = 0; i < 3000; ++i) {
        REQUIRE(rep.elements[static_cast<std::size_t>(i)].elements.size() == 2);
        CHECK(rep.elements[static_cast<std::size_t>(i)].elements[0].integer == i);
        CHECK(rep.elements[static_cast<std::size_t>(i)].elements[1].str == "v");
    }
}

TEST_CASE("resp_reader: a reply cut by a protocol error leaves nothing behind") {
    resp_reader r;
    const std::string bad = "*2\r\n$3\r\nabc\r\n!junk\r\n";
    r.feed(bad.data(), bad.size());
    redis_reply rep;
    CHECK(r.next(rep) == resp_reader::status::protocol_error);
}
