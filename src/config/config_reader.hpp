#pragma once
// Walks one parsed YAML document into a resolved config, recording every problem.

#include "onceproxy/config/config.hpp"
#include "onceproxy/config/load.hpp"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace onceproxy::config {

/// Reads `root` (the document of `file`) into a config with every route's idempotency block
/// resolved. Problems are appended to `errors`; the returned value is meaningful only when no
/// error was added.
config read_config(const YAML::Node& root, const std::string& file,
                   std::vector<config_error>& errors);

} // namespace onceproxy::config
