#include "onceproxy/redis/redis_sentinel.hpp"

#include "support/log_capture.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

using onceproxy::redis::master_switch_cause;
using onceproxy::redis::parse_switch_master;
using onceproxy::redis::redis_reply;
using onceproxy::redis::redis_sentinel;
using onceproxy::redis::redis_sentinel_options;
using onceproxy::test::captured_log;

namespace {

redis_reply bulk(std::string s) {
    redis_reply r;
    r.type = redis_reply::kind::string;
    r.str = std::move(s);
    return r;
}

/// A pub/sub message as the multiplexer hands it over: ["message", channel, payload].
redis_reply message(std::string channel, std::string payload) {
    redis_reply r;
    r.type = redis_reply::kind::array;
    r.elements = {bulk("message"), bulk(std::move(channel)), bulk(std::move(payload))};
    return r;
}

std::shared_ptr<redis_sentinel> sentinel_of(std::string master) {
    redis_sentinel_options o;
    o.master_name = std::move(master);
    o.nodes = {{"127.0.0.1", 26379}, {"127.0.0.1", 26380}};
    return std::make_shared<redis_sentinel>(std::move(o));
}

std::uint64_t total(const redis_sentinel& s) {
    return s.switches(master_switch_cause::switch_master) +
           s.switches(master_switch_cause::readonly) +
           s.switches(master_switch_cause::connection_lost);
}

} // namespace

TEST_SUITE("redis sentinel") {
    TEST_CASE("+switch-master: the five fields of the announcement") {
        const auto e = parse_switch_master("mymaster 10.0.0.1 6379 10.0.0.2 6380");
        REQUIRE(e.has_value());
        CHECK(e->master == "mymaster");
        CHECK(e->old_host == "10.0.0.1");
        CHECK(e->old_port == 6379);
        CHECK(e->new_host == "10.0.0.2");
        CHECK(e->new_port == 6380);

        // Host names (announce-hostnames) and IPv6 addresses are single fields too.
        const auto v6 = parse_switch_master("m ::1 1 redis-1.example 65535");
        REQUIRE(v6.has_value());
        CHECK(v6->old_host == "::1");
        CHECK(v6->old_port == 1);
        CHECK(v6->new_host == "redis-1.example");
        CHECK(v6->new_port == 65535);
    }

    TEST_CASE("+switch-master: anything but five fields with two ports is refused") {
        for (const char* bad : {
                 "",
                 "mymaster",
                 "mymaster 10.0.0.1 6379 10.0.0.2",          // four fields
                 "mymaster 10.0.0.1 6379 10.0.0.2 6380 x",   // six
                 "mymaster 10.0.0.1 6379 10.0.0.2 6380 ",    // a trailing space
                 " mymaster 10.0.0.1 6379 10.0.0.2 6380",    // a leading one
                 "mymaster  10.0.0.1 6379 10.0.0.2 6380",    // an empty field
                 "mymaster 10.0.0.1 6379 10.0.0.2 0",        // port 0
                 "mymaster 10.0.0.1 6379 10.0.0.2 65536",    // out of range
                 "mymaster 10.0.0.1 6379 10.0.0.2 -1",       // negative
                 "mymaster 10.0.0.1 63x9 10.0.0.2 6380",     // not a number
                 "mymaster 10.0.0.1 6379 10.0.0.2 6380\r\n", // trailing bytes in the port
                 "mymaster 10.0.0.1 +6379 10.0.0.2 6380",
             }) {
            CAPTURE(bad);
            CHECK_FALSE(parse_switch_master(bad).has_value());
        }
    }

    TEST_CASE("+switch-master of our master moves the store once, counted and logged") {
        auto s = sentinel_of("mymaster");
        std::vector<master_switch_cause> seen;
        s->set_switch_observer([&](master_switch_cause c) { seen.push_back(c); });
        // Where the data connections started: not a move.
        s->note_connected("10.0.0.1", 6379, false);
        CHECK(total(*s) == 0);

        const auto log = captured_log([&] {
            s->take_message(1, message("+switch-master", "mymaster 10.0.0.1 6379 10.0.0.2 6380"));
        });
        CHECK(s->switches(master_switch_cause::switch_master) == 1);
        CHECK(seen == std::vector<master_switch_cause>{master_switch_cause::switch_master});
        CHECK(log.find("\"msg\":\"redis master switched\"") != std::string::npos);
        CHECK(log.find("\"from\":\"10.0.0.1:6379\"") != std::string::npos);
        CHECK(log.find("\"to\":\"10.0.0.2:6380\"") != std::string::npos);
        CHECK(log.find("\"cause\":\"switch_master\"") != std::string::npos);
        CHECK(log.find("127.0.0.1:26380") != std::string::npos); // the announcing sentinel

        // The data connections then reconnect there: no second move.
        s->note_connected("10.0.0.2", 6380, false);
        // The same announcement again (another sentinel): already there.
        s->take_message(0, message("+switch-master", "mymaster 10.0.0.1 6379 10.0.0.2 6380"));
        CHECK(total(*s) == 1);
        CHECK(seen.size() == 1);
    }

    TEST_CASE("+switch-master: a malformed message is logged and ignored; another master's is "
              "skipped") {
        auto s = sentinel_of("mymaster");
        s->note_connected("10.0.0.1", 6379, false);
        const auto log = captured_log([&] {
            s->take_message(0, message("+switch-master", "mymaster 10.0.0.1 6379 10.0.0.2"));
            s->take_message(0, message("+switch-master", std::string("\xff\x00 garbage", 10)));
            s->take_message(0, message("+switch-master", ""));
            s->take_message(0, message("+other-channel", "mymaster 10.0.0.1 6379 10.0.0.2 6380"));
            redis_reply odd = message("+switch-master", "x");
            odd.elements.pop_back(); // ["message", "+switch-master"]: no payload
            s->take_message(0, odd);
            redis_reply number;
            number.type = redis_reply::kind::array;
            number.elements = {bulk("message"), bulk("+switch-master"), redis_reply{}};
            number.elements[2].type = redis_reply::kind::integer;
            s->take_message(0, number);
            s->take_message(7, message("+switch-master", "mymaster a 1 b 2")); // no such sentinel
        });
        CHECK(total(*s) == 0);
        std::size_t malformed = 0;
        for (auto at = log.find("ignored a malformed +switch-master message");
             at != std::string::npos;
             at = log.find("ignored a malformed +switch-master message", at + 1)) {
            ++malformed;
        }
        CHECK(malformed == 3);
        CHECK(log.find("\"message\":\"mymaster 10.0.0.1 6379 10.0.0.2\"") != std::string::npos);
        CHECK(log.find("ignored an unexpected message from a sentinel") != std::string::npos);

        // Another master monitored by the same sentinels: not ours, nothing moves.
        s->take_message(0, message("+switch-master", "othermaster 10.0.0.1 6379 10.0.0.9 1"));
        CHECK(total(*s) == 0);
        // Ours, after all that: acted on.
        s->take_message(0, message("+switch-master", "mymaster 10.0.0.1 6379 10.0.0.2 6380"));
        CHECK(s->switches(master_switch_cause::switch_master) == 1);
    }

    TEST_CASE("a reconnect that lands on another master is a move: readonly or connection_lost") {
        auto s = sentinel_of("mymaster");
        std::vector<master_switch_cause> seen;
        s->set_switch_observer([&](master_switch_cause c) { seen.push_back(c); });
        s->note_connected("10.0.0.1", 6379, false);
        s->note_connected("10.0.0.1", 6379, false); // another connection, same master
        s->note_connected("10.0.0.1", 6379, true);  // back on the same one after -READONLY
        CHECK(total(*s) == 0);
        s->note_connected("10.0.0.2", 6379, true);
        s->note_connected("10.0.0.2", 6379, false);
        s->note_connected("10.0.0.1", 6379, false);
        CHECK(s->switches(master_switch_cause::readonly) == 1);
        CHECK(s->switches(master_switch_cause::connection_lost) == 1);
        CHECK(s->switches(master_switch_cause::switch_master) == 0);
        CHECK(seen == std::vector<master_switch_cause>{master_switch_cause::readonly,
                                                       master_switch_cause::connection_lost});
    }
}
