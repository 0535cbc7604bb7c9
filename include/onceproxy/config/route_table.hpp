#pragma once
// First-match-wins route lookup over config::routes (SPEC §4). Pure: no I/O.

#include "onceproxy/config/config.hpp"

#include <string_view>

namespace onceproxy::config {

/// Matches `path` (without the query, normalised) against one route's match block, read the way
/// the block's path_params, trailing_slash and case say (README "Route matching").
/// It allocates only for a path with `;params`.
bool matches(const route_match& m, std::string_view method, std::string_view path);

/// True when `route` refuses `path` (path_params: refuse and the path has `;params`); the route
/// matched it, the request gets 400.
bool refuses_path(const route_config& route, std::string_view path) noexcept;

/// The first route that matches, or nullptr. A grpc match matches gRPC calls only
/// (`grpc_call`: the request's content-type is application/grpc or application/grpc+...).
const route_config* find_route(const config& cfg, std::string_view method, std::string_view path,
                               bool grpc_call = false);

} // namespace onceproxy::config
