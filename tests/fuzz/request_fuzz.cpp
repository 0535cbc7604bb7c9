// Client bytes as the proxy listener applies them: the bounded parser and read buffer (header,
// body and trailer limits), pipelined messages, then on every head the checks and rewrites the
// session does before forwarding: framing/Host refusal, route match, hop-by-hop stripping with
// the route's protected fields, X-Forwarded-*, and the idempotency key.
#include "feed.hpp"
#include "onceproxy/config/load.hpp"
#include "onceproxy/config/route_table.hpp"
#include "onceproxy/core/idempotency_key.hpp"
#include "onceproxy/http/headers.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

const auto& fuzz_config() {
    static const auto cfg = onceproxy::config::load_string(R"(listen: 127.0.0.1:0
upstreams: { app: { url: "http://127.0.0.1:9" } }
routes:
  - name: pay
    match: { methods: [POST], template: "/v1/orders/{id}/pay" }
    upstream: app
    idempotency: { mode: required }
  - name: rest
    match: { prefix: / }
    upstream: app
)",
                                                           "fuzz.yaml");
    return *cfg;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    constexpr std::size_t header_limit = 2048;
    const auto& cfg = fuzz_config();
    boost::beast::flat_buffer buffer(onceproxy::wire::read_buffer_limit(header_limit));
    std::string_view input(reinterpret_cast<const char*>(data), size);
    // Up to four pipelined messages; input arrives in reads of at most 997 bytes.
    for (int message = 0; message < 4; ++message) {
        onceproxy::wire::request_parser parser;
        parser.header_limit(header_limit);
        parser.trailer_limit(header_limit);
        parser.body_limit(8192);
        if (!onceproxy::fuzz::parse_next(parser, buffer, input, 997)) {
            return 0;
        }
        auto req = parser.release();
        if (!onceproxy::http::refuse_request_head(req).empty()) {
            return 0;
        }
        const auto target = req.target();
        const auto* route = onceproxy::config::find_route(cfg, req.method_string(),
                                                          target.substr(0, target.find('?')));
        std::vector<std::string_view> lines;
        for (auto it = req.find("Idempotency-Key");
             it != req.end() && it->name_string().size() == 15; ++it) {
            lines.push_back(it->value());
        }
        if (!lines.empty()) {
            (void)onceproxy::core::parse_idempotency_key(
                lines, onceproxy::config::key_syntax::lenient, 255);
        }
        if (route != nullptr) {
            onceproxy::http::strip_hop_by_hop(
                req, onceproxy::http::request_fields_in_use(route->idempotency));
        } else {
            onceproxy::http::strip_hop_by_hop(req);
        }
        onceproxy::http::add_forwarded(req, "127.0.0.1", "http");
    }
    return 0;
}
