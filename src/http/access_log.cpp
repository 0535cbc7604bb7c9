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
    o["protocol"] = ctx.protocol;
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
    if (e.egress) {
        o["attempts"] = e.attempts;
        if (!e.egress_key.empty()) {
            o["idempotency_key"] = escape_invalid_utf8(e.egress_key);
        }
    }
    auto line = boost::json::serialize(o);
    line += '\n';
    return stdout_writer().submit(line);
}

void flush_access_log() {
    stdout_writer().stop();
}

} // namespace onceproxy::http
