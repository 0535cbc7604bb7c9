#pragma once
// GET /admin/v1/status on the admin listener: what the status page (status_page.html, served
// at /) shows, as JSON. A digest of the /metrics series for a person: per-route counts by
// outcome, recent latency percentiles, what observe mode would have prevented, the store, the
// certificates, connections, the config, and the egress routes with their upstreams' breakers.
// No keys, tokens, bodies or store addresses.

#include "onceproxy/config/config.hpp"
#include "onceproxy/metrics/history.hpp"
#include "onceproxy/metrics/registry.hpp"

#include <chrono>
#include <string>
#include <string_view>

namespace onceproxy::app {

struct status_inputs {
    const config::config& cfg; ///< the config now serving
    const metrics::registry& reg;
    const metrics::history& past; ///< samples of the last hour (the admin listener's)
    bool store_answered = false;  ///< the store has answered the admin probe at least once
    bool store_answering = false; ///< the last probe succeeded
    bool draining = false;
    std::chrono::steady_clock::time_point started; ///< when the process started serving
};

/// The JSON document (docs/operations.md, "Status page").
std::string status_json(const status_inputs& in);

/// The status page: one self-contained HTML document, embedded at build time.
std::string_view status_page_html() noexcept;

} // namespace onceproxy::app
