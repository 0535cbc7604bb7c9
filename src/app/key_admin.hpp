#pragma once
// Key administration (SPEC §6): an operator looks up or purges the record of one idempotency
// key, through the admin listener (GET/DELETE /admin/v1/keys) or the command line
// (`onceproxy keys inspect|purge`). Both address a key the way a client does, by route,
// idempotency key and principal, and derive the store key with the request path's own code
// (core::scoped_store_key), so they find exactly the record a retry would find.

#include "onceproxy/config/config.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/store/store.hpp"

#include <chrono>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace onceproxy::app {

/// A key as the operator names it.
struct key_address {
    std::string route; ///< route name
    std::string key;   ///< the idempotency key as the application sends it (unquoted)
    /// The principal: each entry is "Header-Name: value" for one of the route's scope headers,
    /// or a bare value, which is the value of the route's first scope header (Authorization by
    /// default); on a route with `scope.principal: client_cert`, the bare value is instead the
    /// subject of the client certificate (RFC 2253, as the request path reads it, e.g.
    /// "CN=billing,O=acme"). None: the anonymous principal (no scope header, no certificate).
    std::vector<std::string> principal;
};

/// A key address resolved against a config.
struct resolved_key {
    const config::route_config* route = nullptr;
    std::string store_key; ///< as the request path derives it (also the access log's key_hash)
};

/// The route and store key of `a`, or why there are none (unknown route, empty or too long
/// key, a principal header that is not a scope header of the route).
std::variant<resolved_key, std::string> resolve_key(const config::config& cfg,
                                                    const key_address& a);

/// The JSON object describing what `info` says about `k` (state, lease left and owner age in
/// flight; status, recorded and expiry times, body size and replayability when completed).
/// `now` is the wall clock the remaining times are counted from. The record is opened with the
/// keys of `encryption` (store.encryption), as a replay would open it.
std::string describe_key(const resolved_key& k, const store::key_info& info,
                         std::chrono::system_clock::time_point now,
                         const config::encryption_config& encryption);

/// The JSON object describing a purge's result.
std::string describe_purge(const resolved_key& k, store::purge_status result, bool force);

/// Logs a purge (the key hashed) and counts it in metrics::family::keys_purged (when `reg` is
/// given). `via` names the way it came: "admin_api" or "cli".
void note_purge(const resolved_key& k, store::purge_status result, std::string_view via,
                metrics::registry* reg);

} // namespace onceproxy::app
