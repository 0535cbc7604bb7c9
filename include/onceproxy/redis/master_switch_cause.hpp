#pragma once
// What moved a Sentinel-discovered connection to another master (redis_sentinel.hpp).

#include <cstddef>

namespace onceproxy::redis {

/// What moved the connections to another master: the `cause` label of
/// onceproxy_store_master_switches_total.
enum class master_switch_cause {
    switch_master,   ///< a sentinel announced the new master (+switch-master)
    readonly,        ///< a write got -READONLY (a demoted master); the reconnect found another
    connection_lost, ///< the connection was lost; the reconnect found another master
};
inline constexpr std::size_t master_switch_cause_count = 3;

/// The label value of `c`: "switch_master", "readonly", "connection_lost".
constexpr const char* to_string(master_switch_cause c) noexcept {
    switch (c) {
    case master_switch_cause::switch_master:
        return "switch_master";
    case master_switch_cause::readonly:
        return "readonly";
    case master_switch_cause::connection_lost:
        return "connection_lost";
    }
    return "unknown";
}

} // namespace onceproxy::redis
