#pragma once
// First-match-wins route lookup over config::routes (SPEC §4). Pure: no I/O.

#include "onceproxy/config/config.hpp"

#include <string_view>

namespace onceproxy::config {

/// Matches `path` (without the query) against one route's match block.
bool matches(const route_match& m, std::string_view method, std::string_view path) noexcept;

/// The first route that matches, or nullptr.
const route_config* find_route(const config& cfg, std::string_view method,
                               std::string_view path) noexcept;

} // namespace onceproxy::config
