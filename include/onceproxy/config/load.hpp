#pragma once
// YAML → validated config. The only module that sees yaml-cpp.

#include "onceproxy/config/config.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::config {

/// One validation problem, located in the source file.
struct config_error {
    std::string file;
    int line = 0;        ///< 1-based; 0 when unknown
    int column = 0;      ///< 1-based; 0 when unknown
    std::string path;    ///< YAML path, e.g. routes[2].idempotency.ttl
    std::string message; ///< what is wrong and what was expected
    /// "file:line:column: path: message"
    std::string to_string() const;
};

/// Thrown by load_file/load_string with every error found (all at once, never only the first).
class config_errors : public std::runtime_error {
public:
    explicit config_errors(std::vector<config_error> errors);
    const std::vector<config_error>& errors() const noexcept { return errors_; }

private:
    std::vector<config_error> errors_;
};

/// Reads, substitutes ${VAR} from the environment, validates and resolves (defaults merged into
/// every route). Throws config_errors.
std::shared_ptr<const config> load_file(const std::string& path);

/// Same as load_file, from text; `file` names the source in error messages.
std::shared_ptr<const config> load_string(const std::string& yaml, const std::string& file);

/// "500ms", "30s", "5m", "24h", "7d" → milliseconds. nullopt when malformed.
std::optional<duration> parse_duration(std::string_view text);

/// "512", "64KiB", "1MiB", "1GiB" (also KB/MB/GB as powers of 1000) → bytes. nullopt when
/// malformed.
std::optional<std::size_t> parse_size(std::string_view text);

} // namespace onceproxy::config
