#include "config/yaml_walker.hpp"

#include "config/env_substitution.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>

namespace onceproxy::config {

void yaml_walker::error(const YAML::Mark& at, const std::string& path, std::string message) {
    errors_.push_back(config_error{file_, line_of(at), column_of(at), path, std::move(message)});
}

yaml_field yaml_walker::root(const YAML::Node& node) const {
    return yaml_field{node, node.Mark(), ""};
}

std::string yaml_walker::child_path(const std::string& parent, std::string_view key) {
    if (parent.empty()) {
        return std::string{key};
    }
    return parent + "." + std::string{key};
}

const char* yaml_walker::kind_name(const YAML::Node& node) {
    switch (node.Type()) {
    case YAML::NodeType::Null:
        return "an empty value";
    case YAML::NodeType::Scalar:
        return "a scalar";
    case YAML::NodeType::Sequence:
        return "a sequence";
    case YAML::NodeType::Map:
        return "a mapping";
    case YAML::NodeType::Undefined:
        break;
    }
    return "nothing";
}

bool yaml_walker::mapping(const yaml_field& field,
                          std::initializer_list<std::string_view> allowed) {
    return check_mapping(field, &allowed);
}

bool yaml_walker::named_mapping(const yaml_field& field) {
    return check_mapping(field, nullptr);
}

std::vector<std::pair<std::string, yaml_field>>
yaml_walker::entries(const yaml_field& field) const {
    std::vector<std::pair<std::string, yaml_field>> out;
    if (!field.node.IsMap()) {
        return out;
    }
    for (const auto& kv : field.node) {
        if (!kv.first.IsScalar()) {
            continue;
        }
        const std::string& name = kv.first.Scalar();
        const bool repeated =
            std::any_of(out.begin(), out.end(), [&](const auto& e) { return e.first == name; });
        if (!repeated) {
            const YAML::Mark mark = kv.second.IsNull() ? kv.first.Mark() : kv.second.Mark();
            out.emplace_back(name, yaml_field{kv.second, mark, child_path(field.path, name)});
        }
    }
    return out;
}

bool yaml_walker::check_mapping(const yaml_field& field,
                                const std::initializer_list<std::string_view>* allowed) {
    if (!field.node.IsMap()) {
        error(field, std::string{"expected a mapping, got "} + kind_name(field.node));
        return false;
    }
    std::string allowed_list;
    if (allowed != nullptr) {
        for (const auto key : *allowed) {
            allowed_list += allowed_list.empty() ? "" : ", ";
            allowed_list += key;
        }
    }
    // yaml-cpp keeps every occurrence of a repeated key and lookups return the first one, so a
    // duplicate would silently lose a value: it is an error here.
    std::map<std::string, int, std::less<>> seen;
    for (const auto& kv : field.node) {
        const YAML::Node& key = kv.first;
        if (!key.IsScalar()) {
            error(key.Mark(), field.path, "mapping keys must be plain strings");
            continue;
        }
        const std::string& name = key.Scalar();
        const std::string path = child_path(field.path, name);
        if (const auto prev = seen.find(name); prev != seen.end()) {
            error(key.Mark(), path,
                  "duplicate key '" + name + "' (first defined at line " +
                      std::to_string(prev->second) + ")");
            continue;
        }
        seen.emplace(name, line_of(key.Mark()));
        if (allowed != nullptr &&
            std::find(allowed->begin(), allowed->end(), std::string_view{name}) == allowed->end()) {
            error(key.Mark(), path, "unknown key '" + name + "'; allowed keys: " + allowed_list);
        }
    }
    return true;
}

yaml_field yaml_walker::get(const yaml_field& parent, std::string_view key) const {
    const std::string path = child_path(parent.path, key);
    if (parent.node.IsMap()) {
        for (const auto& kv : parent.node) {
            if (kv.first.IsScalar() && kv.first.Scalar() == key) {
                // An empty value's mark points past the key; blame the key instead.
                const YAML::Mark mark = kv.second.IsNull() ? kv.first.Mark() : kv.second.Mark();
                return yaml_field{kv.second, mark, path};
            }
        }
    }
    return yaml_field{YAML::Node{YAML::NodeType::Undefined}, parent.mark, path};
}

yaml_field yaml_walker::require(const yaml_field& parent, std::string_view key) {
    yaml_field f = get(parent, key);
    if (!f.present() && parent.node.IsMap()) {
        error(parent.mark, f.path, "missing required key '" + std::string{key} + "'");
    }
    return f;
}

bool yaml_walker::sequence(const yaml_field& field) {
    if (!field.node.IsSequence()) {
        error(field, std::string{"expected a sequence, got "} + kind_name(field.node));
        return false;
    }
    return true;
}

yaml_field yaml_walker::item(const yaml_field& seq, std::size_t index) const {
    const YAML::Node node = seq.node[index];
    return yaml_field{node, node.IsNull() ? seq.mark : node.Mark(),
                      seq.path + "[" + std::to_string(index) + "]"};
}

std::optional<std::string> yaml_walker::scalar(const yaml_field& field, std::string_view expected) {
    if (!field.present()) {
        return std::nullopt;
    }
    if (!field.node.IsScalar()) {
        error(field, "expected " + std::string{expected} + ", got " + kind_name(field.node));
        return std::nullopt;
    }
    std::string problem;
    auto value = substitute_env(field.node.Scalar(), problem);
    if (!value) {
        error(field, problem);
    }
    return value;
}

std::optional<std::string> yaml_walker::string(const yaml_field& field) {
    auto value = scalar(field, "a string");
    if (value && value->empty()) {
        error(field, "expected a non-empty string");
        return std::nullopt;
    }
    return value;
}

std::optional<bool> yaml_walker::boolean(const yaml_field& field) {
    const auto text = scalar(field, "true or false");
    if (!text) {
        return std::nullopt;
    }
    std::string lower = *text;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true" || lower == "yes" || lower == "on") {
        return true;
    }
    if (lower == "false" || lower == "no" || lower == "off") {
        return false;
    }
    error(field, "invalid boolean '" + *text + "'; expected true or false");
    return std::nullopt;
}

std::optional<std::uint64_t> yaml_walker::integer(const yaml_field& field, std::uint64_t min,
                                                  std::uint64_t max) {
    const auto text = scalar(field, "an integer");
    if (!text) {
        return std::nullopt;
    }
    std::uint64_t value = 0;
    const char* first = text->data();
    const char* last = first + text->size();
    const auto [ptr, ec] = std::from_chars(first, last, value);
    if (text->empty() || ec != std::errc{} || ptr != last || value < min || value > max) {
        error(field, "invalid integer '" + *text + "'; expected an integer from " +
                         std::to_string(min) + " to " + std::to_string(max));
        return std::nullopt;
    }
    return value;
}

std::optional<duration> yaml_walker::positive_duration(const yaml_field& field) {
    const auto text = scalar(field, "a duration");
    if (!text) {
        return std::nullopt;
    }
    const auto value = parse_duration(*text);
    if (!value || value->count() <= 0) {
        error(field, "invalid duration '" + *text +
                         "'; expected a positive integer with a unit: ms, s, m, h or d (e.g. 30s)");
        return std::nullopt;
    }
    return value;
}

std::optional<duration> yaml_walker::duration_or_zero(const yaml_field& field) {
    const auto text = scalar(field, "a duration");
    if (!text) {
        return std::nullopt;
    }
    if (*text == "0") {
        return duration{0};
    }
    const auto value = parse_duration(*text);
    if (!value) {
        error(field, "invalid duration '" + *text +
                         "'; expected 0 or an integer with a unit: ms, s, m, h or d (e.g. 5s)");
        return std::nullopt;
    }
    return value;
}

std::optional<std::size_t> yaml_walker::positive_size(const yaml_field& field) {
    const auto text = scalar(field, "a size");
    if (!text) {
        return std::nullopt;
    }
    const auto value = parse_size(*text);
    if (!value || *value == 0) {
        error(field, "invalid size '" + *text +
                         "'; expected a positive byte count, optionally with a unit: B, KiB, "
                         "MiB, GiB, TiB, KB, MB, GB, TB (e.g. 1MiB)");
        return std::nullopt;
    }
    return value;
}

std::optional<std::vector<std::string>> yaml_walker::string_list(const yaml_field& field) {
    if (!field.present()) {
        return std::nullopt;
    }
    if (!sequence(field)) {
        return std::nullopt;
    }
    std::vector<std::string> out;
    bool ok = true;
    for (std::size_t i = 0; i < field.node.size(); ++i) {
        auto value = string(item(field, i));
        if (value) {
            out.push_back(std::move(*value));
        } else {
            ok = false;
        }
    }
    if (!ok) {
        return std::nullopt;
    }
    return out;
}

} // namespace onceproxy::config
