#pragma once
// Wires the modules: worker threads (one io_context each), listeners, store, admin endpoints,
// signals and graceful drain.

#include "onceproxy/config/config.hpp"

#include <memory>
#include <string>

namespace onceproxy::app {

struct run_options {
    std::string port_file; ///< when set, "LISTEN_PORT ADMIN_PORT\n" is written there once bound
};

/// Serves until SIGTERM/SIGINT, then drains and returns 0 (non-zero on a start-up failure).
int run(std::shared_ptr<const config::config> cfg, const run_options& opts);

} // namespace onceproxy::app
