#include "http/access_log.hpp"

#include "http/access_log_queue.hpp"
#include "http/random_id.hpp"
#include "onceproxy/http/server.hpp"

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <unistd.h>

#include <array>
#include <chrono>

namespace onceproxy::http {

namespace {

/// Length of the well-formed UTF-8 sequence at the start of `s`, 0 when it is ill-formed
/// (Unicode 15 Table 3-7, which excludes overlongs, surrogates and values above U+10FFFF).
std::size_t utf8_sequence_length(std::string_view s) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    const auto in = [&](std::size_t i, unsigned lo, unsigned hi) {
        return i < s.size() && byte(i) >= lo && byte(i) <= hi;
    };
    const unsigned b0 = byte(0);
    if (b0 < 0x80) {
        return 1;
    }
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        return in(1, 0x80, 0xbf) ? 2 : 0;
    }
    if (b0 >= 0xe0 && b0 <= 0xef) {
        const unsigned lo = b0 == 0xe0 ? 0xa0 : 0x80; // E0 80..9F: overlong
        const unsigned hi = b0 == 0xed ? 0x9f : 0xbf; // ED A0..BF: UTF-16 surrogates
        return in(1, lo, hi) && in(2, 0x80, 0xbf) ? 3 : 0;
    }
    if (b0 >= 0xf0 && b0 <= 0xf4) {
        const unsigned lo = b0 == 0xf0 ? 0x90 : 0x80; // F0 80..8F: overlong
        const unsigned hi = b0 == 0xf4 ? 0x8f : 0xbf; // F4 90..: above U+10FFFF
        return in(1, lo, hi) && in(2, 0x80, 0xbf) && in(3, 0x80, 0xbf) ? 4 : 0;
    }
    return 0; // 80..C1 (continuation or overlong lead), F5..FF
}

/// Pending bytes the writer buffers at most (some 16,000 typical lines): enough to ride out a
/// slow moment of the log collector, bounded so a stalled stdout costs no more memory than this.
constexpr std::size_t log_buffer_bytes = 4 * 1024 * 1024;

/// How long the writer lets lines gather before a write: a batch per write(2) instead of a
/// write per request, and no wake-up of the writer per line.
constexpr std::chrono::milliseconds log_linger{20};

/// The process's writer, started with the first line; its destructor (at exit) flushes too.
access_log_writer& stdout_writer() {
    static access_log_writer writer(STDOUT_FILENO, log_buffer_bytes, log_linger);
    return writer;
}

} // namespace

std::string escape_invalid_utf8(std::string_view bytes) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size());
    while (!bytes.empty()) {
        const auto n = utf8_sequence_length(bytes);
        if (n == 0) {
            // One byte at a time: the next byte may start a well-formed sequence (resync).
            const auto u = static_cast<unsigned char>(bytes.front());
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 0xf];
            bytes.remove_prefix(1);
        } else {
            out.append(bytes.substr(0, n));
            bytes.remove_prefix(n);
        }
    }
    return out;
}

std::string ensure_request_id(request& req) {
    auto it = req.find("x-request-id");
    if (it != req.end() && !it->value().empty()) {
        return std::string(it->value());
    }
    auto id = random_hex_id();
    req.set("X-Request-Id", id);
    return id;
}

bool write_access_log(const access_log_entry& e, const request_context& ctx, const request&) {
    boost::json::object o;
    o["ts"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
    o["route"] = e.route;
    // Boost.JSON writes string bytes as they are: everything the client chose goes through
    // escape_invalid_utf8, or one bad byte makes the whole line invalid JSON for the collector.
    o["method"] = escape_invalid_utf8(e.method);
    const auto q = e.target.find('?');
    o["path"] = escape_invalid_utf8(q == std::string_view::npos ? e.target : e.target.substr(0, q));
    o["status"] = e.status;
    o["outcome"] = metrics::outcome_name(e.outcome);
    if (!e.key_hash.empty()) {
        o["key_hash"] = e.key_hash;
    }
    o["request_id"] = escape_invalid_utf8(e.request_id);
    o["client"] = ctx.client_ip;
    o["duration_ms"] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ctx.received)
            .count();
    if (e.upstream_ms >= 0) {
        o["upstream_ms"] = e.upstream_ms;
    }
    if (e.store_ms >= 0) {
        o["store_ms"] = e.store_ms;
    }
    auto line = boost::json::serialize(o);
    line += '\n';
    return stdout_writer().submit(line);
}

void flush_access_log() {
    stdout_writer().stop();
}

} // namespace onceproxy::http
