#include "onceproxy/redis/redis_cluster.hpp"

#include "redis/resp_reader.hpp"

#include <doctest/doctest.h>

#include <string>

using onceproxy::redis::parse_cluster_shards;
using onceproxy::redis::parse_cluster_slots;
using onceproxy::redis::parse_redirect;
using onceproxy::redis::redis_key_slot;
using onceproxy::redis::redis_node_address;
using onceproxy::redis::redis_redirect;
using onceproxy::redis::redis_reply;
using onceproxy::redis::resp_reader;

namespace {

// One reply decoded from raw RESP bytes, as the connection would see it.
redis_reply decode(const std::string& bytes) {
    resp_reader r;
    REQUIRE(r.feed(bytes.data(), bytes.size()) == resp_reader::status::need_more);
    redis_reply out;
    REQUIRE(r.next(out) == resp_reader::status::reply);
    return out;
}

std::string bulk(const std::string& s) {
    return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
}

std::string integer(long long v) {
    return ":" + std::to_string(v) + "\r\n";
}

// A node of CLUSTER SHARDS as Redis 7.0 sends it in RESP2 (a flat key/value array).
std::string shard_node(const std::string& ip, long long port, const std::string& role,
                       const std::string& health = "online") {
    return "*14\r\n" + bulk("id") + bulk(std::string(40, 'a')) + bulk("port") + integer(port) +
           bulk("ip") + bulk(ip) + bulk("endpoint") + bulk(ip) + bulk("role") + bulk(role) +
           bulk("replication-offset") + integer(1234) + bulk("health") + bulk(health);
}

} // namespace

TEST_CASE("redis_key_slot: CRC16 mod 16384 as in the Cluster spec, hash tags honoured") {
    CHECK(redis_key_slot("123456789") == 12739); // CRC16-XMODEM check value 0x31C3
    CHECK(redis_key_slot("foo") == 12182);
    CHECK(redis_key_slot("bar") == 5061);
    CHECK(redis_key_slot("") == 0);
    CHECK(redis_key_slot("{user1000}.following") == redis_key_slot("user1000"));
    CHECK(redis_key_slot("{user1000}.followers") == redis_key_slot("user1000"));
    CHECK(redis_key_slot("foo{bar}{zap}") == redis_key_slot("bar"));
    // An empty tag does not count: the whole key is hashed.
    CHECK(redis_key_slot("foo{}{bar}") == redis_key_slot(std::string_view("foo{}{bar}")));
    CHECK(redis_key_slot("foo{}{bar}") != redis_key_slot("bar"));
    CHECK(redis_key_slot("foo{{bar}}zap") == redis_key_slot("{bar"));
    CHECK(redis_key_slot("foo{bar") != redis_key_slot("bar")); // no closing brace
    CHECK(redis_key_slot(std::string("k\0ey", 4)) != redis_key_slot("k"));
    // Keys as long as onceproxy's, and longer: slots as a Redis 7.0 CLUSTER KEYSLOT gave them.
    CHECK(redis_key_slot(
              "onceproxy:v1:3f8a1c5e9b7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c") ==
          5890);
    CHECK(redis_key_slot("a fairly long key with spaces and punctuation: "
                         "0123456789/abcdefghijklmnopqrstuvwxyz") == 10685);
    CHECK(redis_key_slot(std::string(200, 'x')) == 9756);
}

TEST_CASE("parse_redirect: MOVED and ASK from raw error replies; anything else is not one") {
    auto moved = parse_redirect(decode("-MOVED 3999 127.0.0.1:6381\r\n"));
    REQUIRE(moved);
    CHECK(moved->type == redis_redirect::kind::moved);
    CHECK(moved->slot == 3999);
    CHECK(moved->target == redis_node_address{"127.0.0.1", 6381});
    auto ask = parse_redirect(decode("-ASK 12182 ::1:21002\r\n"));
    REQUIRE(ask);
    CHECK(ask->type == redis_redirect::kind::ask);
    CHECK(ask->slot == 12182);
    CHECK(ask->target == redis_node_address{"::1", 21002});
    CHECK_FALSE(parse_redirect(decode("-ERR MOVED 1 a:1\r\n")));
    CHECK_FALSE(parse_redirect(decode("-MOVED 16384 127.0.0.1:1\r\n")));
    CHECK_FALSE(parse_redirect(decode("-MOVED 12 127.0.0.1\r\n")));
    CHECK_FALSE(parse_redirect(decode("-MOVED 12 127.0.0.1:0\r\n")));
    CHECK_FALSE(parse_redirect(decode("-MOVEDX 12 127.0.0.1:1\r\n")));
    CHECK_FALSE(parse_redirect(decode("+MOVED 12 127.0.0.1:1\r\n")));
    // A bare word, with no slot or address (resp_fuzz: "-ASK" threw out_of_range).
    CHECK_FALSE(parse_redirect(decode("-ASK\r\n")));
    CHECK_FALSE(parse_redirect(decode("-MOVED\r\n")));
    CHECK_FALSE(parse_redirect(decode("-ASK \r\n")));
}

TEST_CASE("parse_cluster_shards: masters own their slot ranges; replicas and empty shards do not") {
    const std::string wire =
        "*3\r\n"
        // shard 1: slots 0-5460, master 127.0.0.1:7000, replica 7003
        "*4\r\n" +
        bulk("slots") + "*2\r\n" + integer(0) + integer(5460) + bulk("nodes") + "*2\r\n" +
        shard_node("127.0.0.1", 7003, "replica") + shard_node("127.0.0.1", 7000, "master") +
        // shard 2: two ranges, the master's endpoint unknown ("?" -> the node asked)
        "*4\r\n" + bulk("slots") + "*4\r\n" + integer(5461) + integer(10922) + integer(16383) +
        integer(16383) + bulk("nodes") + "*1\r\n" + shard_node("?", 7001, "master") +
        // shard 3: no slots
        "*4\r\n" + bulk("slots") + "*0\r\n" + bulk("nodes") + "*1\r\n" +
        shard_node("127.0.0.1", 7002, "master");
    const redis_node_address asked{"10.0.0.9", 7000};
    auto map = parse_cluster_shards(decode(wire), asked, false);
    REQUIRE(map);
    REQUIRE(map->masters.size() == 2);
    CHECK(map->masters[0] == redis_node_address{"127.0.0.1", 7000});
    CHECK(map->masters[1] == redis_node_address{"10.0.0.9", 7001});
    CHECK(map->owner[0] == 0);
    CHECK(map->owner[5460] == 0);
    CHECK(map->owner[5461] == 1);
    CHECK(map->owner[10922] == 1);
    CHECK(map->owner[10923] == -1);
    CHECK(map->owner[16383] == 1);
    CHECK(map->covered() == 5461 + 5462 + 1);
    // Malformed: a range past the last slot, or not an array at all.
    CHECK_FALSE(parse_cluster_shards(decode("*1\r\n*4\r\n" + bulk("slots") + "*2\r\n" + integer(0) +
                                            integer(16384) + bulk("nodes") + "*1\r\n" +
                                            shard_node("a", 1, "master")),
                                     asked, false));
    CHECK_FALSE(parse_cluster_shards(decode("+OK\r\n"), asked, false));
}

TEST_CASE("parse_cluster_shards: a failed old master listed first does not own the slots") {
    // As Redis 7.2+ and Valkey answer after a failover: the old master stays in its shard with
    // role master and health fail, next to the promoted replica.
    const std::string wire = "*1\r\n*4\r\n" + bulk("slots") + "*2\r\n" + integer(0) +
                             integer(16383) + bulk("nodes") + "*2\r\n" +
                             shard_node("127.0.0.1", 7000, "master", "fail") +
                             shard_node("127.0.0.1", 7003, "master");
    const redis_node_address asked{"127.0.0.1", 7003};
    auto map = parse_cluster_shards(decode(wire), asked, false);
    REQUIRE(map);
    REQUIRE(map->masters.size() == 1);
    CHECK(map->masters[0] == redis_node_address{"127.0.0.1", 7003});
    CHECK(map->covered() == 16384);
    // Only the failed one known: no owner for those slots (MOVED or a later refresh tells).
    const std::string only_failed = "*1\r\n*4\r\n" + bulk("slots") + "*2\r\n" + integer(0) +
                                    integer(16383) + bulk("nodes") + "*1\r\n" +
                                    shard_node("127.0.0.1", 7000, "master", "fail");
    auto none = parse_cluster_shards(decode(only_failed), asked, false);
    REQUIRE(none);
    CHECK(none->covered() == 0);
}

TEST_CASE("redis_slot_map::keep_known: slots a partial map leaves out keep their old owner") {
    onceproxy::redis::redis_slot_map before;
    const int a = before.add_master({"127.0.0.1", 7000});
    const int b = before.add_master({"127.0.0.1", 7001});
    before.owner.fill(a);
    for (std::size_t s = 8192; s < before.owner.size(); ++s) {
        before.owner[s] = b;
    }
    // The new answer knows slots 0-8191 (now on 7002) and nothing of the rest.
    onceproxy::redis::redis_slot_map partial;
    const int c = partial.add_master({"127.0.0.1", 7002});
    for (std::size_t s = 0; s < 8192; ++s) {
        partial.owner[s] = c;
    }
    partial.keep_known(before);
    CHECK(partial.covered() == 16384);
    CHECK(partial.masters[static_cast<std::size_t>(partial.owner[0])] ==
          redis_node_address{"127.0.0.1", 7002});
    CHECK(partial.masters[static_cast<std::size_t>(partial.owner[16383])] ==
          redis_node_address{"127.0.0.1", 7001});
    CHECK(partial.masters.size() == 2); // 7000 owns nothing any more: not added
}

TEST_CASE("parse_cluster_slots: the first node of each range is its master") {
    const std::string wire = "*2\r\n"
                             "*4\r\n" +
                             integer(0) + integer(8191) + "*3\r\n" + bulk("127.0.0.1") +
                             integer(7000) + bulk("id0") + "*3\r\n" + bulk("127.0.0.1") +
                             integer(7003) + bulk("id3") + "*3\r\n" + integer(8192) +
                             integer(16383) + "*3\r\n" + bulk("") + integer(7001) + bulk("id1");
    const redis_node_address asked{"127.0.0.2", 7001};
    auto map = parse_cluster_slots(decode(wire), asked);
    REQUIRE(map);
    REQUIRE(map->masters.size() == 2);
    CHECK(map->masters[0] == redis_node_address{"127.0.0.1", 7000});
    CHECK(map->masters[1] == redis_node_address{"127.0.0.2", 7001});
    CHECK(map->owner[8191] == 0);
    CHECK(map->owner[8192] == 1);
    CHECK(map->covered() == 16384);
    CHECK_FALSE(parse_cluster_slots(decode("*1\r\n*2\r\n:0\r\n:1\r\n"), asked));
}
