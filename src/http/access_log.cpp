#include "http/access_log.hpp"

#include "http/random_id.hpp"

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <unistd.h>

#include <array>
#include <chrono>

namespace onceproxy::http {

std::string ensure_request_id(request& req) {
    auto it = req.find("x-request-id");
    if (it != req.end() && !it->value().empty()) {
        return std::string(it->value());
    }
    auto id = random_hex_id();
    req.set("X-Request-Id", id);
    return id;
}

void write_access_log(const access_log_entry& e, const request_context& ctx, const request&) {
    boost::json::object o;
    o["ts"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
    o["route"] = e.route;
    o["method"] = e.method;
    const auto q = e.target.find('?');
    o["path"] = q == std::string_view::npos ? e.target : e.target.substr(0, q);
    o["status"] = e.status;
    o["outcome"] = metrics::outcome_name(e.outcome);
    if (!e.key_hash.empty()) {
        o["key_hash"] = e.key_hash;
    }
    o["request_id"] = e.request_id;
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
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
        const auto n = ::write(STDOUT_FILENO, p, left);
        if (n <= 0) {
            return; // a closed stdout never stops the proxy
        }
        p += n;
        left -= static_cast<std::size_t>(n);
    }
}

} // namespace onceproxy::http
