#pragma once
// One JSON line per request on stdout (SPEC §6). Never Authorization, and never the raw key of
// an inbound request (a hash instead); an egress request's key is the one its upstream sees,
// logged as sent so that it can be found in the upstream's own records (docs/egress.md).

#include "onceproxy/http/context.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/metrics/registry.hpp"

#include <string>
#include <string_view>

namespace onceproxy::http {

struct access_log_entry {
    std::string_view route;
    std::string_view method;
    std::string_view target;
    unsigned status = 0;
    metrics::outcome outcome = metrics::outcome::passthrough;
    std::string_view key_hash; ///< hex store key, empty when unguarded
    std::string_view request_id;
    double upstream_ms = -1;     ///< negative: no upstream call
    double store_ms = -1;        ///< negative: no store call
    bool egress = false;         ///< an egress route's request: the two fields below are logged
    std::string_view egress_key; ///< the Idempotency-Key sent, or empty
    unsigned attempts = 0;       ///< sends made (0: refused, its upstream's breaker open)
};

/// Client-chosen bytes made valid UTF-8 for the line (log::escape_invalid_utf8: each byte of an
/// ill-formed sequence becomes `\xNN`), shared with the process log.
using log::escape_invalid_utf8;

/// Returns the request's X-Request-Id, generating (and setting) one when absent.
std::string ensure_request_id(request& req);

/// Formats the line and hands it to the access-log writer thread (access_log_queue.hpp), which
/// writes whole lines to stdout, so lines from several workers never interleave. Returns false
/// when the writer's buffer is full and the line was dropped: the caller counts it
/// (registry::access_log_dropped). Any worker thread; never waits for stdout.
[[nodiscard]] bool write_access_log(const access_log_entry& e, const request_context& ctx,
                                    const request& req);

} // namespace onceproxy::http
