#include "onceproxy/wire/message_reader.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/wire/stream.hpp"

#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/http/error.hpp>

#include <stdexcept>
#include <string_view>
#include <tuple>

namespace onceproxy::wire {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using error_code = boost::system::error_code;

namespace {

/// Largest single read, as Beast's read_some_op.
constexpr std::size_t max_read = 65536;

template <bool isRequest>
bool reached(const message_parser<isRequest>& parser, read_until until) {
    switch (until) {
    case read_until::some:
        return true;
    case read_until::header:
        return parser.is_header_done();
    case read_until::message:
        return parser.is_done();
    }
    return true;
}

/// Room for the next read, or nothing when the buffer is at its bound (buffer_overflow).
bool prepare(boost::beast::flat_buffer& buffer, net::mutable_buffer& out) {
    const auto size = boost::beast::read_size(buffer, max_read);
    if (size == 0) {
        return false;
    }
    try {
        out = buffer.prepare(size);
    } catch (const std::length_error&) {
        return false;
    }
    return true;
}

/// True when a request head holds obsolete line folding (a line that starts with a space or a
/// tab, RFC 9112 §5.2). Beast would join it to the previous field; a request is refused with 400
/// instead, as another hop may not join it the same way.
bool has_obs_fold(std::string_view head) {
    for (auto pos = head.find('\n'); pos != std::string_view::npos && pos + 1 < head.size();
         pos = head.find('\n', pos + 1)) {
        if (head[pos + 1] == ' ' || head[pos + 1] == '\t') {
            return true;
        }
    }
    return false;
}

} // namespace

template <bool isRequest>
net::awaitable<error_code> async_read(stream& sock, boost::beast::flat_buffer& buffer,
                                      message_parser<isRequest>& parser, read_until until,
                                      bool answer) {
    if (until != read_until::some && reached(parser, until)) {
        co_return error_code{};
    }
    error_code ec;
    for (;;) {
        if (buffer.size() != 0) {
            const bool in_head = !parser.is_header_done();
            const auto used = parser.put(buffer.data(), ec);
            if constexpr (isRequest) {
                if (in_head && !ec && parser.is_header_done() &&
                    has_obs_fold({static_cast<const char*>(buffer.data().data()), used})) {
                    co_return bhttp::error::bad_value;
                }
            }
            buffer.consume(used);
            if (!ec && reached(parser, until)) {
                co_return ec;
            }
            if (!ec && used != 0) {
                continue; // parse on (or read, once the buffer is empty)
            }
            if (ec && ec != bhttp::error::need_more) {
                co_return ec;
            }
        }
        net::mutable_buffer room;
        if (!prepare(buffer, room)) {
            co_return bhttp::error::buffer_overflow;
        }
        error_code rec;
        std::size_t n = 0;
        if (answer) {
            std::tie(rec, n) = co_await sock.async_read_next(room, use_tuple);
            answer = false;
        } else {
            std::tie(rec, n) = co_await sock.async_read_some(room, use_tuple);
        }
        buffer.commit(n);
        // A TLS peer that closes without close_notify: an idle connection that went away
        // (nothing of a message yet) is an ordinary close; a message cut short is not.
        if (rec == net::error::eof ||
            (rec == net::ssl::error::stream_truncated && !parser.got_some())) {
            if (!parser.got_some()) {
                co_return bhttp::error::end_of_stream;
            }
            error_code eof_ec; // a close-delimited body ends here; anything else is partial
            parser.put_eof(eof_ec);
            co_return eof_ec;
        }
        if (rec) {
            co_return rec;
        }
    }
}

template net::awaitable<error_code> async_read<true>(stream&, boost::beast::flat_buffer&,
                                                     message_parser<true>&, read_until, bool);
template net::awaitable<error_code> async_read<false>(stream&, boost::beast::flat_buffer&,
                                                      message_parser<false>&, read_until, bool);

} // namespace onceproxy::wire
