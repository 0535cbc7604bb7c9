#include "app/config_errors_log.hpp"

#include "onceproxy/log/log.hpp"

namespace onceproxy::app {

void log_config_errors(const config::config_errors& e, std::string_view what) {
    for (const auto& err : e.errors()) {
        log::error("config", err.to_string(),
                   {{"file", err.file},
                    {"line", err.line},
                    {"column", err.column},
                    {"path", err.path},
                    {"error", err.message}});
    }
    log::error("config", what, {{"errors", e.errors().size()}});
}

} // namespace onceproxy::app
