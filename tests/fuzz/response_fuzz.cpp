// Upstream bytes as the forwarder reads them: the bounded response parser and read buffer
// (header, trailer and body limits), interim 1xx answers, then the hop-by-hop stripping the
// client response gets.
#include "feed.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    constexpr std::size_t header_limit = 2048;
    boost::beast::flat_buffer buffer(onceproxy::wire::read_buffer_limit(header_limit));
    std::string_view input(reinterpret_cast<const char*>(data), size);
    const bool head = size > 0 && (data[0] & 1) != 0; // answer to a HEAD request or not
    for (int message = 0; message < 3; ++message) {
        onceproxy::wire::response_parser parser;
        parser.header_limit(header_limit);
        parser.trailer_limit(header_limit);
        parser.body_limit(16384);
        parser.skip(head);
        if (!onceproxy::fuzz::parse_next(parser, buffer, input, 1021)) {
            return 0;
        }
        auto res = parser.release();
        onceproxy::http::strip_hop_by_hop(res);
        res.content_length(res.body().size());
    }
    return 0;
}
