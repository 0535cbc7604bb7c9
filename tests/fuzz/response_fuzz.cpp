// Upstream bytes as the forwarder reads them: the bounded response parser and read buffer
// (header, trailer and body limits), interim 1xx answers, then the hop-by-hop stripping the
// client response gets.
#include "onceproxy/http/headers.hpp"
#include "onceproxy/upstream/message_parser.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace bhttp = boost::beast::http;
    constexpr std::size_t header_limit = 2048;
    boost::beast::flat_buffer buffer(onceproxy::upstream::read_buffer_limit(header_limit));
    std::string_view input(reinterpret_cast<const char*>(data), size);
    const bool head = size > 0 && (data[0] & 1) != 0; // answer to a HEAD request or not
    for (int message = 0; message < 3; ++message) {
        onceproxy::upstream::response_parser parser;
        parser.header_limit(header_limit);
        parser.trailer_limit(header_limit);
        parser.body_limit(16384);
        parser.skip(head);
        boost::system::error_code ec;
        while (!parser.is_done()) {
            if (buffer.size() > 0) {
                const auto used = parser.put(buffer.data(), ec);
                buffer.consume(used);
                if (ec == bhttp::error::need_more) {
                    ec = {};
                } else if (ec) {
                    return 0;
                } else if (used > 0) {
                    continue;
                }
            }
            if (input.empty()) {
                if (!parser.got_some()) {
                    return 0; // the upstream closed before answering
                }
                parser.put_eof(ec);
                if (ec || !parser.is_done()) {
                    return 0;
                }
                break;
            }
            const auto room = buffer.max_size() - buffer.size();
            if (room == 0) {
                return 0;
            }
            const auto n = std::min({input.size(), room, std::size_t{1021}});
            auto mb = buffer.prepare(n);
            boost::asio::buffer_copy(mb, boost::asio::buffer(input.data(), n));
            buffer.commit(n);
            input.remove_prefix(n);
        }
        auto res = parser.release();
        onceproxy::http::strip_hop_by_hop(res);
        res.content_length(res.body().size());
    }
    return 0;
}
