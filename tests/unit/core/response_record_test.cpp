#include <onceproxy/core/response_record.hpp>

#include <doctest/doctest.h>

#include <string>

namespace core = onceproxy::core;
using core::response_record;

namespace {

response_record sample() {
    response_record r;
    r.status = 201;
    r.headers = {{"content-type", "application/octet-stream"},
                 {"x-bin", std::string("a\0b\r\n", 5)},
                 {"set-cookie", "a=1"},
                 {"set-cookie", "b=2"},
                 {"x-empty", ""}};
    r.body = std::string("\0\x01\xff binary\0body\0", 16);
    return r;
}

void check_equal(const response_record& a, const response_record& b) {
    CHECK(a.status == b.status);
    CHECK(a.headers == b.headers);
    CHECK(a.body == b.body);
    CHECK(a.replayable == b.replayable);
}

} // namespace

TEST_CASE("round trip keeps status, headers in order and binary body bytes") {
    const auto r = sample();
    const auto encoded = core::encode_record(r);
    CHECK(static_cast<unsigned char>(encoded[0]) == core::record_format_version);
    const auto decoded = core::decode_record(encoded);
    REQUIRE(decoded);
    check_equal(*decoded, r);
    CHECK(decoded->body.size() == 16);

    response_record empty;
    empty.status = 204;
    const auto d2 = core::decode_record(core::encode_record(empty));
    REQUIRE(d2);
    check_equal(*d2, empty);

    response_record big;
    big.status = 200;
    big.body.assign(1 << 20, '\0');
    const auto d3 = core::decode_record(core::encode_record(big));
    REQUIRE(d3);
    check_equal(*d3, big);
}

TEST_CASE("a not replayable record keeps its status but no body") {
    auto r = sample();
    r.replayable = false;
    const auto decoded = core::decode_record(core::encode_record(r));
    REQUIRE(decoded);
    CHECK_FALSE(decoded->replayable);
    CHECK(decoded->status == 201);
    CHECK(decoded->body.empty());
}

TEST_CASE("every truncation of a valid encoding is rejected") {
    for (auto r :
         {sample(), response_record{200, {}, "", true}, response_record{404, {}, "", false}}) {
        const auto encoded = core::encode_record(r);
        for (std::size_t n = 0; n < encoded.size(); ++n) {
            CHECK_MESSAGE(!core::decode_record(std::string_view(encoded).substr(0, n)),
                          "prefix length ", n);
        }
        CHECK(core::decode_record(encoded));
    }
}

TEST_CASE("garbage is rejected without reading out of bounds") {
    const auto good = core::encode_record(sample());

    auto trailing = good + "x";
    CHECK_FALSE(core::decode_record(trailing));

    auto bad_version = good;
    bad_version[0] = 2;
    CHECK_FALSE(core::decode_record(bad_version));

    auto bad_flags = good;
    bad_flags[1] = 0x03;
    CHECK_FALSE(core::decode_record(bad_flags));

    auto bad_status = good;
    bad_status[2] = 0;
    bad_status[3] = 99;
    CHECK_FALSE(core::decode_record(bad_status));

    // A huge header count or length must not allocate or read past the end.
    auto huge_count = good;
    huge_count[4] = huge_count[5] = huge_count[6] = huge_count[7] = '\xff';
    CHECK_FALSE(core::decode_record(huge_count));
    auto huge_name = good;
    huge_name[8] = huge_name[9] = huge_name[10] = huge_name[11] = '\xff';
    CHECK_FALSE(core::decode_record(huge_name));
    auto huge_body = core::encode_record(response_record{200, {}, "abc", true});
    for (std::size_t i = 8; i < 16; ++i) {
        huge_body[i] = '\xff';
    }
    CHECK_FALSE(core::decode_record(huge_body));

    // Not replayable yet carrying a body: not something encode_record writes.
    auto body_on_unreplayable = core::encode_record(response_record{200, {}, "abc", true});
    body_on_unreplayable[1] = 0;
    CHECK_FALSE(core::decode_record(body_on_unreplayable));

    // Every single-byte corruption either decodes to something or is refused; never crashes.
    std::size_t refused = 0;
    for (std::size_t i = 0; i < good.size(); ++i) {
        auto corrupt = good;
        corrupt[i] = static_cast<char>(corrupt[i] ^ 0xa5);
        refused += core::decode_record(corrupt) ? 0 : 1;
    }
    CHECK(refused > 0);
    CHECK_FALSE(core::decode_record(""));
    CHECK_FALSE(core::decode_record("garbage that is not a record"));
}

TEST_CASE("the view decoder reads the same record, pointing into the encoding") {
    const auto r = sample();
    const auto encoded = core::encode_record(r);
    const auto view = core::decode_record_view(encoded);
    REQUIRE(view);
    CHECK(view->status == r.status);
    CHECK(view->replayable);
    REQUIRE(view->headers.size() == r.headers.size());
    for (std::size_t i = 0; i < r.headers.size(); ++i) {
        CHECK(view->headers[i].first == r.headers[i].first);
        CHECK(view->headers[i].second == r.headers[i].second);
    }
    CHECK(view->body == r.body);
    // No copy: the body is the encoding's tail.
    CHECK(view->body.data() == encoded.data() + encoded.size() - r.body.size());
    // And it refuses what decode_record refuses.
    for (std::size_t n = 0; n < encoded.size(); ++n) {
        CHECK_FALSE(core::decode_record_view(std::string_view(encoded).substr(0, n)));
    }
    CHECK_FALSE(core::decode_record_view(encoded + "x"));
}

TEST_CASE("trailers (a gRPC call's) round trip after the headers; without them the encoding is "
          "the one older versions read") {
    auto r = sample();
    const auto plain = core::encode_record(r);
    CHECK(plain[1] == '\x01'); // replayable, no trailer flag
    r.trailers = {{"grpc-status", "0"},
                  {"grpc-message", ""},
                  {"grpc-status-details-bin", std::string("\x08\x00\xff", 3)}};
    const auto encoded = core::encode_record(r);
    CHECK(encoded[1] == '\x03');
    const auto decoded = core::decode_record(encoded);
    REQUIRE(decoded);
    check_equal(*decoded, r);
    CHECK(decoded->trailers == r.trailers);
    const auto view = core::decode_record_view(encoded);
    REQUIRE(view);
    REQUIRE(view->trailers.size() == 3);
    CHECK(view->trailers[2].second == std::string("\x08\x00\xff", 3));
    for (std::size_t n = 0; n < encoded.size(); ++n) {
        CHECK_FALSE(core::decode_record(encoded.substr(0, n)).has_value());
    }
    // The trailer flag with an empty trailer section is not an encoding this writes.
    auto empty = plain;
    empty[1] = '\x03';
    const auto at = empty.size() - 8 - r.body.size();
    empty.insert(at, std::string(4, '\0'));
    CHECK_FALSE(core::decode_record(empty).has_value());
}
