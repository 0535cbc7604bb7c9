#pragma once
// A rejected config in the process log, at start and on a reload.

#include "onceproxy/config/load.hpp"

#include <string_view>

namespace onceproxy::app {

/// One error line per problem (component "config"; msg "file:line:column: path: message", the
/// same location also as fields), then one line `what` with the count.
void log_config_errors(const config::config_errors& e, std::string_view what);

} // namespace onceproxy::app
