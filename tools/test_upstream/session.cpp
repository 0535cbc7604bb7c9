#include "session.hpp"
#include "tls_front.hpp"

#include "attempt_log.hpp"
#include "request_facts.hpp"
#include "stream_releases.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/websocket/stream.hpp>

#include <array>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>

namespace onceproxy::test_upstream {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

// Large enough that tests never hit them by accident. Request bodies are counted and hashed,
// never kept, so the body limit costs no memory.
constexpr std::uint64_t body_limit = std::uint64_t{64} << 30;
constexpr std::uint32_t header_limit = std::uint32_t{64} << 10;

// X-Test-Body-Bytes above this is generated and written piece by piece (bounded memory).
constexpr std::uint64_t stream_threshold = std::uint64_t{1} << 20;
constexpr std::size_t piece_size = std::size_t{64} << 10;

// How long a held event stream waits for POST /__release before it ends anyway.
constexpr auto release_timeout = std::chrono::seconds(10);

void append_number(std::string& out, std::uint64_t n) {
    std::array<char, 24> buf{};
    auto const res = std::to_chars(buf.data(), buf.data() + buf.size(), n);
    out.append(buf.data(), res.ptr);
}

// Exactly 16 lowercase hex digits.
void append_hex16(std::string& out, std::uint64_t n) {
    static constexpr char hex[] = "0123456789abcdef";
    for (int shift = 60; shift >= 0; shift -= 4)
        out += hex[(n >> shift) & 0xf];
}

// JSON string literal (RFC 8259 §7); bytes >= 0x80 pass through unchanged.
void append_json_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out += '"';
    for (char c : s) {
        auto const u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20) {
            out += "\\u00";
            out += hex[u >> 4];
            out += hex[u & 0xf];
        } else {
            out += c;
        }
    }
    out += '"';
}

// IMF-fixdate of the current second, cached per thread.
std::string_view http_date() {
    thread_local std::time_t cached_second = 0;
    thread_local std::array<char, 64> text{};
    thread_local std::size_t length = 0;
    std::time_t const now = std::time(nullptr);
    if (now != cached_second) {
        std::tm tm{};
        gmtime_r(&now, &tm);
        length = std::strftime(text.data(), text.size(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        cached_second = now;
    }
    return {text.data(), length};
}

std::string const& execution_id_prefix() {
    static std::string const prefix = "ex-" + std::to_string(::getpid()) + "-";
    return prefix;
}

// %XX-decodes a query component ('+' stays '+': keys are sent percent-encoded).
std::string percent_decode(std::string_view s) {
    auto const nibble = [](char c) -> int {
        if (c >= '0' && c <= '9')
            return c - '0';
        if (c >= 'a' && c <= 'f')
            return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
            return c - 'A' + 10;
        return -1;
    };
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size() && nibble(s[i + 1]) >= 0 && nibble(s[i + 2]) >= 0) {
            out += static_cast<char>(nibble(s[i + 1]) * 16 + nibble(s[i + 2]));
            i += 2;
        } else {
            out += s[i];
        }
    }
    return out;
}

// Value of query parameter `name` in `target`, if present.
std::optional<std::string> query_param(std::string_view target, std::string_view name) {
    auto const q = target.find('?');
    if (q == std::string_view::npos)
        return std::nullopt;
    std::string_view rest = target.substr(q + 1);
    while (!rest.empty()) {
        auto const amp = rest.find('&');
        std::string_view const pair = rest.substr(0, amp);
        rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
        auto const eq = pair.find('=');
        if (pair.substr(0, eq) == name)
            return percent_decode(eq == std::string_view::npos ? std::string_view{}
                                                               : pair.substr(eq + 1));
    }
    return std::nullopt;
}

/// One response about to be written: `head` is built by `build_head`, `body` is sent as is.
struct reply {
    unsigned status = 200;
    std::string_view content_type;
    std::string_view execution_id; // empty: no X-Execution-Id and no echo headers
    bool chunked = false;
    bool keep_alive = true;
    bool head_request = false;
};

bool status_allows_body(unsigned status) {
    return status >= 200 && status != 204 && status != 304;
}

void build_head(std::string& head, reply const& r, request_facts const& f, std::size_t body_size) {
    head.clear();
    head += "HTTP/1.1 ";
    append_number(head, r.status);
    head += ' ';
    auto const st = beast::http::int_to_status(r.status);
    head += st == beast::http::status::unknown ? std::string_view("Unknown")
                                               : std::string_view(beast::http::obsolete_reason(st));
    head += "\r\nDate: ";
    head += http_date();
    head += "\r\n";
    if (status_allows_body(r.status)) {
        head += "Content-Type: ";
        head += r.content_type;
        if (r.chunked) {
            head += "\r\nTransfer-Encoding: chunked\r\n";
        } else {
            head += "\r\nContent-Length: ";
            append_number(head, body_size);
            head += "\r\n";
        }
    }
    if (!r.execution_id.empty()) {
        head += "X-Execution-Id: ";
        head += r.execution_id;
        head += "\r\n";
        auto const echo = [&](std::string_view name, bool present, std::string_view value) {
            if (!present)
                return;
            head += name;
            head += ": ";
            head += value;
            head += "\r\n";
        };
        echo("X-Echo-Forwarded-For", f.has_forwarded_for, f.forwarded_for);
        echo("X-Echo-Forwarded-Proto", f.has_forwarded_proto, f.forwarded_proto);
        echo("X-Echo-Forwarded-Host", f.has_forwarded_host, f.forwarded_host);
        echo("X-Echo-Forwarded", f.has_forwarded, f.forwarded);
        echo("X-Echo-Connection", f.has_connection, f.connection);
        echo("X-Echo-Hop", !f.hop.empty(), f.hop);
        head += f.extra_headers;
    }
    if (!r.keep_alive)
        head += "Connection: close\r\n";
    else if (f.version < 11)
        head += "Connection: keep-alive\r\n";
    head += "\r\n";
}

/// Serialises and writes one reply; false when the connection failed.
net::awaitable<bool> write_reply(tcp::socket& socket, reply const& r, request_facts const& f,
                                 std::string& head, std::string_view body) {
    if (!status_allows_body(r.status))
        body = {};
    build_head(head, r, f, body.size());
    if (r.head_request)
        body = {};
    std::array<char, 24> chunk_size{};
    std::size_t chunk_size_len = 0;
    std::string trailer;
    if (r.chunked && status_allows_body(r.status) && !r.head_request) {
        // The whole body as one chunk, then the last chunk (RFC 9112 §7.1) and, on request, a
        // trailer field of X-Test-Trailer-Bytes bytes.
        if (!body.empty()) {
            auto const res =
                std::to_chars(chunk_size.data(), chunk_size.data() + 20, body.size(), 16);
            chunk_size_len = static_cast<std::size_t>(res.ptr - chunk_size.data());
            chunk_size[chunk_size_len++] = '\r';
            chunk_size[chunk_size_len++] = '\n';
            trailer = "\r\n";
        }
        trailer += "0\r\n";
        if (f.trailer_bytes > 0) {
            trailer += "X-Test-Trailer: ";
            trailer.append(f.trailer_bytes, 't');
            trailer += "\r\n";
        }
        trailer += "\r\n";
    }
    std::array<net::const_buffer, 4> const buffers{
        net::buffer(head), net::buffer(chunk_size.data(), chunk_size_len),
        net::buffer(body.data(), body.size()), net::buffer(trailer.data(), trailer.size())};
    auto [ec, n] = co_await net::async_write(socket, buffers, use_tuple);
    co_return !ec;
}

void close_socket(tcp::socket& socket) {
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
}

// Status for a request that failed to parse, or 0 when the connection just went away.
unsigned failure_status(beast::error_code const& ec) {
    if (ec.category() != beast::http::make_error_code(beast::http::error::end_of_stream).category())
        return 0;
    if (ec == beast::http::error::end_of_stream || ec == beast::http::error::partial_message)
        return 0;
    if (ec == beast::http::error::body_limit)
        return 413;
    if (ec == beast::http::error::header_limit)
        return 431;
    return 400;
}

void fill_body(std::string& body, request_facts const& f, std::string_view execution_id) {
    body.clear();
    if (f.binary) {
        // Every byte value 0x00..0xff in order, repeated: catches any text-mode mangling.
        body.resize(f.body_size.value_or(256));
        for (std::size_t i = 0; i < body.size(); ++i)
            body[i] = static_cast<char>(static_cast<unsigned char>(i & 0xff));
    } else if (f.body_size) {
        // Byte i is 'a' + i % 26: easy to regenerate and compare in a test.
        body.resize(*f.body_size);
        for (std::size_t i = 0; i < body.size(); ++i)
            body[i] = static_cast<char>('a' + i % 26);
    } else {
        body += "{\"execution_id\":";
        append_json_string(body, execution_id);
        body += ",\"method\":";
        append_json_string(body, f.method);
        body += ",\"path\":";
        append_json_string(body, f.target);
        body += ",\"key\":";
        if (f.has_key)
            append_json_string(body, f.key);
        else
            body += "null";
        body += ",\"body_bytes\":";
        append_number(body, f.body_bytes);
        body += ",\"body_fnv1a\":\"";
        append_hex16(body, f.body_fnv1a);
        body += "\"}";
    }
}

/// Answers the /__* control endpoints; false when `path` is not one of them.
bool control_reply(std::string_view path, request_facts const& f, execution_counts& counts,
                   stream_releases& releases, attempt_log& attempts, reply& r, std::string& body) {
    body.clear();
    if (path == "/__health") {
        r.content_type = "text/plain";
        body = "ok";
    } else if (path == "/__counts") {
        r.content_type = "application/json";
        body += "{\"total\":";
        append_number(body, counts.total());
        body += ",\"keys\":{";
        bool first = true;
        for (auto const& [key, n] : counts.keys()) {
            if (!first)
                body += ',';
            first = false;
            append_json_string(body, key);
            body += ':';
            append_number(body, n);
        }
        body += "}}";
    } else if (path == "/__count") {
        std::string const key = query_param(f.target, "key").value_or(std::string{});
        r.content_type = "application/json";
        body += "{\"key\":";
        append_json_string(body, key);
        body += ",\"count\":";
        append_number(body, counts.count(key));
        body += '}';
    } else if (path == "/__attempts") {
        std::string const key = query_param(f.target, "key").value_or(std::string{});
        r.content_type = "application/json";
        body += "{\"key\":";
        append_json_string(body, key);
        body += ",\"at_ms\":[";
        bool first = true;
        for (double const at : attempts.times(key)) {
            if (!first)
                body += ',';
            first = false;
            std::array<char, 32> buf{};
            auto const res =
                std::to_chars(buf.data(), buf.data() + buf.size(), at, std::chars_format::fixed, 3);
            body.append(buf.data(), res.ptr);
        }
        body += "]}";
    } else if (path == "/__tls") {
        auto const& tls = tls_stats();
        r.content_type = "application/json";
        body += "{\"handshakes\":";
        append_number(body, tls.handshakes.load());
        body += ",\"resumed\":";
        append_number(body, tls.resumed.load());
        body += ",\"failed\":";
        append_number(body, tls.failed.load());
        body += '}';
    } else if (path == "/__reset") {
        counts.reset();
        attempts.reset();
        r.status = 204;
    } else if (path == "/__release") {
        std::string const id = query_param(f.target, "id").value_or(std::string{});
        bool const waiting = releases.release(id);
        r.content_type = "application/json";
        body += "{\"id\":";
        append_json_string(body, id);
        body += ",\"waiting\":";
        body += waiting ? "true" : "false";
        body += '}';
    } else {
        return false;
    }
    return true;
}

// Piece `offset .. offset + n` of a generated body: 'a' + i % 26, or i & 0xff when binary.
// `pattern` holds the pattern from byte 0 for piece_size + 256 bytes, so any piece is one slice of
// it.
std::string_view body_piece(std::string const& pattern, bool binary, std::uint64_t offset,
                            std::size_t n) {
    std::uint64_t const period = binary ? 256 : 26;
    return std::string_view(pattern).substr(static_cast<std::size_t>(offset % period), n);
}

// The last chunk and, on request, a trailer field of X-Test-Trailer-Bytes bytes (RFC 9112 §7.1).
std::string last_chunk(request_facts const& f) {
    std::string last = "0\r\n";
    if (f.trailer_bytes > 0) {
        last += "X-Test-Trailer: ";
        last.append(f.trailer_bytes, 't');
        last += "\r\n";
    }
    last += "\r\n";
    return last;
}

net::awaitable<bool> wait_for_release(tcp::socket& socket, stream_releases& releases,
                                      std::string const& id);

/// Writes the head and a generated body of X-Test-Body-Bytes bytes in pieces of piece_size (one
/// chunk each when chunked), so a 4 GiB body needs no more memory than a small one. With
/// X-Test-Pause-After-Bytes it waits for a release part-way; with X-Test-Cut-After-Bytes it
/// stops part-way (false: the caller closes the connection); with X-Test-Slow-Body-Ms it
/// waits that long before each piece.
net::awaitable<bool> write_generated_body(tcp::socket& socket, reply const& r,
                                          request_facts const& f, std::string& head,
                                          stream_releases& releases) {
    std::uint64_t const size = f.body_size.value_or(0);
    bool const has_body = status_allows_body(r.status) && !r.head_request;
    build_head(head, r, f, static_cast<std::size_t>(size));
    auto [ec, n] = co_await net::async_write(socket, net::buffer(head), use_tuple);
    if (ec || !has_body)
        co_return !ec;

    std::string pattern(piece_size + 256, '\0');
    for (std::size_t i = 0; i < pattern.size(); ++i)
        pattern[i] = f.binary ? static_cast<char>(static_cast<unsigned char>(i & 0xff))
                              : static_cast<char>('a' + i % 26);
    std::array<char, 24> chunk_size{};
    bool paused = false;
    for (std::uint64_t offset = 0; offset < size;) {
        if (f.cut_after_bytes && offset >= *f.cut_after_bytes)
            co_return false;
        if (!paused && f.pause_after_bytes && offset >= *f.pause_after_bytes &&
            !f.stream_id.empty()) {
            paused = true;
            co_await wait_for_release(socket, releases, f.stream_id);
        }
        if (f.slow_body_ms) {
            net::steady_timer pace(socket.get_executor(),
                                   std::chrono::milliseconds(*f.slow_body_ms));
            co_await pace.async_wait(use_tuple);
        }
        auto const len =
            static_cast<std::size_t>(std::min<std::uint64_t>(piece_size, size - offset));
        std::string_view const piece = body_piece(pattern, f.binary, offset, len);
        std::size_t chunk_size_len = 0;
        if (r.chunked) {
            auto const res = std::to_chars(chunk_size.data(), chunk_size.data() + 20, len, 16);
            chunk_size_len = static_cast<std::size_t>(res.ptr - chunk_size.data());
            chunk_size[chunk_size_len++] = '\r';
            chunk_size[chunk_size_len++] = '\n';
        }
        std::string_view const crlf = r.chunked ? "\r\n" : "";
        std::array<net::const_buffer, 3> const buffers{
            net::buffer(chunk_size.data(), chunk_size_len), net::buffer(piece.data(), piece.size()),
            net::buffer(crlf.data(), crlf.size())};
        std::tie(ec, n) = co_await net::async_write(socket, buffers, use_tuple);
        if (ec)
            co_return false;
        offset += len;
    }
    if (r.chunked) {
        std::string const last = last_chunk(f);
        std::tie(ec, n) = co_await net::async_write(socket, net::buffer(last), use_tuple);
    }
    co_return !ec;
}

/// Waits until POST /__release?id=`id` arrives (true) or release_timeout passes (false).
net::awaitable<bool> wait_for_release(tcp::socket& socket, stream_releases& releases,
                                      std::string const& id) {
    auto const timer = std::make_shared<net::steady_timer>(socket.get_executor());
    auto const deadline = std::chrono::steady_clock::now() + release_timeout;
    for (;;) {
        if (releases.take(id, timer))
            co_return true;
        timer->expires_at(deadline);
        co_await timer->async_wait(use_tuple);
        // Cancelled: a release came (take() consumes it). Expired: give up. A cancel posted for
        // an earlier wait only costs one more round.
        if (std::chrono::steady_clock::now() >= deadline) {
            releases.forget(id);
            co_return false;
        }
    }
}

/// X-Test-Events: N: a chunked text/event-stream, one chunk `data: event-<i>\n\n` per event
/// (i = 1..N). With X-Test-Stream-Id, each event after the first waits for a release of that id
/// (bounded by release_timeout, after which the stream ends early); then the last chunk, with
/// the X-Test-Trailer-Bytes trailer if asked for.
net::awaitable<bool> write_event_stream(tcp::socket& socket, reply const& r, request_facts const& f,
                                        std::string& head, stream_releases& releases) {
    build_head(head, r, f, 0);
    head.insert(head.size() - 2, "Cache-Control: no-cache\r\n");
    auto [ec, n] = co_await net::async_write(socket, net::buffer(head), use_tuple);
    if (ec || r.head_request || !status_allows_body(r.status))
        co_return !ec;
    std::uint64_t const events = f.events.value_or(0);
    std::string chunk;
    for (std::uint64_t i = 1; i <= events; ++i) {
        if (i > 1 && !f.stream_id.empty() &&
            !co_await wait_for_release(socket, releases, f.stream_id))
            break;
        std::string event = "data: event-";
        append_number(event, i);
        event += "\n\n";
        chunk.clear();
        std::array<char, 24> size{};
        auto const res = std::to_chars(size.data(), size.data() + size.size(), event.size(), 16);
        chunk.append(size.data(), res.ptr);
        chunk += "\r\n";
        chunk += event;
        chunk += "\r\n";
        std::tie(ec, n) = co_await net::async_write(socket, net::buffer(chunk), use_tuple);
        if (ec)
            co_return false;
    }
    std::string const last = last_chunk(f);
    std::tie(ec, n) = co_await net::async_write(socket, net::buffer(last), use_tuple);
    co_return !ec;
}

/// Completes the WebSocket handshake (RFC 6455 §4.2.2) for the request in `f` and echoes every
/// message back as it came (text stays text, binary stays binary) until the peer closes. Any
/// method is upgraded, not only GET: tests check that the proxy never lets a guarded POST
/// upgrade, so the upstream must not be the one refusing.
net::awaitable<void> serve_websocket(tcp::socket& socket, request_facts const& f,
                                     std::string_view execution_id) {
    namespace websocket = beast::websocket;
    beast::http::request<beast::http::empty_body> req{beast::http::verb::get, f.target, 11};
    req.set(beast::http::field::host, "127.0.0.1");
    req.set(beast::http::field::upgrade, f.upgrade);
    req.set(beast::http::field::connection, f.connection);
    req.set(beast::http::field::sec_websocket_key, f.ws_key);
    req.set(beast::http::field::sec_websocket_version, f.ws_version);

    websocket::stream<tcp::socket&> ws(socket);
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = std::chrono::seconds(10);
    timeouts.idle_timeout = std::chrono::seconds(30);
    timeouts.keep_alive_pings = false;
    ws.set_option(timeouts);
    ws.set_option(websocket::stream_base::decorator(
        [id = std::string(execution_id)](websocket::response_type& res) {
            res.set("X-Execution-Id", id);
        }));
    ws.auto_fragment(false);
    ws.read_message_max(std::uint64_t{64} << 20);

    auto [ec] = co_await ws.async_accept(req, use_tuple);
    if (ec)
        co_return;
    beast::flat_buffer message;
    for (;;) {
        auto [rec, rn] = co_await ws.async_read(message, use_tuple);
        if (rec)
            co_return; // closed (the close handshake is answered by Beast), reset or idle
        ws.text(ws.got_text());
        auto [wec, wn] = co_await ws.async_write(message.data(), use_tuple);
        if (wec)
            co_return;
        message.consume(message.size());
    }
}

net::awaitable<void> serve(tcp::socket& socket, execution_counts& counts, stream_releases& releases,
                           attempt_log& attempts) {
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);

    // Beast reads at most the buffer's free capacity: room for large bodies in few reads.
    beast::flat_buffer buffer;
    buffer.reserve(64 * 1024);
    request_facts facts;
    std::optional<request_reader> reader;
    std::string head;
    std::string body;
    std::string execution_id;
    net::steady_timer timer(socket.get_executor());

    for (;;) {
        facts.clear();
        reader.emplace(facts);
        reader->body_limit(body_limit);
        reader->header_limit(header_limit);

        auto [ec, n] = co_await beast::http::async_read_header(socket, buffer, *reader, use_tuple);
        double const arrived_ms = attempt_log::now_ms();
        if (!ec && !reader->is_done()) {
            if (facts.expect_continue && facts.version >= 11) {
                static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
                auto [wec, wn] = co_await net::async_write(
                    socket, net::buffer(cont.data(), cont.size()), use_tuple);
                if (wec)
                    co_return;
            }
            std::tie(ec, n) = co_await beast::http::async_read(socket, buffer, *reader, use_tuple);
        }
        if (ec) {
            if (unsigned const status = failure_status(ec)) {
                reply r;
                r.status = status;
                r.content_type = "text/plain";
                r.keep_alive = false;
                facts.extra_headers.clear();
                co_await write_reply(socket, r, facts, head, ec.message());
            }
            close_socket(socket);
            co_return;
        }

        reply r;
        r.content_type = "application/json";
        r.keep_alive = reader->keep_alive();
        r.head_request = facts.method == "HEAD";
        std::string_view const target = facts.target;
        std::string_view const path = target.substr(0, target.find('?'));

        bool const control = path.starts_with("/__") &&
                             control_reply(path, facts, counts, releases, attempts, r, body);
        if (!control && (facts.has_key || !facts.fault_id.empty()))
            attempts.record(facts.has_key ? facts.key : facts.fault_id, arrived_ms);
        if (control) {
            facts.extra_headers.clear();
        } else if (facts.bad_test_header) {
            r.status = 400;
            r.content_type = "text/plain";
            facts.extra_headers.clear();
            body = "bad X-Test-* header value";
        } else {
            auto const execution = counts.record(facts.key, facts.has_key, facts.fault_id);
            execution_id = execution_id_prefix();
            append_number(execution_id, execution.id);

            bool const failing = facts.fail_times && execution.nth <= *facts.fail_times;
            if (failing && facts.fail_with != request_facts::fault::status) {
                if (facts.fail_with == request_facts::fault::hang) {
                    timer.expires_after(std::chrono::milliseconds(facts.fail_hang_ms));
                    co_await timer.async_wait(use_tuple);
                }
                close_socket(socket);
                co_return;
            }
            if (facts.fail_times && !failing)
                facts.extra_headers.clear(); // X-Test-Header belongs to the failures then
            if (failing) {
                r.status = facts.fail_status;
                r.execution_id = execution_id;
                facts.body_size.reset();
                facts.binary = false;
                fill_body(body, facts, execution_id);
            } else {
                if (facts.drop) {
                    close_socket(socket);
                    co_return;
                }
                if (facts.malformed) {
                    static constexpr std::string_view garbage = "HTTP/1.1 2x0 nonsense\r\n\r\n";
                    co_await net::async_write(socket, net::buffer(garbage.data(), garbage.size()),
                                              use_tuple);
                    close_socket(socket);
                    co_return;
                }
                if (facts.drop_after_ms) {
                    timer.expires_after(std::chrono::milliseconds(*facts.drop_after_ms));
                    co_await timer.async_wait(use_tuple);
                    close_socket(socket);
                    co_return;
                }
                if (facts.delay_ms) {
                    timer.expires_after(std::chrono::milliseconds(*facts.delay_ms));
                    co_await timer.async_wait(use_tuple);
                }
                if (facts.wants_websocket() && (path == "/ws" || path.ends_with("/ws"))) {
                    co_await serve_websocket(socket, facts, execution_id);
                    close_socket(socket);
                    co_return;
                }
                r.status = facts.status;
                r.execution_id = execution_id;
                r.chunked = facts.chunked;
                if (facts.binary)
                    r.content_type = "application/octet-stream";
                else if (facts.body_size)
                    r.content_type = "text/plain";
                bool streamed = false;
                bool ok = true;
                if (facts.events) {
                    r.chunked = true;
                    r.content_type = "text/event-stream";
                    ok = co_await write_event_stream(socket, r, facts, head, releases);
                    streamed = true;
                } else if (facts.body_size && *facts.body_size > stream_threshold) {
                    ok = co_await write_generated_body(socket, r, facts, head, releases);
                    streamed = true;
                }
                if (streamed) {
                    if (!ok || !r.keep_alive) {
                        close_socket(socket);
                        co_return;
                    }
                    continue;
                }
                fill_body(body, facts, execution_id);
            }
        }

        if (!co_await write_reply(socket, r, facts, head, body) || !r.keep_alive ||
            facts.close_after_reply) {
            close_socket(socket);
            co_return;
        }
        if (facts.stray_after_ms) {
            // An answer nobody asked for, on a connection the proxy may have pooled by now.
            static constexpr std::string_view stray =
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 17\r\n"
                "X-Test-Stray: 1\r\n\r\nunsolicited-stray";
            timer.expires_after(std::chrono::milliseconds(*facts.stray_after_ms));
            co_await timer.async_wait(use_tuple);
            auto [wec, wn] = co_await net::async_write(
                socket, net::buffer(stray.data(), stray.size()), use_tuple);
            if (wec) {
                close_socket(socket);
                co_return;
            }
        }
    }
}

} // namespace

net::awaitable<void> run_session(tcp::socket socket, execution_counts& counts,
                                 stream_releases& releases, attempt_log& attempts) {
    try {
        co_await serve(socket, counts, releases, attempts);
    } catch (std::exception const& e) {
        std::fprintf(stderr, "session failed: %s\n", e.what());
    }
}

} // namespace onceproxy::test_upstream
