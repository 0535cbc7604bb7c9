#pragma once
// A small reader over a yaml-cpp tree that records problems instead of throwing, so one pass
// reports every error of the file (SPEC §4, STYLE §6). Private to src/config: the only place
// that includes yaml-cpp.

#include "onceproxy/config/config.hpp"
#include "onceproxy/config/load.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onceproxy::config {

/// One value looked up in the tree, with what is needed to blame it.
struct yaml_field {
    /// Undefined when the key is absent, and in a field never read (a default YAML::Node would
    /// count as a present null value: a mark never set must not be blamed at 1:1).
    YAML::Node node{YAML::NodeType::Undefined};
    YAML::Mark mark; ///< the value; the key when the value is empty; the parent when absent
    std::string path;

    yaml_field() = default;
    yaml_field(YAML::Node n, YAML::Mark m, std::string p)
        : node(std::move(n)), mark(m), path(std::move(p)) {}
    yaml_field(const yaml_field&) = default;
    yaml_field(yaml_field&&) = default;
    /// Rebinds the field: YAML::Node's own assignment would write the value into the node it
    /// refers to, which for a mark assigned twice is a node of the parsed document.
    yaml_field& operator=(const yaml_field& o) {
        if (this != &o) {
            node.reset(o.node);
            mark = o.mark;
            path = o.path;
        }
        return *this;
    }
    yaml_field& operator=(yaml_field&& o) {
        if (this != &o) {
            node.reset(o.node);
            mark = o.mark;
            path = std::move(o.path);
        }
        return *this;
    }
    ~yaml_field() = default;

    bool present() const { return node.IsDefined(); }
};

class yaml_walker {
public:
    yaml_walker(std::string file, std::vector<config_error>& errors)
        : file_(std::move(file)), errors_(errors) {}

    void error(const YAML::Mark& at, const std::string& path, std::string message);
    void error(const yaml_field& at, std::string message) {
        error(at.mark, at.path, std::move(message));
    }

    /// The document root as a field (path "").
    yaml_field root(const YAML::Node& node) const;

    /// Checks that `field` is a mapping whose keys are unique scalars from `allowed`; records
    /// every unknown or duplicate key. False (error recorded) when it is not a mapping.
    bool mapping(const yaml_field& field, std::initializer_list<std::string_view> allowed);
    /// Same for a mapping with free-form keys (names): only duplicates are errors.
    bool named_mapping(const yaml_field& field);
    /// The entries of a mapping in document order, first occurrence of each key only.
    std::vector<std::pair<std::string, yaml_field>> entries(const yaml_field& field) const;

    /// `key` inside the mapping `parent` (first occurrence); absent when missing.
    yaml_field get(const yaml_field& parent, std::string_view key) const;
    /// Same, but records "missing required key" at the parent mapping when absent.
    yaml_field require(const yaml_field& parent, std::string_view key);
    /// Checks that `field` is a sequence; false (error recorded) otherwise.
    bool sequence(const yaml_field& field);
    /// Element `index` of a sequence.
    yaml_field item(const yaml_field& seq, std::size_t index) const;

    // Typed readers. Each returns nullopt without an error when the field is absent, and
    // nullopt with an error recorded when it is present but invalid.

    /// A scalar, after ${VAR} substitution. `expected` names the type in messages.
    std::optional<std::string> scalar(const yaml_field& field, std::string_view expected);
    /// A non-empty string.
    std::optional<std::string> string(const yaml_field& field);
    /// true/false; yes/no and on/off too, in any case, as YAML 1.1 files commonly write them.
    std::optional<bool> boolean(const yaml_field& field);
    std::optional<std::uint64_t> integer(const yaml_field& field, std::uint64_t min,
                                         std::uint64_t max);
    /// A positive duration ("30s").
    std::optional<duration> positive_duration(const yaml_field& field);
    /// A duration that may be zero ("0s", or a bare "0").
    std::optional<duration> duration_or_zero(const yaml_field& field);
    /// A positive size ("1MiB").
    std::optional<std::size_t> positive_size(const yaml_field& field);
    /// A sequence of non-empty strings.
    std::optional<std::vector<std::string>> string_list(const yaml_field& field);

    template <class E>
    std::optional<E> enumeration(const yaml_field& field,
                                 std::initializer_list<std::pair<std::string_view, E>> values) {
        const auto text = scalar(field, "one of " + join_names(values));
        if (!text) {
            return std::nullopt;
        }
        for (const auto& [name, value] : values) {
            if (*text == name) {
                return value;
            }
        }
        error(field, "invalid value '" + *text + "'; expected one of " + join_names(values));
        return std::nullopt;
    }

    /// Marks are 0-based in yaml-cpp, -1 when unknown.
    static int line_of(const YAML::Mark& m) { return m.line < 0 ? 0 : m.line + 1; }
    static int column_of(const YAML::Mark& m) { return m.column < 0 ? 0 : m.column + 1; }

private:
    template <class E>
    static std::string join_names(std::initializer_list<std::pair<std::string_view, E>> values) {
        std::string out;
        for (const auto& v : values) {
            if (!out.empty()) {
                out += ", ";
            }
            out += v.first;
        }
        return out;
    }

    bool check_mapping(const yaml_field& field,
                       const std::initializer_list<std::string_view>* allowed);
    static std::string child_path(const std::string& parent, std::string_view key);
    static const char* kind_name(const YAML::Node& node);

    std::string file_;
    std::vector<config_error>& errors_;
};

} // namespace onceproxy::config
