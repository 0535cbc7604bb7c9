#include "config/env_substitution.hpp"

#include <cstdlib>

namespace onceproxy::config {
namespace {

bool is_name_start(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

bool is_name_char(char c) {
    return is_name_start(c) || (c >= '0' && c <= '9');
}

} // namespace

std::optional<std::string> substitute_env(std::string_view text, std::string& error) {
    std::string out;
    out.reserve(text.size());
    std::size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (c != '$') {
            out.push_back(c);
            ++i;
            continue;
        }
        if (text.substr(i, 3) == "$${") {
            out.append("${");
            i += 3;
            continue;
        }
        if (text.substr(i, 2) != "${") {
            out.push_back(c);
            ++i;
            continue;
        }
        const std::size_t close = text.find('}', i + 2);
        if (close == std::string_view::npos) {
            error = "unterminated ${ in value; expected ${NAME} (write $${ for a literal ${)";
            return std::nullopt;
        }
        const std::string_view name = text.substr(i + 2, close - i - 2);
        bool valid = !name.empty() && is_name_start(name.front());
        for (const char n : name) {
            valid = valid && is_name_char(n);
        }
        if (!valid) {
            error = "invalid variable reference ${" + std::string{name} +
                    "}; expected ${NAME} with NAME made of letters, digits and _";
            return std::nullopt;
        }
        const std::string name_str{name};
        const char* value = std::getenv(name_str.c_str());
        if (value == nullptr) {
            error = "environment variable " + name_str + " is not set (referenced as ${" +
                    name_str + "})";
            return std::nullopt;
        }
        out.append(value);
        i = close + 1;
    }
    return out;
}

} // namespace onceproxy::config
