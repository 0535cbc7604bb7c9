// The layout of a record's value in Redis (src/store/redis_record.hpp): what a claim writes,
// what the scripts match by prefix, and what a reader refuses.

#include "store/redis_record.hpp"

#include <doctest/doctest.h>

#include <string>

namespace record = onceproxy::store::redis_record;
using namespace std::string_literals;

TEST_CASE("a claim value is version 2, in flight, length-prefixed owner and fingerprint") {
    const auto v = record::claim_value("owner-1", "fp", 1700000000123);
    CHECK(v == "2f7:owner-12:fp1700000000123;");
    auto p = record::parse(v);
    REQUIRE(p);
    CHECK(p->state == record::in_flight);
    CHECK(p->owner == "owner-1");
    CHECK(p->fingerprint == "fp");
    CHECK(p->created_ms == 1700000000123);
    CHECK(p->payload_offset == v.size());
}

TEST_CASE("the scripts' lease prefix is the start of the claim value") {
    // complete/release/extend match '2f' .. #owner .. ':' .. owner
    const std::string owner = "a1b2c3";
    const auto v = record::claim_value(owner, "x", 1);
    CHECK(v.rfind("2f" + std::to_string(owner.size()) + ":" + owner, 0) == 0);
    CHECK(record::lease_prefix(owner) == "2f6:a1b2c3");
    CHECK(v.starts_with(record::lease_prefix(owner)));
    CHECK(record::lease_prefix("") == "2f0:");
}

TEST_CASE("complete's value: the lease's state flipped to c, the payload after it") {
    const auto lease = record::claim_value("o\0w"s, "fp", 7);
    const std::string payload = "\0;2f1:x"s;
    const auto v = record::completed_value(lease, payload);
    CHECK(v == "2c3:o\0w2:fp7;\0;2f1:x"s);
    auto p = record::parse(v);
    REQUIRE(p);
    CHECK(p->state == record::completed);
    CHECK(p->owner == "o\0w"s);
    CHECK(v.substr(p->payload_offset) == payload);
    // From the owner's prefix alone (what complete sends when it does not know the lease).
    CHECK(record::completed_value(record::lease_prefix("ab"), "p") == "2c2:abp");
}

TEST_CASE("a completed value carries its payload after the header, binary-safe") {
    // What the complete script writes: '2c' .. the claim value after its first two bytes ..
    // the payload.
    const std::string fp = "\n;:\0\xff"s;
    const std::string owner = "o:w;n\ne\0r"s;
    const auto claim = record::claim_value(owner, fp, 42);
    const std::string payload = "2f3:abc\0;payload"s;
    const std::string completed = "2c" + claim.substr(2) + payload;
    auto p = record::parse(completed);
    REQUIRE(p);
    CHECK(p->state == record::completed);
    CHECK(p->owner == owner);
    CHECK(p->fingerprint == fp);
    CHECK(p->created_ms == 42);
    CHECK(completed.substr(p->payload_offset) == payload);
}

TEST_CASE("a completed value may have an empty payload") {
    const std::string completed = "2c1:o1:f5;";
    auto p = record::parse(completed);
    REQUIRE(p);
    CHECK(p->payload_offset == completed.size());
}

TEST_CASE("values of another layout or cut short are refused") {
    for (const std::string& bad :
         {""s, "2"s, "1f1:o1:f5;"s, "2x1:o1:f5;"s, "2f"s, "2f1:o"s, "2f9:o1:f5;"s, "2f1:o1:f"s,
          "2f1:o1:f5"s, "2f1:o1:f;"s, "2f1:o1:fx;"s, "2f-1:o1:f5;"s, "2f1o1:f5;"s,
          "2f1:o1:f5;payload"s, "2f99999999999999999999:o"s}) {
        CAPTURE(bad);
        CHECK_FALSE(record::parse(bad));
    }
}

TEST_CASE("the server's version, from INFO server: 7.0 or newer takes a claim's SET NX GET") {
    const std::string info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
    CHECK(record::redis_version(info) == "7.0.15");
    CHECK(record::major_version("7.0.15") == 7);
    CHECK(record::major_version("6.2.14") == 6);
    CHECK(record::major_version("10") == 10);
    CHECK(record::redis_version("# Server\r\nredis_mode:standalone\r\n").empty());
    CHECK_FALSE(record::major_version(""));
    CHECK_FALSE(record::major_version("x7"));
    CHECK_FALSE(record::major_version("7x.0"));
    CHECK(record::minimum_redis_major == 7);
}
