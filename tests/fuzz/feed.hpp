#pragma once
// Drives a message_parser over fuzz input the way the proxy's reads do: through a read buffer
// bounded like the real one, in reads of at most `max_read` bytes.

#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace onceproxy::fuzz {

/// Parses the next message of `input` (consumed as it is read) into `parser`. False when the
/// real read would have failed: a parse error, a full buffer (buffer_overflow), or the peer
/// closing before a complete message.
template <bool isRequest>
bool parse_next(wire::message_parser<isRequest>& parser, boost::beast::flat_buffer& buffer,
                std::string_view& input, std::size_t max_read) {
    namespace bhttp = boost::beast::http;
    boost::system::error_code ec;
    while (!parser.is_done()) {
        if (buffer.size() > 0) {
            const auto used = parser.put(buffer.data(), ec);
            buffer.consume(used);
            if (ec == bhttp::error::need_more) {
                ec = {};
            } else if (ec) {
                return false;
            } else if (used > 0) {
                continue;
            }
        }
        if (input.empty()) {
            if (!parser.got_some()) {
                return false; // the peer went away between messages
            }
            parser.put_eof(ec);
            return !ec && parser.is_done();
        }
        const auto room = buffer.max_size() - buffer.size();
        if (room == 0) {
            return false;
        }
        const auto n = std::min({input.size(), room, max_read});
        boost::asio::buffer_copy(buffer.prepare(n), boost::asio::buffer(input.data(), n));
        buffer.commit(n);
        input.remove_prefix(n);
    }
    return true;
}

} // namespace onceproxy::fuzz
