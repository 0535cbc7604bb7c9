#pragma once
// What a reload (SIGHUP) may change in a running process, and what needs a restart. Settings
// bound at start (sockets, threads, the store's connections) cannot change under live traffic;
// everything read per request (routes, upstreams, limits, policies, logging) can.

#include "onceproxy/config/config.hpp"

#include <string>
#include <vector>

namespace onceproxy::config {

/// The settings that differ between `running` and `next` and apply only at start, as YAML paths
/// (e.g. "listen", "store.redis.url"), in file order. Empty: `next` can replace `running` live.
///
/// Needing a restart: listen, tls, admin (its listener and readiness checks, including the
/// settings of the upstream a readiness check probes), workers, and the store (type and every
/// connection setting). A Redis or PostgreSQL password read from `password_file` is the
/// exception: a new password in the same file is not a change here (the store uses it on its
/// next connection).
std::vector<std::string> changes_needing_restart(const config& running, const config& next);

} // namespace onceproxy::config
