#pragma once
// Reading an HTTP message into a message_parser from a wire::stream (plain or TLS): what Beast's
// http::async_read_some / async_read_header / async_read do, with the same results and error
// codes, minus their composed-operation layers. Bytes already buffered are parsed first and,
// when they are enough, the call completes at once: no I/O, no trip through the event loop
// (Beast posts such a completion), no executor work tracking. On the proxy's hot path a request
// head usually arrives whole in the read that waited for it, and an answer's body with its head.

#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/system/error_code.hpp>

namespace onceproxy::wire {

class stream;

/// How far async_read goes.
enum class read_until {
    some,    ///< one step of progress (Beast's async_read_some): a read, or what was buffered
    header,  ///< the header is complete (Beast's async_read_header)
    message, ///< the whole message is read (Beast's async_read)
};

/// Feeds `parser` from `buffer`, reading from `sock` when the buffered bytes are not enough,
/// until `until` holds or an error. Errors as Beast's: `http::error::end_of_stream` when the
/// peer closed before a byte of the message, `http::error::buffer_overflow` when `buffer` is
/// full, `http::error::need_buffer` when a streaming parser's staging body is full (not an
/// error: drain it and read on), parser errors, and socket errors (`operation_aborted` when a
/// deadline cancelled the read). The bytes parsed are consumed from `buffer`; any left belong
/// to what follows (a pipelined request). Runs on the socket's executor.
///
/// `answer`: the message is the answer to a request just written, so its first read is the
/// peer's turn (stream::async_read_next); every later read is an ordinary one.
template <bool isRequest>
boost::asio::awaitable<boost::system::error_code>
async_read(stream& sock, boost::beast::flat_buffer& buffer, message_parser<isRequest>& parser,
           read_until until, bool answer = false);

extern template boost::asio::awaitable<boost::system::error_code>
async_read<true>(stream&, boost::beast::flat_buffer&, message_parser<true>&, read_until, bool);
extern template boost::asio::awaitable<boost::system::error_code>
async_read<false>(stream&, boost::beast::flat_buffer&, message_parser<false>&, read_until, bool);

} // namespace onceproxy::wire
