#include "http/body_relay.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/wire/message_reader.hpp"

#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <charconv>

namespace onceproxy::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;

response_framing frame_response(unsigned status, bool head_request, bool length_known,
                                unsigned client_version, bool may_keep) noexcept {
    response_framing f;
    f.no_body = head_request || status == 204 || status == 304 || status < 200;
    f.rechunk = !f.no_body && !length_known && client_version >= 11;
    const bool close_delimited = !f.no_body && !length_known && client_version < 11;
    f.keep = may_keep && !close_delimited;
    return f;
}

bool trailer_may_travel(std::string_view name, trailer_side side) noexcept {
    // A request's trailers reach an app that may merge them into the header (Beast's parser
    // and many servers do): only fields meant to follow a body pass (RFC 9530 digests, RFC 9421
    // signatures), never Expect, Proxy-Authorization, Content-Encoding or anything routed on.
    static constexpr std::array<std::string_view, 5> request_allowed{
        "content-digest", "repr-digest", "digest", "signature", "signature-input"};
    // A response's trailers pass unless they are framing, routing, credentials, the
    // idempotency status this proxy vouches for, or a Proxy-* field.
    static constexpr std::array<std::string_view, 20> response_denied{"content-length",
                                                                      "transfer-encoding",
                                                                      "host",
                                                                      "connection",
                                                                      "keep-alive",
                                                                      "te",
                                                                      "trailer",
                                                                      "upgrade",
                                                                      "authorization",
                                                                      "cookie",
                                                                      "set-cookie",
                                                                      "content-type",
                                                                      "x-forwarded-for",
                                                                      "x-forwarded-proto",
                                                                      "forwarded",
                                                                      "x-real-ip",
                                                                      "x-request-id",
                                                                      "idempotency-status",
                                                                      "content-encoding",
                                                                      "expect"};
    const auto is = [&](std::string_view n) { return beast::iequals(name, n); };
    if (side == trailer_side::to_upstream) {
        return std::any_of(request_allowed.begin(), request_allowed.end(), is);
    }
    const bool proxy = name.size() >= 6 && beast::iequals(name.substr(0, 6), "proxy-");
    return !proxy && std::none_of(response_denied.begin(), response_denied.end(), is);
}

std::string last_chunk(const bhttp::fields& trailers, trailer_side side,
                       std::span<const std::string_view> in_use) {
    std::string out = "0\r\n";
    for (const auto& f : trailers) {
        const auto name = f.name_string();
        const bool used = std::any_of(in_use.begin(), in_use.end(),
                                      [&](std::string_view n) { return beast::iequals(n, name); });
        if (!used && trailer_may_travel(name, side)) {
            out.append(f.name_string()).append(": ").append(f.value()).append("\r\n");
        }
    }
    out += "\r\n";
    return out;
}

gather::gather(std::string_view head, std::string_view piece, bool chunked, std::string_view tail) {
    std::size_t size_len = 0;
    const bool framed = chunked && !piece.empty();
    if (framed) {
        auto r = std::to_chars(size_line_.data(), size_line_.data() + 16, piece.size(), 16);
        size_len = static_cast<std::size_t>(r.ptr - size_line_.data());
        size_line_[size_len++] = '\r';
        size_line_[size_len++] = '\n';
    }
    static constexpr std::string_view crlf = "\r\n";
    bufs_ = {net::buffer(head.data(), head.size()), net::buffer(size_line_.data(), size_len),
             net::buffer(piece.data(), piece.size()),
             net::buffer(crlf.data(), framed ? crlf.size() : 0),
             net::buffer(tail.data(), tail.size())};
}

net::awaitable<bool> write_piece(wire::stream& s, wire::deadline_watch::slot& dl,
                                 std::chrono::steady_clock::duration timeout, std::string_view data,
                                 bool chunked) {
    const gather g({}, data, chunked, {});
    dl.expires_after(timeout);
    auto [ec, n] = co_await wire::async_write_all(s, g.buffers());
    (void)n;
    co_return !ec;
}

upstream::forward_status read_failure(const boost::system::error_code& ec, bool timed_out) {
    if (timed_out) {
        return upstream::forward_status::timeout_after_send;
    }
    if (ec == bhttp::error::body_limit) {
        return upstream::forward_status::response_too_large;
    }
    if (ec != bhttp::error::partial_message &&
        ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category()) {
        return upstream::forward_status::bad_response;
    }
    return upstream::forward_status::reset_after_send;
}

net::awaitable<bool> connection_sink::write(std::string_view piece) {
    return write_piece(sock_, dl_, timeout_, piece, rechunk_);
}

net::awaitable<bool> connection_sink::end(const bhttp::fields& trailers) {
    if (!rechunk_) {
        co_return true;
    }
    co_return co_await write_piece(sock_, dl_, timeout_,
                                   last_chunk(trailers, trailer_side::to_client), false);
}

net::awaitable<body_end> relay_body(wire::response_parser& rp, body_source from, body_sink& to,
                                    std::uint64_t& relayed, upstream::forward_status& failure) {
    auto& body = rp.get().body();
    auto& conn = from.conn;
    // Beast reads at most the buffer's free capacity: room for a relay piece per read.
    conn.buffer.reserve(conn.buffer.max_size());
    long_transfer_watch long_transfer(from.fwd, from.upstream_index);
    while (!rp.is_done()) {
        conn.dl.expires_after(from.timeout);
        auto ec = co_await wire::async_read(conn.stream, conn.buffer, rp, wire::read_until::some);
        if (ec && ec != bhttp::error::need_buffer) {
            failure = read_failure(ec, conn.dl.fired());
            to.cut(); // the client connection ends without a proper end
            co_return body_end::upstream_failed;
        }
        if (!body.empty()) {
            if (!co_await to.write(body)) {
                to.cut();
                co_return body_end::client_failed;
            }
            relayed += body.size();
            body.clear();
        }
        long_transfer.on_piece(conn);
    }
    if (!co_await to.end(rp.trailers())) {
        to.cut();
        co_return body_end::client_failed;
    }
    co_return body_end::complete;
}

} // namespace onceproxy::http
