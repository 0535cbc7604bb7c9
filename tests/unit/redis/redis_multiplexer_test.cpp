#include "redis/redis_multiplexer.hpp"

#include "onceproxy/redis/error.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using onceproxy::redis::errc;
using onceproxy::redis::redis_multiplexer;
using onceproxy::redis::redis_reply;
using onceproxy::redis::redis_request;

namespace {

std::shared_ptr<redis_request> request() {
    return std::make_shared<redis_request>();
}

std::string written(redis_multiplexer& m) {
    std::string out;
    m.take_write(out);
    return out;
}

redis_multiplexer::read_status feed(redis_multiplexer& m, const std::string& bytes) {
    return m.on_read(bytes.data(), bytes.size());
}

} // namespace

TEST_CASE("redis_multiplexer: commands added in a row leave in one write, RESP-encoded, in order") {
    redis_multiplexer m;
    auto a = request();
    auto b = request();
    REQUIRE(m.add(a, {"ASKING"}));
    REQUIRE(m.add(b, {"GET", std::string("k\0y", 3)}));
    CHECK(m.has_unwritten());
    CHECK(m.unwritten() == 2);
    CHECK(a->st == redis_request::state::queued);
    CHECK_FALSE(a->written);
    static constexpr char wire[] = "*1\r\n$6\r\nASKING\r\n*2\r\n$3\r\nGET\r\n$3\r\nk\0y\r\n";
    CHECK(written(m) == std::string(wire, sizeof wire - 1));
    CHECK_FALSE(m.has_unwritten());
    CHECK(m.unwritten() == 0);
    CHECK(m.in_flight() == 2);
    CHECK(a->st == redis_request::state::written);
    CHECK(b->written);
    CHECK(written(m).empty());
}

TEST_CASE(
    "redis_multiplexer: arguments of any length are encoded exactly, from any range of views") {
    redis_multiplexer m;
    const std::string big(12345, 'x');
    const std::string key = "k";
    const auto args = onceproxy::redis::command("SET", key, "", big); // an array of views
    REQUIRE(m.add(request(), args));
    const std::vector<std::string_view> ten(10, "a"); // a two-digit argument count
    REQUIRE(m.add(request(), ten));
    std::string want = "*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$12345\r\n" + big + "\r\n*10\r\n";
    for (int i = 0; i < 10; ++i) {
        want += "$1\r\na\r\n";
    }
    CHECK(written(m) == want);
}

TEST_CASE("redis_multiplexer: replies split anywhere reach their requests in order") {
    const std::string replies = "+OK\r\n$3\r\nabc\r\n:7\r\n";
    for (std::size_t split = 0; split <= replies.size(); ++split) {
        CAPTURE(split);
        redis_multiplexer m;
        std::vector<std::shared_ptr<redis_request>> rs{request(), request(), request()};
        int notified = 0;
        for (auto& r : rs) {
            r->on_done = [&notified] { ++notified; };
            REQUIRE(m.add(r, {"PING"}));
        }
        (void)written(m);
        REQUIRE(feed(m, replies.substr(0, split)) == redis_multiplexer::read_status::ok);
        REQUIRE(feed(m, replies.substr(split)) == redis_multiplexer::read_status::ok);
        CHECK(notified == 3);
        CHECK(rs[0]->reply.type == redis_reply::kind::status);
        CHECK(rs[0]->reply.str == "OK");
        CHECK(rs[1]->reply.str == "abc");
        CHECK(rs[2]->reply.integer == 7);
        for (auto& r : rs) {
            CHECK(r->done());
            CHECK_FALSE(r->ec);
        }
        CHECK(m.in_flight() == 0);
    }
}

TEST_CASE("redis_multiplexer: a late reply to an abandoned request is dropped, the next still "
          "gets its own") {
    redis_multiplexer m;
    auto gone = request();
    auto next = request();
    REQUIRE(m.add(gone, {"GET", "a"}));
    REQUIRE(m.add(next, {"GET", "b"}));
    (void)written(m);
    const auto cancelled =
        boost::system::errc::make_error_code(boost::system::errc::operation_canceled);
    m.abandon(gone, cancelled);
    CHECK(gone->done());
    CHECK(gone->ec == cancelled);
    CHECK(m.in_flight() == 2); // its place stays until its reply comes
    REQUIRE(feed(m, "$6\r\nfor-a!\r\n") == redis_multiplexer::read_status::ok);
    CHECK(gone->reply.type == redis_reply::kind::nil); // dropped, not delivered
    CHECK_FALSE(next->done());
    REQUIRE(feed(m, "$6\r\nfor-b!\r\n") == redis_multiplexer::read_status::ok);
    REQUIRE(next->done());
    CHECK_FALSE(next->ec);
    CHECK(next->reply.str == "for-b!");
    CHECK(m.in_flight() == 0);
}

TEST_CASE("redis_multiplexer: an unsolicited reply (a push nobody asked for) fails everything") {
    SUBCASE("nothing in flight") {
        redis_multiplexer m;
        CHECK(feed(m, "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n") ==
              redis_multiplexer::read_status::unsolicited);
        CHECK(m.closed());
        auto r = request();
        CHECK_FALSE(m.add(r, {"PING"}));
        CHECK(r->ec == errc::unavailable);
    }
    SUBCASE("one more reply than written requests; a queued one was never written") {
        redis_multiplexer m;
        auto sent = request();
        REQUIRE(m.add(sent, {"PING"}));
        (void)written(m);
        auto queued = request();
        REQUIRE(m.add(queued, {"PING"}));
        CHECK(feed(m, "+PONG\r\n+PONG\r\n") == redis_multiplexer::read_status::unsolicited);
        CHECK(sent->reply.str == "PONG");
        CHECK_FALSE(sent->ec);
        REQUIRE(queued->done());
        CHECK(queued->ec == errc::unavailable);
        CHECK_FALSE(queued->written); // certainly had no effect
        CHECK(m.in_flight() == 0);
        CHECK(feed(m, "+PONG\r\n") == redis_multiplexer::read_status::closed);
    }
}

TEST_CASE("redis_multiplexer: with a push handler (a SUBSCRIBE connection), messages go to it in "
          "order and replies still reach their requests") {
    redis_multiplexer m;
    std::vector<redis_reply> pushed;
    m.set_push_handler([&](redis_reply r) { pushed.push_back(std::move(r)); });
    auto sub = request();
    REQUIRE(m.add(sub, {"SUBSCRIBE", "+switch-master"}));
    (void)written(m);
    // The confirmation is the reply to SUBSCRIBE, not a message.
    CHECK(feed(m, "*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n") ==
          redis_multiplexer::read_status::ok);
    REQUIRE(sub->done());
    CHECK(sub->reply.elements.size() == 3);
    CHECK(sub->reply.elements[0].str == "subscribe");
    CHECK(pushed.empty());

    // A message between a PING and its reply (the health check) does not take the reply's place.
    auto ping = request();
    REQUIRE(m.add(ping, {"PING"}));
    (void)written(m);
    const std::string msg1 = "*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$5\r\nfirst\r\n";
    const std::string msg2 = "*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$6\r\nsecond\r\n";
    const std::string pong = "*2\r\n$4\r\npong\r\n$0\r\n\r\n";
    const std::string bytes = msg1 + pong + msg2;
    // Split anywhere, as the socket may deliver it.
    CHECK(feed(m, bytes.substr(0, 20)) == redis_multiplexer::read_status::ok);
    CHECK(feed(m, bytes.substr(20)) == redis_multiplexer::read_status::ok);
    REQUIRE(ping->done());
    CHECK_FALSE(ping->ec);
    CHECK(ping->reply.elements.size() == 2);
    CHECK(ping->reply.elements[0].str == "pong");
    REQUIRE(pushed.size() == 2);
    CHECK(pushed[0].elements[2].str == "first");
    CHECK(pushed[1].elements[2].str == "second");
    CHECK_FALSE(m.closed());
    CHECK(m.in_flight() == 0);

    // A pattern message has four elements; an array that merely starts with "message" but has
    // the wrong shape is no message, and with nobody waiting it is unsolicited.
    CHECK(feed(m, "*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$2\r\nch\r\n$1\r\nx\r\n") ==
          redis_multiplexer::read_status::ok);
    CHECK(pushed.size() == 3);
    CHECK(feed(m, "*2\r\n$7\r\nmessage\r\n$2\r\nch\r\n") ==
          redis_multiplexer::read_status::unsolicited);
    CHECK(m.closed());
}

TEST_CASE("redis_multiplexer: a push handler may close the multiplexer; reading stops there") {
    redis_multiplexer m;
    std::size_t pushes = 0;
    m.set_push_handler([&](redis_reply) {
        ++pushes;
        m.close(errc::unavailable);
    });
    auto waiting = request();
    REQUIRE(m.add(waiting, {"PING"}));
    (void)written(m);
    CHECK(feed(m, "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\na\r\n+PONG\r\n") ==
          redis_multiplexer::read_status::closed);
    CHECK(pushes == 1);
    REQUIRE(waiting->done());
    CHECK(waiting->ec == errc::unavailable);
}

TEST_CASE("redis_multiplexer: a timeout in the middle of a pipeline fails the rest, and the late "
          "reply reaches nobody") {
    redis_multiplexer m;
    std::vector<std::shared_ptr<redis_request>> rs{request(), request(), request()};
    for (auto& r : rs) {
        REQUIRE(m.add(r, {"EVALSHA", "abc", "1", "k"}));
    }
    (void)written(m);
    auto unsent = request();
    REQUIRE(m.add(unsent, {"PING"}));
    REQUIRE(feed(m, ":1\r\n") == redis_multiplexer::read_status::ok);
    CHECK(rs[0]->reply.integer == 1);
    m.on_timeout(rs[1]);
    CHECK(m.closed());
    CHECK(rs[1]->ec == errc::timeout);
    CHECK(rs[1]->written);
    CHECK(rs[2]->ec == errc::unavailable);
    CHECK(rs[2]->written); // may have run: its issuer must not resend it blindly
    CHECK(unsent->ec == errc::unavailable);
    CHECK_FALSE(unsent->written);
    // The reply to rs[1] arrives late: it must not be taken for rs[2]'s.
    CHECK(feed(m, ":2\r\n:3\r\n") == redis_multiplexer::read_status::closed);
    CHECK(rs[2]->reply.type == redis_reply::kind::nil);
    // A timeout of a request that was answered in the meantime changes nothing.
    redis_multiplexer m2;
    auto answered = request();
    REQUIRE(m2.add(answered, {"PING"}));
    (void)written(m2);
    REQUIRE(feed(m2, "+PONG\r\n") == redis_multiplexer::read_status::ok);
    m2.on_timeout(answered);
    CHECK_FALSE(m2.closed());
    CHECK_FALSE(answered->ec);
}

TEST_CASE("redis_multiplexer: a MOVED or ASK error reply completes its request; the connection "
          "stays usable") {
    redis_multiplexer m;
    auto moved = request();
    auto ask = request();
    auto after = request();
    REQUIRE(m.add(moved, {"EVALSHA", "sha", "1", "{k}x"}));
    REQUIRE(m.add(ask, {"EVALSHA", "sha", "1", "{j}x"}));
    REQUIRE(m.add(after, {"PING"}));
    (void)written(m);
    REQUIRE(feed(m, "-MOVED 3999 127.0.0.1:6381\r\n-ASK 12182 127.0.0.1:21002\r\n+PONG\r\n") ==
            redis_multiplexer::read_status::ok);
    CHECK_FALSE(moved->ec);
    CHECK(moved->reply.is_error("MOVED"));
    CHECK(moved->reply.str == "MOVED 3999 127.0.0.1:6381");
    CHECK(ask->reply.is_error("ASK"));
    CHECK(after->reply.str == "PONG");
    CHECK_FALSE(m.closed());
}

TEST_CASE("redis_multiplexer: malformed bytes fail every request as a lost connection") {
    redis_multiplexer m;
    auto r = request();
    REQUIRE(m.add(r, {"PING"}));
    (void)written(m);
    CHECK(feed(m, "?what\r\n") == redis_multiplexer::read_status::protocol);
    CHECK(r->ec == errc::unavailable);
    CHECK(r->written);
    CHECK(m.closed());
}

TEST_CASE("redis_multiplexer: close fails what waits; on_done runs exactly once") {
    redis_multiplexer m;
    auto r = request();
    int notified = 0;
    r->on_done = [&notified] { ++notified; };
    REQUIRE(m.add(r, {"PING"}));
    m.close(errc::unavailable);
    m.close(errc::protocol);
    CHECK(notified == 1);
    CHECK(r->ec == errc::unavailable);
    CHECK_FALSE(m.has_unwritten());
    auto empty = request();
    redis_multiplexer m2;
    CHECK_FALSE(m2.add(empty, {}));
    CHECK(empty->ec == errc::protocol);
}

namespace {

const std::vector<std::string_view> wait_cmd{"WAIT", "1", "50"};
constexpr const char* wait_wire = "*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$2\r\n50\r\n";
constexpr const char* get_wire = "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";

std::shared_ptr<redis_request> join(redis_multiplexer& m,
                                    onceproxy::redis::redis_args wait = wait_cmd) {
    return m.join_wait(wait, [] { return request(); });
}

/// A GET and a WAIT joined behind it, written; with no WAIT unanswered it goes at once.
std::pair<std::shared_ptr<redis_request>, std::shared_ptr<redis_request>>
get_and_wait(redis_multiplexer& m) {
    auto a = request();
    REQUIRE(m.add(a, {"GET", "k"}));
    auto w = join(m);
    REQUIRE(w);
    CHECK(w->st == redis_request::state::queued);
    CHECK(written(m) == std::string(get_wire) + wait_wire);
    return {a, w};
}

} // namespace

TEST_CASE("redis_multiplexer: a shared WAIT goes right behind the command when none is "
          "unanswered") {
    redis_multiplexer m;
    const auto [a, w] = get_and_wait(m);
    CHECK(feed(m, "$1\r\nv\r\n:1\r\n") == redis_multiplexer::read_status::ok);
    CHECK(a->reply.str == "v");
    REQUIRE(w->done());
    CHECK(w->reply.integer == 1);
}

TEST_CASE("redis_multiplexer: commands sent while a WAIT is unanswered share the next one, held "
          "back until that reply") {
    redis_multiplexer m;
    const auto w1 = get_and_wait(m).second;

    auto b = request();
    auto c = request();
    REQUIRE(m.add(b, {"GET", "k"}));
    auto w2 = join(m);
    REQUIRE(m.add(c, {"GET", "k"}));
    auto w2c = join(m);
    CHECK(w2 == w2c); // one WAIT for both
    CHECK(w2->st == redis_request::state::held);
    CHECK_FALSE(w2->written);
    CHECK(written(m) == std::string(get_wire) + get_wire); // the commands go, the WAIT waits
    CHECK(m.in_flight() == 4);

    // The first WAIT's reply releases the held one, behind everything written before it.
    CHECK(feed(m, "$1\r\nv\r\n:1\r\n") == redis_multiplexer::read_status::ok);
    CHECK(w1->done());
    CHECK(m.has_unwritten());
    CHECK(w2->st == redis_request::state::queued);
    CHECK(written(m) == wait_wire);
    CHECK(feed(m, "$1\r\nv\r\n$1\r\nv\r\n:0\r\n") == redis_multiplexer::read_status::ok);
    REQUIRE(w2->done());
    CHECK_FALSE(w2->ec);
    CHECK(w2->reply.integer == 0); // every member reads the same count
    CHECK(b->done());
    CHECK(c->done());

    // Nothing unanswered any more: the next joins a WAIT sent at once.
    get_and_wait(m);
}

TEST_CASE("redis_multiplexer: a held WAIT fails with the connection; an error reply to the WAIT "
          "ahead still releases it") {
    SUBCASE("closed") {
        redis_multiplexer m;
        auto w1 = join(m);
        auto w2 = join(m);
        REQUIRE(w2->st == redis_request::state::held);
        int notified = 0;
        w2->on_done = [&] { ++notified; };
        m.close(errc::unavailable);
        CHECK(w1->ec == errc::unavailable);
        CHECK(w2->ec == errc::unavailable);
        CHECK_FALSE(w2->written);
        CHECK(notified == 1);
        CHECK(join(m) == nullptr);
    }
    SUBCASE("timeout of the WAIT ahead") {
        redis_multiplexer m;
        auto w1 = join(m);
        written(m);
        auto w2 = join(m);
        m.on_timeout(w1);
        CHECK(w1->ec == errc::timeout);
        CHECK(w2->ec == errc::unavailable);
        CHECK(m.closed());
    }
    SUBCASE("error reply") {
        redis_multiplexer m;
        auto w1 = join(m);
        written(m);
        auto w2 = join(m);
        CHECK(feed(m, "-ERR WAIT cannot be used with replica instances\r\n") ==
              redis_multiplexer::read_status::ok);
        CHECK(w1->reply.is_error());
        CHECK(w2->st == redis_request::state::queued);
        CHECK(written(m) == wait_wire);
    }
}

TEST_CASE("redis_multiplexer: a different WAIT command gets a WAIT of its own, sent at once") {
    redis_multiplexer m;
    auto w1 = join(m);
    auto w2 = join(m);
    auto other = join(m, {"WAIT", "2", "50"});
    CHECK(other != w2);
    CHECK(other->st == redis_request::state::queued);
    CHECK(written(m) == std::string(wait_wire) + "*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$2\r\n50\r\n");
    CHECK(join(m) == w2); // the held one is still the one to share
}

TEST_CASE("redis_multiplexer: a WAIT that cannot be encoded fails alone and holds nothing back") {
    redis_multiplexer m;
    auto bad = join(m, {});
    REQUIRE(bad);
    CHECK(bad->ec == errc::protocol);
    auto w = join(m);
    CHECK(w->st == redis_request::state::queued); // sent at once: nothing is unanswered
    CHECK(written(m) == wait_wire);
}
