#pragma once
// What the test upstream needs to know about one request, captured while Beast parses it.
//
// A full `http::request<string_body>` would allocate every field and keep the whole body; the
// test upstream only counts body bytes and looks at a dozen headers, so `request_reader` is a
// `basic_parser` that records those facts into a `request_facts` reused across the requests of a
// connection (no allocation per request once the strings have grown).

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::test_upstream {

namespace http = boost::beast::http;

/// FNV-1a, 64-bit (offset basis and prime from the FNV reference): a streaming digest of a body.
inline constexpr std::uint64_t fnv1a_offset_basis = 14695981039346656037ULL;
inline constexpr std::uint64_t fnv1a_prime = 1099511628211ULL;

inline std::uint64_t fnv1a_update(std::uint64_t hash, std::string_view bytes) {
    for (char c : bytes) {
        hash ^= static_cast<unsigned char>(c);
        hash *= fnv1a_prime;
    }
    return hash;
}

/// Facts about one request; `clear()` before each request keeps the strings' capacity.
struct request_facts {
    std::string method;
    std::string target;
    int version = 11;
    std::uint64_t body_bytes = 0;
    std::uint64_t body_fnv1a = fnv1a_offset_basis; // 64-bit FNV-1a of the body bytes so far
    bool expect_continue = false;

    bool has_key = false;
    std::string key; // Idempotency-Key, raw value
    bool has_forwarded_for = false;
    std::string forwarded_for; // X-Forwarded-For, repeated fields joined with ", "
    bool has_forwarded_proto = false;
    std::string forwarded_proto;
    bool has_forwarded_host = false;
    std::string forwarded_host; // X-Forwarded-Host
    bool has_forwarded = false;
    std::string forwarded; // RFC 7239 Forwarded, repeated fields joined with ", "
    bool has_connection = false;
    std::string connection; // Connection as received, repeated fields joined with ", "
    std::string hop;        // comma list of received hop-by-hop header names (lowercase)
    std::string all_names;  // ",name,name," of every received field (lowercase), for Connection
    std::string upgrade;    // Upgrade as received, repeated fields joined with ", "
    std::string ws_key;     // Sec-WebSocket-Key
    std::string ws_version; // Sec-WebSocket-Version

    // Misbehaviour requested through X-Test-* headers.
    bool bad_test_header = false; // an X-Test-* value did not parse: answer 400
    unsigned status = 200;        // X-Test-Status: 200-999, or 101 (head only, nothing switched)
    std::optional<std::uint64_t> delay_ms;
    std::optional<std::uint64_t> drop_after_ms;
    bool drop = false;
    bool close_after_reply = false; // answer as keep-alive, then close (an idle timeout of zero)
    // X-Test-Stray-After-Ms: this long after the reply, an unsolicited second answer (body
    // "unsolicited-stray", X-Test-Stray: 1) on the same connection, which stays open.
    std::optional<std::uint64_t> stray_after_ms;
    std::optional<std::uint64_t> body_size;
    bool binary = false;
    bool chunked = false;
    std::uint64_t trailer_bytes = 0;     // chunked: end with a trailer field of this many bytes
    bool malformed = false;              // answer with bytes that are not an HTTP response
    std::string extra_headers;           // "Name: value\r\n" lines from X-Test-Header
    std::optional<std::uint64_t> events; // X-Test-Events: a held text/event-stream of N events
    std::string stream_id;               // X-Test-Stream-Id: what POST /__release?id= names
    // A generated body (over 1 MiB) with X-Test-Stream-Id: after this many bytes, wait for the
    // release before the rest.
    std::optional<std::uint64_t> pause_after_bytes;
    // A generated body (over 1 MiB): the connection closes after this many bytes of it.
    std::optional<std::uint64_t> cut_after_bytes;
    // A generated body (over 1 MiB): wait this many milliseconds before each piece.
    std::optional<std::uint64_t> slow_body_ms;

    // Faults (X-Test-Fail-*): the first `fail_times` executions of the request's Idempotency-Key
    // (without a key: of its X-Test-Fault-Id) fail with `fail_with`; later ones answer normally.
    enum class fault { status, reset, hang };
    std::string fault_id; // X-Test-Fault-Id: what counts executions of a request without a key
    std::optional<std::uint64_t> fail_times;
    fault fail_with = fault::status;
    unsigned fail_status = 503;        // fault::status: the answer's status
    std::uint64_t fail_hang_ms = 5000; // fault::hang: wait this long, then close unanswered

    void clear();
    /// Upgrade names websocket, Connection has the `upgrade` token and a key is present.
    bool wants_websocket() const;
};

/// Parses one request into a `request_facts`; make a new reader per request (cheap).
class request_reader final : public http::basic_parser<true> {
public:
    explicit request_reader(request_facts& facts) : facts_(facts) {}

private:
    void on_request_impl(http::verb method, boost::beast::string_view method_str,
                         boost::beast::string_view target, int version,
                         boost::beast::error_code& ec) override;
    void on_response_impl(int code, boost::beast::string_view reason, int version,
                          boost::beast::error_code& ec) override;
    void on_field_impl(http::field name, boost::beast::string_view name_string,
                       boost::beast::string_view value, boost::beast::error_code& ec) override;
    void on_header_impl(boost::beast::error_code& ec) override;
    void on_body_init_impl(boost::optional<std::uint64_t> const& content_length,
                           boost::beast::error_code& ec) override;
    std::size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
    void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                              boost::beast::error_code& ec) override;
    std::size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                                   boost::beast::error_code& ec) override;
    void on_finish_impl(boost::beast::error_code& ec) override;

    request_facts& facts_;
};

} // namespace onceproxy::test_upstream
