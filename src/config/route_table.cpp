#include "onceproxy/config/route_table.hpp"

#include <algorithm>

namespace onceproxy::config {
namespace {

/// Next segment of a path starting at `pos` (just after a '/'); advances `pos` past it.
std::string_view next_segment(std::string_view path, std::size_t& pos) {
    const auto slash = path.find('/', pos);
    const auto end = slash == std::string_view::npos ? path.size() : slash;
    const auto segment = path.substr(pos, end - pos);
    pos = slash == std::string_view::npos ? std::string_view::npos : slash + 1;
    return segment;
}

bool is_param(std::string_view segment) {
    return segment.size() > 2 && segment.front() == '{' && segment.back() == '}';
}

/// Segment by segment: a {param} matches exactly one non-empty segment, a literal matches
/// itself; both must run out together, so /a/{id} matches neither /a/ nor /a/1/b.
bool matches_template(std::string_view tmpl, std::string_view path) {
    if (tmpl.empty() || path.empty() || tmpl.front() != '/' || path.front() != '/') {
        return false;
    }
    std::size_t tp = 1;
    std::size_t pp = 1;
    while (tp != std::string_view::npos && pp != std::string_view::npos) {
        const auto t = next_segment(tmpl, tp);
        const auto p = next_segment(path, pp);
        if (is_param(t) ? p.empty() : t != p) {
            return false;
        }
    }
    return tp == std::string_view::npos && pp == std::string_view::npos;
}

} // namespace

bool matches(const route_match& m, std::string_view method, std::string_view path) noexcept {
    if (!m.methods.empty() &&
        std::find(m.methods.begin(), m.methods.end(), method) == m.methods.end()) {
        return false;
    }
    switch (m.kind) {
    case path_match_kind::exact:
        return path == m.path;
    case path_match_kind::prefix:
        return path.starts_with(m.path);
    case path_match_kind::pattern:
        return matches_template(m.path, path);
    }
    return false;
}

const route_config* find_route(const config& cfg, std::string_view method,
                               std::string_view path) noexcept {
    for (const auto& route : cfg.routes) {
        if (matches(route.match, method, path)) {
            return &route;
        }
    }
    return nullptr;
}

} // namespace onceproxy::config
