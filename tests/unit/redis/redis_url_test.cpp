#include "onceproxy/redis/redis_url.hpp"

#include <doctest/doctest.h>

using onceproxy::redis::describe_redis_url_error;
using onceproxy::redis::parse_redis_url;

TEST_CASE("redis url: host, port and database with defaults") {
    auto u = parse_redis_url("redis://redis.internal");
    REQUIRE(u.has_value());
    CHECK_FALSE(u->tls);
    CHECK(u->host == "redis.internal");
    CHECK(u->port == 6379);
    CHECK(u->db == 0);
    CHECK(u->user.empty());
    CHECK(u->password.empty());

    u = parse_redis_url("redis://10.0.0.7:6380/5");
    REQUIRE(u.has_value());
    CHECK(u->host == "10.0.0.7");
    CHECK(u->port == 6380);
    CHECK(u->db == 5);

    u = parse_redis_url("redis://127.0.0.1:7000/");
    REQUIRE(u.has_value());
    CHECK(u->db == 0);

    u = parse_redis_url("redis://[::1]:7001/2");
    REQUIRE(u.has_value());
    CHECK(u->host == "::1");
    CHECK(u->port == 7001);
    CHECK(u->db == 2);
}

TEST_CASE("redis url: rediss:// means TLS") {
    auto u = parse_redis_url("rediss://cache.example.com:6380/1");
    REQUIRE(u.has_value());
    CHECK(u->tls);
    CHECK(u->host == "cache.example.com");
    CHECK(u->port == 6380);
}

TEST_CASE("redis url: credentials, percent-decoded") {
    auto u = parse_redis_url("redis://:s3cret@redis:6379/0");
    REQUIRE(u.has_value());
    CHECK(u->user.empty());
    CHECK(u->password == "s3cret");

    u = parse_redis_url("redis://app:p%40ss%3Aw%2Frd%20x@redis/2");
    REQUIRE(u.has_value());
    CHECK(u->user == "app");
    CHECK(u->password == "p@ss:w/rd x");
    CHECK(u->db == 2);

    // A lone userinfo is the password, as redis-cli -u reads it.
    u = parse_redis_url("redis://onlysecret@redis");
    REQUIRE(u.has_value());
    CHECK(u->user.empty());
    CHECK(u->password == "onlysecret");

    u = parse_redis_url("redis://us%65r:pw@redis");
    REQUIRE(u.has_value());
    CHECK(u->user == "user");
}

TEST_CASE("redis url: invalid inputs are rejected with a reason") {
    for (const char* bad :
         {"http://redis:6379", "redis://", "redis://:pw@", "redis://host:0", "redis://host:65536",
          "redis://host:port", "redis://host/x", "redis://host/1/2", "redis://host/1?timeout=3",
          "redis://host#f", "not a url", "redis://host/-1"}) {
        CAPTURE(bad);
        CHECK_FALSE(parse_redis_url(bad).has_value());
        CHECK_FALSE(describe_redis_url_error(bad).empty());
    }
    CHECK(describe_redis_url_error("redis://host:6379/0").empty());
    CHECK(describe_redis_url_error("http://redis").find("redis://") != std::string::npos);
}
