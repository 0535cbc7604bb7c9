#include "onceproxy/h2/client_session.hpp"

#include "onceproxy/h2/server_session.hpp"

#include <doctest/doctest.h>
#include <nghttp2/nghttp2.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

// The client session driven against two servers, bytes passed in memory both ways: our own
// server_session (both of our sides talking to each other) and a raw nghttp2 server session,
// which also makes the frames a server under test would not (GOAWAY, RST_STREAM, SETTINGS).

namespace h2 = onceproxy::h2;
using namespace std::chrono_literals;

namespace {

const h2::clock::time_point t0{};

std::string find_field(const std::vector<h2::field>& fields, const std::string& name) {
    for (const auto& f : fields) {
        if (f.name == name) {
            return f.value;
        }
    }
    return "(absent)";
}

// ---- the client side's caller

struct client_response {
    std::optional<unsigned> status;
    std::vector<h2::field> fields;
    bool end_stream = false;
    std::string body;
    std::size_t unconsumed = 0;
    bool ended = false;
    std::vector<h2::field> trailers;
    std::optional<h2::error_code> closed;
    bool refused = false;
};

struct client_recorder : h2::client_events {
    h2::client_session* session = nullptr;
    std::map<std::int32_t, client_response> responses;
    bool auto_consume = true;
    int rooms = 0;
    int ping_acks = 0;
    std::optional<std::pair<std::int32_t, h2::error_code>> goaway;

    void on_response(std::int32_t stream, unsigned status, std::vector<h2::field>&& fields,
                     bool end_stream) override {
        auto& r = responses[stream];
        r.status = status;
        r.fields = std::move(fields);
        r.end_stream = end_stream;
    }
    void on_data(std::int32_t stream, std::span<const char> bytes) override {
        auto& r = responses[stream];
        r.body.append(bytes.data(), bytes.size());
        r.unconsumed += bytes.size();
        if (auto_consume) {
            consume_all(stream);
        }
    }
    void on_response_end(std::int32_t stream, std::vector<h2::field>&& trailers) override {
        responses[stream].ended = true;
        responses[stream].trailers = std::move(trailers);
    }
    void on_stream_close(std::int32_t stream, h2::error_code code, bool refused) override {
        auto& r = responses[stream];
        CHECK_FALSE(r.closed); // once
        r.closed = code;
        r.refused = refused;
    }
    void on_send_room(std::int32_t) override { ++rooms; }
    void on_goaway(std::int32_t last, h2::error_code code) override { goaway = {last, code}; }
    void on_ping_ack() override { ++ping_acks; }

    void consume_all(std::int32_t stream) {
        auto& r = responses[stream];
        session->consume(stream, r.unconsumed);
        r.unconsumed = 0;
    }
};

std::string drain(h2::client_session& c) {
    std::string out;
    for (;;) {
        const auto chunk = c.take_output();
        if (chunk.empty()) {
            return out;
        }
        out.append(chunk.data(), chunk.size());
    }
}

// ---- peer 1: our server_session

struct server_request {
    h2::request_head head;
    bool end_stream = false;
    std::string body;
    std::size_t unconsumed = 0;
    bool ended = false;
    std::vector<h2::field> trailers;
    std::optional<h2::error_code> closed;
};

struct server_recorder : h2::events {
    h2::server_session* session = nullptr;
    std::map<std::int32_t, server_request> requests;
    std::function<void(std::int32_t)> answer; // at on_request
    bool auto_consume = true;

    void on_request(std::int32_t stream, h2::request_head&& head, bool end_stream) override {
        auto& r = requests[stream];
        r.head = std::move(head);
        r.end_stream = end_stream;
        if (answer) {
            answer(stream);
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
    void on_send_room(std::int32_t) override {}

    void consume_all(std::int32_t stream) {
        auto& r = requests[stream];
        session->consume(stream, r.unconsumed);
        r.unconsumed = 0;
    }
};

std::string drain(h2::server_session& s) {
    std::string out;
    for (;;) {
        const auto chunk = s.take_output();
        if (chunk.empty()) {
            return out;
        }
        out.append(chunk.data(), chunk.size());
    }
}

struct ours {
    client_recorder cev;
    server_recorder sev;
    std::optional<h2::client_session> client;
    std::optional<h2::server_session> server;

    explicit ours(h2::client_limits cl = {}, h2::limits sl = {}) {
        client.emplace(cev, cl, t0);
        cev.session = &*client;
        server.emplace(sev, sl, t0);
        sev.session = &*server;
    }

    void pump(h2::clock::time_point now = t0) {
        for (int i = 0; i < 1000; ++i) {
            const auto up = drain(*client);
            if (!up.empty()) {
                server->receive({up.data(), up.size()}, now);
            }
            const auto down = drain(*server);
            if (!down.empty()) {
                client->receive({down.data(), down.size()}, now);
            }
            if (up.empty() && down.empty()) {
                return;
            }
        }
        FAIL("the exchange did not settle");
    }
};

// ---- peer 2: a raw nghttp2 server session

struct raw_stream {
    std::map<std::string, std::string> headers;
    std::map<std::string, std::string> trailers;
    std::string body;
    bool ended = false; // END_STREAM received
    std::string body_out;
    std::size_t sent = 0;
    std::optional<std::uint32_t> closed;
};

struct raw_server {
    nghttp2_session* s = nullptr;
    std::map<std::int32_t, raw_stream> streams;

    explicit raw_server(std::vector<nghttp2_settings_entry> settings = {}) {
        nghttp2_session_callbacks* cbs = nullptr;
        nghttp2_session_callbacks_new(&cbs);
        nghttp2_session_callbacks_set_on_header_callback(
            cbs, [](nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* n, std::size_t nl,
                    const std::uint8_t* v, std::size_t vl, std::uint8_t, void* u) {
                auto& st = static_cast<raw_server*>(u)->streams[f->hd.stream_id];
                auto& into = f->headers.cat == NGHTTP2_HCAT_HEADERS ? st.trailers : st.headers;
                into[std::string(reinterpret_cast<const char*>(n), nl)] =
                    std::string(reinterpret_cast<const char*>(v), vl);
                return 0;
            });
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
            cbs, [](nghttp2_session*, std::uint8_t, std::int32_t id, const std::uint8_t* d,
                    std::size_t len, void* u) {
                static_cast<raw_server*>(u)->streams[id].body.append(
                    reinterpret_cast<const char*>(d), len);
                return 0;
            });
        nghttp2_session_callbacks_set_on_frame_recv_callback(
            cbs, [](nghttp2_session*, const nghttp2_frame* f, void* u) {
                if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
                    (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
                    static_cast<raw_server*>(u)->streams[f->hd.stream_id].ended = true;
                }
                return 0;
            });
        nghttp2_session_callbacks_set_on_stream_close_callback(
            cbs, [](nghttp2_session*, std::int32_t id, std::uint32_t code, void* u) {
                static_cast<raw_server*>(u)->streams[id].closed = code;
                return 0;
            });
        nghttp2_session_server_new(&s, cbs, this);
        nghttp2_session_callbacks_del(cbs);
        nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
    }
    ~raw_server() { nghttp2_session_del(s); }
    raw_server(const raw_server&) = delete;
    raw_server& operator=(const raw_server&) = delete;

    static nghttp2_nv nv(const std::string& n, const std::string& v) {
        return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(n.data())),
                reinterpret_cast<std::uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(),
                NGHTTP2_NV_FLAG_NONE};
    }

    static ssize_t read_body(nghttp2_session*, std::int32_t id, std::uint8_t* buf, std::size_t len,
                             std::uint32_t* flags, nghttp2_data_source*, void* u) {
        auto& st = static_cast<raw_server*>(u)->streams[id];
        const auto n = std::min(len, st.body_out.size() - st.sent);
        std::memcpy(buf, st.body_out.data() + st.sent, n);
        st.sent += n;
        if (st.sent == st.body_out.size()) {
            *flags |= NGHTTP2_DATA_FLAG_EOF;
        }
        return static_cast<ssize_t>(n);
    }

    /// Submits a response: `fields` in order (":status" first), then `body` (none: END_STREAM
    /// on the HEADERS).
    void respond(std::int32_t id, const std::vector<h2::field>& fields, std::string body = {}) {
        std::vector<nghttp2_nv> nva;
        for (const auto& f : fields) {
            nva.push_back(nv(f.name, f.value));
        }
        nghttp2_data_provider provider{};
        provider.read_callback = &raw_server::read_body;
        streams[id].body_out = std::move(body);
        REQUIRE(nghttp2_submit_response(s, id, nva.data(), nva.size(),
                                        streams[id].body_out.empty() ? nullptr : &provider) == 0);
    }

    /// An interim (1xx) head, then more may follow.
    void interim(std::int32_t id, const std::string& status) {
        const std::string name = ":status";
        const auto field = nv(name, status);
        REQUIRE(nghttp2_submit_headers(s, NGHTTP2_FLAG_NONE, id, nullptr, &field, 1, nullptr) == 0);
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

struct against_raw {
    client_recorder cev;
    std::optional<h2::client_session> client;
    raw_server server;

    explicit against_raw(std::vector<nghttp2_settings_entry> settings = {},
                         h2::client_limits cl = {})
        : server(std::move(settings)) {
        client.emplace(cev, cl, t0);
        cev.session = &*client;
    }

    void pump(h2::clock::time_point now = t0) {
        for (int i = 0; i < 1000; ++i) {
            const auto up = drain(*client);
            if (!up.empty()) {
                server.recv(up);
            }
            const auto down = server.send();
            if (!down.empty()) {
                client->receive({down.data(), down.size()}, now);
            }
            if (up.empty() && down.empty()) {
                return;
            }
        }
        FAIL("the exchange did not settle");
    }

    std::int32_t get(const std::string& path) {
        const auto id = client->submit_request("GET", "http", "upstream.test", path, {}, true);
        REQUIRE(id);
        return *id;
    }
};

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

} // namespace

TEST_SUITE("h2 client session") {

    TEST_CASE("a GET answered with a body (client_session and server_session)") {
        ours o;
        o.sev.answer = [&](std::int32_t id) {
            o.server->submit_response(id, 200, {{"content-type", "text/plain"}}, false);
            o.server->push_body(id, "hello, ");
            o.server->push_body(id, "world");
            o.server->end_body(id);
        };
        const auto id = o.client->submit_request(
            "GET", "https", "upstream.test", "/items?a=1",
            {{"X-Request-Id", "r1"}, {"connection", "close"}, {":path", "/evil"}}, true);
        REQUIRE(id);
        CHECK(*id == 1);
        CHECK(o.client->open_streams() == 1);
        o.pump();

        const auto& req = o.sev.requests.at(*id);
        CHECK(req.head.method == "GET");
        CHECK(req.head.scheme == "https");
        CHECK(req.head.authority == "upstream.test");
        CHECK(req.head.path == "/items?a=1");
        CHECK(find_field(req.head.fields, "x-request-id") == "r1");
        CHECK(find_field(req.head.fields, "connection") == "(absent)");
        CHECK(req.end_stream);

        const auto& r = o.cev.responses.at(*id);
        CHECK(r.status == 200U);
        CHECK(find_field(r.fields, "content-type") == "text/plain");
        CHECK_FALSE(r.end_stream);
        CHECK(r.body == "hello, world");
        CHECK(r.ended);
        CHECK(r.trailers.empty());
        REQUIRE(r.closed);
        CHECK(*r.closed == h2::error_code::no_error);
        CHECK_FALSE(r.refused);
        CHECK(o.client->open_streams() == 0);
        CHECK(o.client->can_open_stream());
        CHECK(o.client->peer_max_concurrent_streams() == 100);
        CHECK(o.client->wants_read());
        CHECK_FALSE(o.client->wants_write());
        CHECK(o.client->ended() == h2::end_reason::none);
    }

    TEST_CASE("a response without a body; streams multiplexed on one connection") {
        ours o;
        o.sev.answer = [&](std::int32_t id) {
            o.server->submit_response(id, id == 1 ? 204 : 404, {}, true);
        };
        const auto a = o.client->submit_request("DELETE", "https", "u", "/a", {}, true);
        const auto b = o.client->submit_request("GET", "https", "u", "/b", {}, true);
        REQUIRE(a);
        REQUIRE(b);
        CHECK(*b == 3);
        o.pump();
        CHECK(o.cev.responses.at(*a).status == 204U);
        CHECK(o.cev.responses.at(*a).end_stream);
        CHECK_FALSE(o.cev.responses.at(*a).ended); // on_response said end_stream
        CHECK(o.cev.responses.at(*b).status == 404U);
        CHECK(o.cev.responses.at(*b).closed == h2::error_code::no_error);
    }

    TEST_CASE("a request body is framed as the server's window allows (queued, on_send_room)") {
        h2::limits sl;
        sl.stream_window = 16384;
        ours o({}, sl);
        o.sev.auto_consume = false;
        o.pump(); // SETTINGS both ways: the client knows the server's window
        const auto id = o.client->submit_request("POST", "https", "u", "/orders",
                                                 {{"content-type", "application/json"}}, false);
        REQUIRE(id);
        const std::string body(100000, 'b');
        o.client->push_body(*id, body);
        CHECK(o.client->queued(*id) == body.size());
        o.pump();
        auto& req = o.sev.requests.at(*id);
        CHECK_FALSE(req.end_stream);
        CHECK(req.body.size() == sl.stream_window); // the window, not one byte more
        CHECK(o.client->queued(*id) == body.size() - sl.stream_window);
        CHECK(o.cev.rooms > 0);

        o.client->end_body(*id);
        for (int round = 0; round < 100 && !req.ended; ++round) {
            o.sev.consume_all(*id);
            o.pump();
        }
        CHECK(req.ended);
        CHECK(req.body == body);
        CHECK(o.client->queued(*id) == 0);
        o.server->submit_response(*id, 201, {}, true);
        o.pump();
        CHECK(o.cev.responses.at(*id).status == 201U);
        CHECK(o.cev.responses.at(*id).closed == h2::error_code::no_error);
    }

    TEST_CASE("a response body comes in only as fast as the caller consumes it") {
        h2::client_limits cl;
        cl.stream_window = 16384;
        ours o(cl);
        o.cev.auto_consume = false;
        const auto id = o.client->submit_request("GET", "https", "u", "/big", {}, true);
        REQUIRE(id);
        o.pump();
        const std::string body(100000, 'r');
        o.server->submit_response(*id, 200, {}, false);
        o.server->push_body(*id, body);
        o.server->end_body(*id);
        o.pump();
        auto& r = o.cev.responses.at(*id);
        CHECK(r.body.size() == cl.stream_window); // the server cannot send more
        CHECK(o.server->queued(*id) == body.size() - cl.stream_window);

        for (int round = 0; round < 100 && !r.closed; ++round) {
            o.cev.consume_all(*id);
            o.pump();
            CHECK(r.unconsumed <= cl.stream_window);
        }
        CHECK(r.ended);
        CHECK(r.body == body);
        CHECK(r.closed == h2::error_code::no_error);
    }

    TEST_CASE("unconsumed bytes of a closed stream go back to the connection window") {
        h2::client_limits cl;
        cl.stream_window = 65535;
        cl.connection_window = 65535;
        ours o(cl);
        o.cev.auto_consume = false;
        o.sev.answer = [&](std::int32_t id) {
            o.server->submit_response(id, 200, {}, false);
            o.server->push_body(id, std::string(60000, 'x'));
            o.server->end_body(id);
        };
        for (int i = 0; i < 3; ++i) {
            const auto id = o.client->submit_request("GET", "https", "u", "/", {}, true);
            REQUIRE(id);
            o.pump();
            const auto& r = o.cev.responses.at(*id);
            CHECK(r.body.size() == 60000); // never consumed, yet the connection is not stuck
            CHECK(r.closed == h2::error_code::no_error);
        }
    }

    TEST_CASE("trailers both ways") {
        ours o;
        const auto id =
            o.client->submit_request("POST", "https", "u", "/rpc", {{"te", "trailers"}}, false);
        REQUIRE(id);
        o.client->push_body(*id, "payload");
        o.client->end_body(*id, {{"x-checksum", "abc"}});
        o.pump();
        auto& req = o.sev.requests.at(*id);
        CHECK(req.body == "payload");
        REQUIRE(req.ended);
        CHECK(find_field(req.trailers, "x-checksum") == "abc");
        CHECK(find_field(req.head.fields, "te") == "trailers"); // the one TE HTTP/2 allows

        o.server->submit_response(*id, 200, {{"content-type", "application/grpc"}}, false);
        o.server->push_body(*id, "reply");
        o.server->end_body(*id, {{"grpc-status", "0"}, {"grpc-message", "ok"}});
        o.pump();
        const auto& r = o.cev.responses.at(*id);
        CHECK(r.body == "reply");
        REQUIRE(r.ended);
        CHECK(find_field(r.trailers, "grpc-status") == "0");
        CHECK(find_field(r.trailers, "grpc-message") == "ok");
        CHECK(r.closed == h2::error_code::no_error);
    }

    TEST_CASE("raw nghttp2 server: GET, interim 103 skipped, the final response") {
        against_raw a;
        const auto id = a.client->submit_request("GET", "http", "upstream.test", "/x",
                                                 {{"accept", "*/*"}}, true);
        REQUIRE(id);
        a.pump();
        const auto& got = a.server.streams.at(*id);
        CHECK(got.headers.at(":method") == "GET");
        CHECK(got.headers.at(":scheme") == "http");
        CHECK(got.headers.at(":authority") == "upstream.test");
        CHECK(got.headers.at(":path") == "/x");
        CHECK(got.headers.at("accept") == "*/*");
        CHECK(got.ended);

        a.server.interim(*id, "103");
        a.server.respond(*id, {{":status", "200"}, {"x-a", "1"}}, "body");
        a.pump();
        const auto& r = a.cev.responses.at(*id);
        CHECK(r.status == 200U);
        CHECK(find_field(r.fields, "x-a") == "1");
        CHECK(r.body == "body");
        CHECK(r.ended);
        CHECK(r.closed == h2::error_code::no_error);
    }

    TEST_CASE("the server's SETTINGS_MAX_CONCURRENT_STREAMS bounds the open streams") {
        against_raw a({{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 2}});
        CHECK(a.client->peer_max_concurrent_streams() == 100); // until the SETTINGS arrive
        a.pump();
        CHECK(a.client->peer_max_concurrent_streams() == 2);
        CHECK(a.client->can_open_stream());
        const auto s1 = a.get("/1");
        CHECK(a.client->can_open_stream());
        const auto s3 = a.get("/3");
        CHECK_FALSE(a.client->can_open_stream());
        CHECK_FALSE(a.client->submit_request("GET", "http", "u", "/5", {}, true));
        a.pump();
        a.server.respond(s1, {{":status", "200"}});
        a.pump();
        CHECK(a.cev.responses.at(s1).closed == h2::error_code::no_error);
        CHECK(a.client->open_streams() == 1);
        CHECK(a.client->can_open_stream());
        CHECK(a.server.streams.contains(s3));
    }

    TEST_CASE("GOAWAY: streams above its last-stream-id are refused, the others finish") {
        against_raw a;
        const auto s1 = a.get("/1");
        const auto s3 = a.get("/3");
        a.pump();
        REQUIRE(a.server.streams.contains(s3));
        REQUIRE(nghttp2_submit_goaway(a.server.s, NGHTTP2_FLAG_NONE, s1, NGHTTP2_NO_ERROR, nullptr,
                                      0) == 0);
        a.pump();
        REQUIRE(a.cev.goaway);
        CHECK(a.cev.goaway->first == s1);
        CHECK(a.cev.goaway->second == h2::error_code::no_error);
        CHECK_FALSE(a.client->can_open_stream());
        CHECK_FALSE(a.client->submit_request("GET", "http", "u", "/5", {}, true));
        const auto& r3 = a.cev.responses.at(s3);
        REQUIRE(r3.closed);
        CHECK(r3.refused);
        CHECK_FALSE(a.cev.responses.contains(s1)); // still open

        a.server.respond(s1, {{":status", "200"}}, "done");
        a.pump();
        const auto& r1 = a.cev.responses.at(s1);
        CHECK(r1.body == "done");
        CHECK(r1.closed == h2::error_code::no_error);
        CHECK_FALSE(r1.refused);
        CHECK(a.client->open_streams() == 0);
        CHECK(a.client->ended() == h2::end_reason::peer_closed);
    }

    TEST_CASE("RST_STREAM REFUSED_STREAM: refused; another code: not refused") {
        against_raw a;
        const auto s1 = a.get("/1");
        const auto s3 = a.get("/3");
        a.pump();
        nghttp2_submit_rst_stream(a.server.s, NGHTTP2_FLAG_NONE, s1, NGHTTP2_REFUSED_STREAM);
        nghttp2_submit_rst_stream(a.server.s, NGHTTP2_FLAG_NONE, s3, NGHTTP2_INTERNAL_ERROR);
        a.pump();
        CHECK(a.cev.responses.at(s1).closed == h2::error_code::refused_stream);
        CHECK(a.cev.responses.at(s1).refused);
        CHECK(a.cev.responses.at(s3).closed == h2::error_code::internal_error);
        CHECK_FALSE(a.cev.responses.at(s3).refused);
        CHECK(a.client->can_open_stream()); // the connection goes on
    }

    TEST_CASE("a request not sent yet when the GOAWAY arrives is refused") {
        against_raw a;
        const auto s1 = a.get("/1");
        a.pump();
        REQUIRE(nghttp2_submit_goaway(a.server.s, NGHTTP2_FLAG_NONE, s1, NGHTTP2_NO_ERROR, nullptr,
                                      0) == 0);
        const auto goaway = a.server.send();
        const auto s3 = a.get("/3"); // submitted, not framed yet
        CHECK(a.client->receive({goaway.data(), goaway.size()}, t0));
        const auto& r3 = a.cev.responses.at(s3);
        CHECK(r3.closed == h2::error_code::refused_stream);
        CHECK(r3.refused);
        CHECK_FALSE(a.cev.responses.contains(s1));
        a.pump();
        CHECK_FALSE(a.server.streams.contains(s3)); // never seen by the server
    }

    TEST_CASE("a stream reset before its request left closes with the caller's code") {
        against_raw a;
        a.pump();
        const auto s1 = a.get("/1");
        a.client->reset(s1, h2::error_code::cancel);
        a.pump();
        const auto& r = a.cev.responses.at(s1);
        CHECK(r.closed == h2::error_code::cancel);
        CHECK(r.refused); // never sent
        CHECK(a.client->open_streams() == 0);
        CHECK_FALSE(a.server.streams.contains(s1));
        const auto s3 = a.get("/3");
        a.pump();
        a.server.respond(s3, {{":status", "200"}});
        a.pump();
        CHECK(a.cev.responses.at(s3).closed == h2::error_code::no_error);
    }

    TEST_CASE("a 101 response fails the stream") {
        against_raw a;
        const auto s1 = a.get("/1");
        a.pump();
        a.server.interim(s1, "101");
        a.server.respond(s1, {{":status", "200"}}, "body");
        a.pump();
        const auto& r = a.cev.responses.at(s1);
        CHECK_FALSE(r.status);
        CHECK(r.closed == h2::error_code::protocol_error);
        CHECK_FALSE(r.refused);
    }

    TEST_CASE("a reset after the response head: the stream fails, not refused") {
        against_raw a;
        const auto s1 = a.get("/1");
        a.pump();
        a.server.respond(s1, {{":status", "200"}}, std::string(10, 'x'));
        a.pump();
        CHECK(a.cev.responses.at(s1).status == 200U);
        CHECK(a.cev.responses.at(s1).closed == h2::error_code::no_error);

        const auto s3 = a.client->submit_request("POST", "http", "u", "/3", {}, false);
        REQUIRE(s3);
        a.client->push_body(*s3, "part");
        a.pump();
        nghttp2_submit_rst_stream(a.server.s, NGHTTP2_FLAG_NONE, *s3, NGHTTP2_CANCEL);
        a.pump();
        CHECK(a.cev.responses.at(*s3).closed == h2::error_code::cancel);
        CHECK_FALSE(a.cev.responses.at(*s3).refused);
        CHECK(a.client->queued(*s3) == 0);
    }

    TEST_CASE("PING: the ack is observed") {
        against_raw a;
        a.pump();
        CHECK_FALSE(a.client->ping_sent());
        a.client->ping(t0 + 5s);
        REQUIRE(a.client->ping_sent());
        CHECK(*a.client->ping_sent() == t0 + 5s);
        a.pump(t0 + 6s);
        CHECK(a.cev.ping_acks == 1);
        CHECK_FALSE(a.client->ping_sent());
        REQUIRE(a.client->last_ping_ack());
        CHECK(*a.client->last_ping_ack() == t0 + 6s);
    }

    TEST_CASE("a response header block past max_header_bytes fails the stream") {
        h2::client_limits cl;
        cl.max_header_bytes = 1024;
        against_raw a({}, cl);
        // A request body still open: the stream stays open after the response, for the reset.
        const auto post = a.client->submit_request("POST", "http", "u", "/big", {}, false);
        REQUIRE(post);
        const auto big = *post;
        const auto ok = a.get("/ok");
        a.pump();
        a.server.respond(big,
                         {{":status", "200"},
                          {"x-1", std::string(400, 'a')},
                          {"x-2", std::string(400, 'b')},
                          {"x-3", std::string(400, 'c')}},
                         "body");
        a.server.respond(ok, {{":status", "200"}, {"x-1", std::string(400, 'a')}}, "fine");
        a.pump();
        const auto& r = a.cev.responses.at(big);
        CHECK_FALSE(r.status); // no response
        CHECK(r.body.empty());
        CHECK(r.closed == h2::error_code::protocol_error);
        CHECK_FALSE(r.refused);
        CHECK(a.server.streams.at(big).closed == NGHTTP2_PROTOCOL_ERROR); // reset by the client
        CHECK(a.cev.responses.at(ok).body == "fine");
        CHECK(a.client->ended() == h2::end_reason::none);
    }

    TEST_CASE("a server flooding PING frames is cut (control_flood)") {
        h2::client_limits cl;
        cl.max_control_frames_per_second = 50;
        against_raw a({}, cl);
        a.pump();
        const auto id = a.get("/1");
        a.pump();
        std::string flood;
        for (int i = 0; i < 60; ++i) {
            flood += frame(NGHTTP2_PING, 0, 0, std::string(8, '\0'));
        }
        CHECK_FALSE(a.client->receive({flood.data(), flood.size()}, t0 + 10s));
        CHECK(a.client->ended() == h2::end_reason::control_flood);
        const auto& r = a.cev.responses.at(id);
        CHECK(r.closed == h2::error_code::enhance_your_calm);
        CHECK_FALSE(r.refused); // it was sent: the server may have run it
        const auto out = drain(*a.client);
        a.server.recv(out); // the GOAWAY
        CHECK_FALSE(a.client->wants_read());
    }

    TEST_CASE("the WINDOW_UPDATE frames of a fast upload are not a flood") {
        h2::client_limits cl;
        cl.max_control_frames_per_second = 20;
        ours o(cl);
        const auto id = o.client->submit_request("PUT", "https", "u", "/blob", {}, false);
        REQUIRE(id);
        const std::string chunk(64 * 1024, 'u');
        for (int i = 0; i < 64; ++i) { // 4 MiB within one second
            o.client->push_body(*id, chunk);
            o.pump();
        }
        o.client->end_body(*id);
        o.pump();
        CHECK(o.client->ended() == h2::end_reason::none);
        const auto& req = o.sev.requests.at(*id);
        CHECK(req.ended);
        CHECK(req.body.size() == 64 * chunk.size());
    }

    TEST_CASE("the WINDOW_UPDATE frames of a fast download are not a flood") {
        h2::limits sl;
        sl.max_control_frames_per_second = 20;
        ours o({}, sl);
        const auto id = o.client->submit_request("GET", "https", "u", "/blob", {}, true);
        REQUIRE(id);
        o.pump();
        o.server->submit_response(*id, 200, {}, false);
        const std::string chunk(64 * 1024, 'd');
        for (int i = 0; i < 64; ++i) { // 4 MiB within one second
            o.server->push_body(*id, chunk);
            o.pump();
        }
        o.server->end_body(*id);
        o.pump();
        CHECK(o.server->ended() == h2::end_reason::none);
        const auto& r = o.cev.responses.at(*id);
        CHECK(r.body.size() == 64 * chunk.size());
    }

    TEST_CASE("endless interim responses fail the stream") {
        against_raw a;
        const auto s1 = a.get("/1");
        a.pump();
        for (int i = 0; i < 20; ++i) {
            a.server.interim(s1, "103");
        }
        a.pump();
        const auto& r = a.cev.responses.at(s1);
        CHECK_FALSE(r.status);
        CHECK(r.closed == h2::error_code::protocol_error);
    }

    TEST_CASE("terminate: open streams close with the code; unsent ones are refused") {
        ours o;
        const auto sent = o.client->submit_request("GET", "https", "u", "/1", {}, true);
        REQUIRE(sent);
        o.pump();
        const auto unsent = o.client->submit_request("GET", "https", "u", "/3", {}, true);
        REQUIRE(unsent);
        o.client->terminate(h2::error_code::cancel);
        CHECK(o.cev.responses.at(*sent).closed == h2::error_code::cancel);
        CHECK_FALSE(o.cev.responses.at(*sent).refused);
        CHECK(o.cev.responses.at(*unsent).refused);
        CHECK(o.client->open_streams() == 0);
        CHECK_FALSE(o.client->can_open_stream());
        o.pump();
        CHECK(o.client->ended() == h2::end_reason::peer_closed);
        CHECK_FALSE(o.client->wants_write());
    }

    TEST_CASE("shutdown: GOAWAY, the open stream finishes, then the session ends") {
        ours o;
        const auto id = o.client->submit_request("GET", "https", "u", "/1", {}, true);
        REQUIRE(id);
        o.pump();
        o.client->shutdown();
        CHECK_FALSE(o.client->can_open_stream());
        o.pump();
        CHECK(o.client->ended() == h2::end_reason::none); // the stream is still open
        o.server->submit_response(*id, 200, {}, true);
        o.pump();
        CHECK(o.cev.responses.at(*id).closed == h2::error_code::no_error);
        CHECK(o.client->ended() == h2::end_reason::peer_closed);
    }
}
