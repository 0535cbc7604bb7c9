#pragma once
// Wires the modules: worker threads (one io_context each), listeners, store, admin endpoints,
// signals and graceful drain.

#include "onceproxy/config/config.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace onceproxy::app {

struct run_options {
    std::string port_file; ///< when set, "LISTEN_PORT ADMIN_PORT\n" is written there once bound
    /// When positive: how often the config file is checked for a change (a new inode, size or
    /// modification time, as a ConfigMap update's symlink swap makes); a change reloads it as
    /// SIGHUP does. Zero: only SIGHUP reloads.
    std::chrono::milliseconds watch_interval{0};
};

/// Serves until SIGTERM/SIGINT, then drains and returns 0 (non-zero on a start-up failure).
int run(std::shared_ptr<const config::config> cfg, const run_options& opts);

} // namespace onceproxy::app
