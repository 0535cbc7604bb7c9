#include "onceproxy/h2/server_session.hpp"

#include <doctest/doctest.h>
#include <nghttp2/nghttp2.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

// The server session driven by a real nghttp2 client session, bytes passed in memory both ways:
// each check is what the peer observes (frames, codes, bodies) or what the caller is told.

namespace h2 = onceproxy::h2;
using namespace std::chrono_literals;

namespace {

const h2::clock::time_point t0{};

// ---- the server side's caller

struct server_request {
    h2::request_head head;
    bool end_stream = false;
    std::string body;
    std::size_t unconsumed = 0;
    bool ended = false;
    std::vector<h2::field> trailers;
    std::optional<h2::error_code> closed;
};

struct recorder : h2::events {
    h2::server_session* session = nullptr;
    std::map<std::int32_t, server_request> requests;
    std::function<void(std::int32_t, const server_request&)> answer; // at on_request
    bool auto_consume = true;
    int rooms = 0;

    void on_request(std::int32_t stream, h2::request_head&& head, bool end_stream) override {
        auto& r = requests[stream];
        r.head = std::move(head);
        r.end_stream = end_stream;
        if (answer) {
            answer(stream, r);
        }
    }
    void on_data(std::int32_t stream, std::span<const char> bytes) override {
        auto& r = requests[stream];
        r.body.append(bytes.data(), bytes.size());
        r.unconsumed += bytes.size();
        if (auto_consume) {
            consume_all(stream);
        }
    }
    void on_request_end(std::int32_t stream, std::vector<h2::field>&& trailers) override {
        requests[stream].ended = true;
        requests[stream].trailers = std::move(trailers);
    }
    void on_stream_close(std::int32_t stream, h2::error_code code) override {
        requests[stream].closed = code;
    }
    void on_send_room(std::int32_t) override { ++rooms; }

    void consume_all(std::int32_t stream) {
        auto& r = requests[stream];
        session->consume(stream, r.unconsumed);
        r.unconsumed = 0;
    }
};

// ---- the peer: an nghttp2 client session

struct client_stream {
    std::string body_out; // request body to send
    std::size_t sent = 0;
    bool body_open = false; // more may be appended: defer instead of ending
    std::vector<h2::field> trailers_out;
    std::map<std::string, std::string> headers; // response head
    std::map<std::string, std::string> trailers;
    std::string body;
    std::optional<std::uint32_t> closed;
};

struct client {
    nghttp2_session* s = nullptr;
    std::map<std::int32_t, client_stream> streams;
    std::optional<std::uint32_t> goaway;
    int pings_acked = 0;

    explicit client(std::uint32_t initial_window = 1 << 20, bool auto_window = true) {
        nghttp2_session_callbacks* cbs = nullptr;
        nghttp2_session_callbacks_new(&cbs);
        nghttp2_session_callbacks_set_on_header_callback(
            cbs, [](nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* n, std::size_t nl,
                    const std::uint8_t* v, std::size_t vl, std::uint8_t, void* u) {
                auto& c = *static_cast<client*>(u);
                auto& st = c.streams[f->hd.stream_id];
                auto& into = f->headers.cat == NGHTTP2_HCAT_HEADERS ? st.trailers : st.headers;
                into[std::string(reinterpret_cast<const char*>(n), nl)] =
                    std::string(reinterpret_cast<const char*>(v), vl);
                return 0;
            });
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
            cbs, [](nghttp2_session*, std::uint8_t, std::int32_t id, const std::uint8_t* d,
                    std::size_t len, void* u) {
                static_cast<client*>(u)->streams[id].body.append(reinterpret_cast<const char*>(d),
                                                                 len);
                return 0;
            });
        nghttp2_session_callbacks_set_on_frame_recv_callback(
            cbs, [](nghttp2_session*, const nghttp2_frame* f, void* u) {
                auto& c = *static_cast<client*>(u);
                if (f->hd.type == NGHTTP2_GOAWAY) {
                    c.goaway = f->goaway.error_code;
                } else if (f->hd.type == NGHTTP2_PING && (f->hd.flags & NGHTTP2_FLAG_ACK)) {
                    ++c.pings_acked;
                }
                return 0;
            });
        nghttp2_session_callbacks_set_on_stream_close_callback(
            cbs, [](nghttp2_session*, std::int32_t id, std::uint32_t code, void* u) {
                static_cast<client*>(u)->streams[id].closed = code;
                return 0;
            });
        nghttp2_option* opt = nullptr;
        nghttp2_option_new(&opt);
        nghttp2_option_set_no_auto_window_update(opt, auto_window ? 0 : 1);
        nghttp2_session_client_new2(&s, cbs, this, opt);
        nghttp2_option_del(opt);
        nghttp2_session_callbacks_del(cbs);
        const nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, initial_window},
                                             {NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
        nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, iv, 2);
    }
    ~client() { nghttp2_session_del(s); }
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    static nghttp2_nv nv(const std::string& n, const std::string& v) {
        return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(n.data())),
                reinterpret_cast<std::uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(),
                NGHTTP2_NV_FLAG_NONE};
    }

    static ssize_t read_body(nghttp2_session* session, std::int32_t id, std::uint8_t* buf,
                             std::size_t len, std::uint32_t* flags, nghttp2_data_source*, void* u) {
        auto& st = static_cast<client*>(u)->streams[id];
        const auto n = std::min(len, st.body_out.size() - st.sent);
        std::memcpy(buf, st.body_out.data() + st.sent, n);
        st.sent += n;
        if (st.sent == st.body_out.size()) {
            if (n == 0 && st.body_open) {
                return NGHTTP2_ERR_DEFERRED;
            }
            if (!st.body_open) {
                *flags |= NGHTTP2_DATA_FLAG_EOF;
                if (!st.trailers_out.empty()) {
                    std::vector<nghttp2_nv> nva;
                    for (const auto& f : st.trailers_out) {
                        nva.push_back(nv(f.name, f.value));
                    }
                    nghttp2_submit_trailer(session, id, nva.data(), nva.size());
                    *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
                }
            }
        }
        return static_cast<ssize_t>(n);
    }

    /// Submits a request; `body` empty and no trailers: END_STREAM on the HEADERS.
    std::int32_t request(const std::string& method, const std::string& path,
                         const std::vector<h2::field>& extra = {}, std::string body = {},
                         std::vector<h2::field> trailers = {}) {
        std::vector<h2::field> fields{{":method", method},
                                      {":scheme", "https"},
                                      {":authority", "example.test"},
                                      {":path", path}};
        fields.insert(fields.end(), extra.begin(), extra.end());
        std::vector<nghttp2_nv> nva;
        for (const auto& f : fields) {
            nva.push_back(nv(f.name, f.value));
        }
        const bool has_body = !body.empty() || !trailers.empty();
        nghttp2_data_provider provider{};
        provider.read_callback = &client::read_body;
        const auto id = nghttp2_submit_request(s, nullptr, nva.data(), nva.size(),
                                               has_body ? &provider : nullptr, nullptr);
        REQUIRE(id > 0);
        streams[id].body_out = std::move(body);
        streams[id].trailers_out = std::move(trailers);
        return id;
    }

    std::string send() {
        std::string out;
        for (;;) {
            const std::uint8_t* p = nullptr;
            const auto n = nghttp2_session_mem_send(s, &p);
            REQUIRE(n >= 0);
            if (n == 0) {
                return out;
            }
            out.append(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
        }
    }

    void recv(const std::string& in) {
        const auto n = nghttp2_session_mem_recv(s, reinterpret_cast<const std::uint8_t*>(in.data()),
                                                in.size());
        REQUIRE(n == static_cast<ssize_t>(in.size()));
    }
};

std::string drain(h2::server_session& server) {
    std::string out;
    for (;;) {
        const auto chunk = server.take_output();
        if (chunk.empty()) {
            return out;
        }
        out.append(chunk.data(), chunk.size());
    }
}

/// Passes bytes both ways until neither side has anything to say.
void pump(client& c, h2::server_session& server, h2::clock::time_point now = t0) {
    for (int i = 0; i < 1000; ++i) {
        const auto up = c.send();
        if (!up.empty()) {
            server.receive({up.data(), up.size()}, now);
        }
        const auto down = drain(server);
        if (!down.empty()) {
            c.recv(down);
        }
        if (up.empty() && down.empty()) {
            return;
        }
    }
    FAIL("the exchange did not settle");
}

// One raw frame: 9-byte header + payload.
std::string frame(std::uint8_t type, std::uint8_t flags, std::uint32_t stream,
                  const std::string& payload = {}) {
    std::string f;
    const auto len = payload.size();
    f += static_cast<char>((len >> 16) & 0xff);
    f += static_cast<char>((len >> 8) & 0xff);
    f += static_cast<char>(len & 0xff);
    f += static_cast<char>(type);
    f += static_cast<char>(flags);
    f += static_cast<char>((stream >> 24) & 0x7f);
    f += static_cast<char>((stream >> 16) & 0xff);
    f += static_cast<char>((stream >> 8) & 0xff);
    f += static_cast<char>(stream & 0xff);
    return f + payload;
}

const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

std::string find_field(const std::vector<h2::field>& fields, const std::string& name) {
    for (const auto& f : fields) {
        if (f.name == name) {
            return f.value;
        }
    }
    return "(absent)";
}

struct fixture {
    recorder ev;
    h2::limits lim;
    std::optional<h2::server_session> server;

    explicit fixture(h2::limits l = {}) : lim(l) {
        server.emplace(ev, lim, t0);
        ev.session = &*server;
    }
};

} // namespace

TEST_SUITE("h2 server session") {

    TEST_CASE("a GET without a body is answered with a body") {
        fixture f;
        f.ev.answer = [&](std::int32_t id, const server_request&) {
            f.server->submit_response(id, 200,
                                      {{"Content-Type", "text/plain"}, {"connection", "x"}}, false);
            f.server->push_body(id, "hello, ");
            f.server->push_body(id, "world");
            f.server->end_body(id);
        };
        client c;
        const auto id = c.request("GET", "/items?a=1", {{"x-request-id", "r1"}});
        pump(c, *f.server);

        const auto& r = f.ev.requests.at(id);
        CHECK(r.head.method == "GET");
        CHECK(r.head.scheme == "https");
        CHECK(r.head.authority == "example.test");
        CHECK(r.head.path == "/items?a=1");
        CHECK(find_field(r.head.fields, "x-request-id") == "r1");
        CHECK_FALSE(r.head.too_large);
        CHECK(r.end_stream);
        REQUIRE(r.closed);
        CHECK(*r.closed == h2::error_code::no_error);

        const auto& got = c.streams.at(id);
        CHECK(got.headers.at(":status") == "200");
        CHECK(got.headers.at("content-type") == "text/plain");
        CHECK_FALSE(got.headers.contains("connection"));
        CHECK(got.body == "hello, world");
        REQUIRE(got.closed);
        CHECK(*got.closed == NGHTTP2_NO_ERROR);
        CHECK(f.server->open_streams() == 0);
        CHECK(f.server->wants_read());
        CHECK_FALSE(f.server->wants_write());
        CHECK(f.server->ended() == h2::end_reason::none);
    }

    TEST_CASE("a request body comes in only as fast as the caller consumes it") {
        h2::limits lim;
        lim.stream_window = 16384;
        fixture f(lim);
        f.ev.auto_consume = false;
        client c;
        pump(c, *f.server); // SETTINGS both ways: the client knows our window
        const std::string body(100000, 'b');
        const auto id = c.request("POST", "/orders", {{"content-type", "application/json"}}, body);
        pump(c, *f.server);
        auto& r = f.ev.requests.at(id);
        CHECK_FALSE(r.end_stream);
        CHECK(r.body.size() == lim.stream_window); // the window, not one byte more
        CHECK_FALSE(r.ended);

        for (int round = 0; round < 100 && !r.ended; ++round) {
            f.ev.consume_all(id);
            pump(c, *f.server);
            CHECK(r.unconsumed <= lim.stream_window);
        }
        CHECK(r.ended);
        CHECK(r.body == body);
        f.server->submit_response(id, 201, {}, true);
        pump(c, *f.server);
        CHECK(c.streams.at(id).headers.at(":status") == "201");
        CHECK(f.server->open_streams() == 0);
    }

    TEST_CASE("body bytes of a reset stream do not keep the connection window shut") {
        h2::limits lim;
        lim.stream_window = 65535;
        lim.connection_window = 65535;
        fixture f(lim);
        f.ev.auto_consume = false;
        client c;
        pump(c, *f.server);
        const auto first = c.request("POST", "/a", {}, std::string(200000, 'a'));
        pump(c, *f.server);
        CHECK(f.ev.requests.at(first).unconsumed == 65535); // taken, never consumed
        f.server->reset(first, h2::error_code::cancel);
        pump(c, *f.server);
        REQUIRE(f.ev.requests.at(first).closed);
        CHECK(*f.ev.requests.at(first).closed == h2::error_code::cancel);

        f.ev.auto_consume = true;
        const std::string body(150000, 'b');
        const auto second = c.request("POST", "/b", {}, body);
        pump(c, *f.server);
        CHECK(f.ev.requests.at(second).body == body);
        CHECK(f.ev.requests.at(second).ended);
    }

    TEST_CASE("an exception from the caller's events ends the connection and propagates") {
        struct boom {};
        fixture f;
        f.ev.answer = [](std::int32_t, const server_request&) { throw boom{}; };
        client c;
        c.request("GET", "/a");
        const auto up = c.send();
        CHECK_THROWS_AS(f.server->receive({up.data(), up.size()}, t0), boom);
        CHECK_FALSE(f.server->wants_read());
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_INTERNAL_ERROR);
    }

    TEST_CASE("a response body is framed as the peer's window allows (queued, on_send_room)") {
        fixture f;
        client c(4096, false); // the peer opens its window only when it says so
        const auto id = c.request("GET", "/big");
        pump(c, *f.server);
        const std::string body(20000, 'r');
        f.server->submit_response(id, 200, {}, false);
        f.server->push_body(id, body);
        CHECK(f.server->queued(id) == body.size());
        pump(c, *f.server);
        auto& got = c.streams.at(id);
        CHECK(got.body.size() == 4096);
        CHECK(f.server->queued(id) == body.size() - 4096);
        CHECK(f.ev.rooms > 0);
        f.server->end_body(id);

        for (int round = 0; round < 100 && !got.closed; ++round) {
            nghttp2_session_consume(c.s, id, got.body.size());
            pump(c, *f.server);
        }
        REQUIRE(got.closed);
        CHECK(*got.closed == NGHTTP2_NO_ERROR);
        CHECK(got.body == body);
        CHECK(f.server->queued(id) == 0);
    }

    TEST_CASE("trailers both ways") {
        fixture f;
        client c;
        const auto id =
            c.request("POST", "/rpc", {{"te", "trailers"}}, "payload", {{"x-checksum", "abc"}});
        pump(c, *f.server);
        auto& r = f.ev.requests.at(id);
        CHECK(r.body == "payload");
        REQUIRE(r.ended);
        CHECK(find_field(r.trailers, "x-checksum") == "abc");

        f.server->submit_response(id, 200, {{"content-type", "application/grpc"}}, false);
        f.server->push_body(id, "reply");
        f.server->end_body(id, {{"grpc-status", "0"}, {"grpc-message", "ok"}});
        pump(c, *f.server);
        const auto& got = c.streams.at(id);
        CHECK(got.body == "reply");
        CHECK(got.trailers.at("grpc-status") == "0");
        CHECK(got.trailers.at("grpc-message") == "ok");
        REQUIRE(got.closed);
        CHECK(*got.closed == NGHTTP2_NO_ERROR);
    }

    TEST_CASE("a header block past max_header_bytes is flagged too large (431)") {
        h2::limits lim;
        lim.max_header_bytes = 1024;
        fixture f(lim);
        f.ev.answer = [&](std::int32_t id, const server_request& r) {
            f.server->submit_response(id, r.head.too_large ? 431 : 200, {}, true);
        };
        client c;
        const auto small = c.request("GET", "/ok", {{"x-small", "1"}});
        const auto big =
            c.request("GET", "/big", {{"x-first", "1"}, {"x-large", std::string(1500, 'v')}});
        pump(c, *f.server);
        CHECK_FALSE(f.ev.requests.at(small).head.too_large);
        const auto& r = f.ev.requests.at(big);
        CHECK(r.head.too_large);
        CHECK(r.head.path == "/big");
        CHECK(find_field(r.head.fields, "x-first") == "1");
        CHECK(find_field(r.head.fields, "x-large") == "(absent)"); // dropped
        CHECK(c.streams.at(small).headers.at(":status") == "200");
        CHECK(c.streams.at(big).headers.at(":status") == "431");
        CHECK(f.server->ended() == h2::end_reason::none);
        CHECK_FALSE(c.goaway);
    }

    TEST_CASE("a header block past four times max_header_bytes ends the connection") {
        h2::limits lim;
        lim.max_header_bytes = 1024;
        fixture f(lim);
        client c;
        pump(c, *f.server);
        c.request("GET", "/huge",
                  {{"x-a", std::string(3000, 'a')}, {"x-b", std::string(3000, 'b')}});
        const auto up = c.send();
        CHECK_FALSE(f.server->receive({up.data(), up.size()}, t0));
        CHECK(f.server->ended() == h2::end_reason::header_flood);
        CHECK_FALSE(f.server->wants_read());
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_ENHANCE_YOUR_CALM);
        CHECK_FALSE(f.server->wants_write());
    }

    TEST_CASE("rapid reset: streams opened and reset past the budget end the connection") {
        fixture f;
        client c;
        pump(c, *f.server);
        std::string up;
        for (int i = 0; i < 250; ++i) {
            const auto id = c.request("GET", "/r");
            up += c.send();
            nghttp2_submit_rst_stream(c.s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
            up += c.send();
        }
        CHECK_FALSE(f.server->receive({up.data(), up.size()}, t0 + 10ms));
        CHECK(f.server->ended() == h2::end_reason::rapid_reset);
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_ENHANCE_YOUR_CALM);
    }

    TEST_CASE("resets within the budget, spread over seconds, are fine") {
        h2::limits lim;
        lim.max_resets_per_second = 50;
        fixture f(lim);
        client c;
        pump(c, *f.server);
        for (int second = 1; second <= 5; ++second) {
            std::string up;
            for (int i = 0; i < 40; ++i) {
                const auto id = c.request("GET", "/r");
                up += c.send();
                nghttp2_submit_rst_stream(c.s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
                up += c.send();
            }
            REQUIRE(f.server->receive({up.data(), up.size()}, t0 + second * 1s));
            c.recv(drain(*f.server));
        }
        CHECK(f.server->ended() == h2::end_reason::none);
        CHECK_FALSE(c.goaway);
    }

    TEST_CASE("PING flood ends the connection (control_flood)") {
        h2::limits lim;
        lim.max_control_frames_per_second = 100;
        fixture f(lim);
        client c;
        pump(c, *f.server);
        const std::string ping = frame(NGHTTP2_PING, 0, 0, std::string(8, 'p'));
        bool open = true;
        int sent = 0;
        while (open && sent < 1000) {
            open = f.server->receive({ping.data(), ping.size()}, t0 + 100ms);
            ++sent;
            c.recv(drain(*f.server));
        }
        CHECK_FALSE(open);
        CHECK(sent == 101 - 2); // the budget, less the SETTINGS and WINDOW_UPDATE of the start
        CHECK(f.server->ended() == h2::end_reason::control_flood);
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_ENHANCE_YOUR_CALM);
    }

    TEST_CASE("the control budget is per second") {
        h2::limits lim;
        lim.max_control_frames_per_second = 100;
        fixture f(lim);
        client c;
        pump(c, *f.server);
        const std::string ping = frame(NGHTTP2_PING, 0, 0, std::string(8, 'p'));
        for (int second = 1; second <= 5; ++second) {
            for (int i = 0; i < 90; ++i) {
                REQUIRE(f.server->receive({ping.data(), ping.size()}, t0 + second * 1s));
            }
            c.recv(drain(*f.server));
        }
        CHECK(c.pings_acked == 450);
        CHECK(f.server->ended() == h2::end_reason::none);
    }

    TEST_CASE("empty DATA frames count as control frames") {
        h2::limits lim;
        lim.max_control_frames_per_second = 50;
        fixture f(lim);
        client c;
        const auto id = c.request("POST", "/slow", {}, "x");
        c.streams[id].body_open = true;
        pump(c, *f.server);
        std::string up;
        for (int i = 0; i < 60; ++i) {
            up += frame(NGHTTP2_DATA, 0, static_cast<std::uint32_t>(id));
        }
        CHECK_FALSE(f.server->receive({up.data(), up.size()}, t0));
        CHECK(f.server->ended() == h2::end_reason::control_flood);
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_ENHANCE_YOUR_CALM);
    }

    TEST_CASE("CONTINUATION flood ends the connection (header_flood)") {
        fixture f;
        client c;
        pump(c, *f.server);
        // HEADERS on stream 1 without END_HEADERS (:method GET, :scheme https, :path /), then
        // CONTINUATION frames that never end the block.
        std::string up = frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM, 1, "\x82\x87\x84");
        for (int i = 0; i < 300; ++i) {
            up += frame(NGHTTP2_CONTINUATION, 0, 1,
                        "\x00\x01"
                        "a\x01"
                        "b");
        }
        CHECK_FALSE(f.server->receive({up.data(), up.size()}, t0));
        CHECK(f.server->ended() == h2::end_reason::header_flood);
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_ENHANCE_YOUR_CALM);
    }

    TEST_CASE("the stream past max_concurrent_streams is refused") {
        h2::limits lim;
        lim.max_concurrent_streams = 2;
        fixture f(lim);
        client c;
        // Sent before the client saw our SETTINGS, as a peer in a hurry would.
        const auto a = c.request("GET", "/a");
        const auto b = c.request("GET", "/b");
        const auto third = c.request("GET", "/c");
        pump(c, *f.server);
        CHECK(f.ev.requests.contains(a));
        CHECK(f.ev.requests.contains(b));
        CHECK_FALSE(f.ev.requests.contains(third));
        CHECK(f.server->open_streams() == 2);
        REQUIRE(c.streams.at(third).closed);
        CHECK(*c.streams.at(third).closed == NGHTTP2_REFUSED_STREAM);
        CHECK(f.server->ended() == h2::end_reason::none);
        CHECK_FALSE(c.goaway);
    }

    TEST_CASE("garbage instead of the preface: protocol_error, GOAWAY") {
        fixture f;
        const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        CHECK_FALSE(f.server->receive({junk.data(), junk.size()}, t0));
        CHECK(f.server->ended() == h2::end_reason::protocol_error);
        CHECK_FALSE(f.server->wants_read());
        client c;
        c.send();
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_PROTOCOL_ERROR);
        CHECK_FALSE(f.server->wants_write());
        // Nothing more is read.
        CHECK_FALSE(f.server->receive({preface.data(), preface.size()}, t0));
    }

    TEST_CASE("a frame the protocol forbids: nghttp2's GOAWAY, protocol_error") {
        fixture f;
        client c;
        pump(c, *f.server);
        // DATA on stream 0 is a connection error (RFC 9113 §6.1).
        const std::string bad = frame(NGHTTP2_DATA, 0, 0, "x");
        CHECK_FALSE(f.server->receive({bad.data(), bad.size()}, t0));
        CHECK(f.server->ended() == h2::end_reason::protocol_error);
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_PROTOCOL_ERROR);
    }

    TEST_CASE("a malformed request is reset and the caller never sees it") {
        fixture f;
        client c;
        // No :path.
        const std::string m = ":method", g = "GET", sc = ":scheme", h = "https", au = ":authority",
                          x = "x";
        const std::vector<nghttp2_nv> nva{client::nv(m, g), client::nv(sc, h), client::nv(au, x)};
        const auto id =
            nghttp2_submit_request(c.s, nullptr, nva.data(), nva.size(), nullptr, nullptr);
        pump(c, *f.server);
        CHECK(f.ev.requests.empty());
        REQUIRE(c.streams.at(id).closed);
        CHECK(*c.streams.at(id).closed == NGHTTP2_PROTOCOL_ERROR);
        CHECK(f.server->ended() == h2::end_reason::none);
        CHECK(f.server->open_streams() == 0);
    }

    TEST_CASE("shutdown: GOAWAY NO_ERROR, the open stream finishes, then the session ends") {
        fixture f;
        client c;
        const auto id = c.request("GET", "/a");
        pump(c, *f.server);
        f.server->shutdown();
        pump(c, *f.server);
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_NO_ERROR);
        CHECK(f.server->ended() == h2::end_reason::none);
        f.server->submit_response(id, 204, {}, true);
        pump(c, *f.server);
        CHECK(c.streams.at(id).headers.at(":status") == "204");
        CHECK_FALSE(f.server->wants_read());
        CHECK_FALSE(f.server->wants_write());
        CHECK(f.server->ended() == h2::end_reason::peer_closed);
    }

    TEST_CASE("terminate: GOAWAY with the code, nothing more read") {
        fixture f;
        client c;
        c.request("GET", "/a");
        pump(c, *f.server);
        f.server->terminate(h2::error_code::no_error);
        c.recv(drain(*f.server));
        REQUIRE(c.goaway);
        CHECK(*c.goaway == NGHTTP2_NO_ERROR);
        CHECK_FALSE(f.server->wants_read());
        CHECK_FALSE(f.server->wants_write());
        CHECK(f.server->ended() != h2::end_reason::none);
    }

    TEST_CASE("the peer's GOAWAY with no open stream ends the session") {
        fixture f;
        client c;
        pump(c, *f.server);
        nghttp2_submit_goaway(c.s, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, nullptr, 0);
        pump(c, *f.server);
        CHECK(f.server->ended() == h2::end_reason::peer_closed);
    }
}
