#pragma once
// ${VAR} substitution in scalar values (SPEC §4: secrets stay out of ConfigMaps).

#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::config {

/// Replaces every `${NAME}` in `text` with the environment variable NAME (NAME is
/// [A-Za-z_][A-Za-z0-9_]*); `$${` stands for a literal `${`, and a `$` not followed by `{` is
/// kept as is. Substitution applies to one scalar value at a time, after YAML parsing, so a
/// variable's value can never change the document's structure (a password containing `: ` or
/// `#` stays one string).
/// Returns nullopt and sets `error` for an unset variable or a malformed reference.
std::optional<std::string> substitute_env(std::string_view text, std::string& error);

} // namespace onceproxy::config
