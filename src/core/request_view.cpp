#include <onceproxy/core/request_view.hpp>

namespace onceproxy::core {

bool ascii_iequals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) {
        return false;
    }
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    for (std::size_t i = 0; i < a.size(); ++i) {
        // Names mostly arrive spelled as configured: equal bytes need no case folding.
        if (a[i] != b[i] && lower(a[i]) != lower(b[i])) {
            return false;
        }
    }
    return true;
}

std::vector<std::string_view> request_view::values(std::string_view name) const {
    std::vector<std::string_view> out;
    for (const auto& [n, v] : headers) {
        if (ascii_iequals(n, name)) {
            out.push_back(v);
        }
    }
    return out;
}

std::string_view request_view::value(std::string_view name) const noexcept {
    for (const auto& [n, v] : headers) {
        if (ascii_iequals(n, name)) {
            return v;
        }
    }
    return {};
}

} // namespace onceproxy::core
