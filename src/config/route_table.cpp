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

char fold(char c, case_match mode) {
    return mode == case_match::insensitive && c >= 'A' && c <= 'Z'
               ? static_cast<char>(c - 'A' + 'a')
               : c;
}

bool equal(std::string_view a, std::string_view b, case_match mode) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) {
               return fold(x, mode) == fold(y, mode);
           });
}

bool starts_with(std::string_view s, std::string_view prefix, case_match mode) {
    return s.size() >= prefix.size() && equal(s.substr(0, prefix.size()), prefix, mode);
}

/// The position of the next ";" (or its escape %3B, which the normaliser upper-cases) in `path`
/// from `pos`, or npos.
std::size_t find_param(std::string_view path, std::size_t pos = 0) {
    for (; pos < path.size(); ++pos) {
        if (path[pos] == ';' || (path[pos] == '%' && path.substr(pos + 1, 2) == "3B")) {
            return pos;
        }
    }
    return std::string_view::npos;
}

/// `path` with every segment's ";params" removed, in `out` (when there are any).
std::string_view without_params(std::string_view path, std::string& out) {
    auto at = find_param(path);
    if (at == std::string_view::npos) {
        return path;
    }
    out.assign(path.substr(0, at));
    while (at != std::string_view::npos) {
        const auto slash = path.find('/', at);
        if (slash == std::string_view::npos) {
            break;
        }
        at = find_param(path, slash);
        out.append(path.substr(slash, at == std::string_view::npos ? at : at - slash));
    }
    return out;
}

/// `p` without its one trailing '/' (the root stays "/").
std::string_view drop_trailing_slash(std::string_view p) {
    return p.size() > 1 && p.back() == '/' ? p.substr(0, p.size() - 1) : p;
}

/// Segment by segment: a {param} matches exactly one non-empty segment, a literal matches
/// itself; both must run out together, so /a/{id} matches neither /a/ nor /a/1/b.
bool matches_template(std::string_view tmpl, std::string_view path, case_match mode) {
    if (tmpl.empty() || path.empty() || tmpl.front() != '/' || path.front() != '/') {
        return false;
    }
    std::size_t tp = 1;
    std::size_t pp = 1;
    while (tp != std::string_view::npos && pp != std::string_view::npos) {
        const auto t = next_segment(tmpl, tp);
        const auto p = next_segment(path, pp);
        if (is_param(t) ? p.empty() : !equal(t, p, mode)) {
            return false;
        }
    }
    return tp == std::string_view::npos && pp == std::string_view::npos;
}

} // namespace

bool matches(const route_match& m, std::string_view method, std::string_view path) {
    if (!m.methods.empty() &&
        std::find(m.methods.begin(), m.methods.end(), method) == m.methods.end()) {
        return false;
    }
    std::string stripped;
    if (m.path_params != path_params_match::literal) {
        path = without_params(path, stripped);
    }
    const auto mode = m.letter_case;
    const bool slash = m.trailing_slash == trailing_slash_match::ignore;
    switch (m.kind) {
    case path_match_kind::exact:
        return slash ? equal(drop_trailing_slash(path), drop_trailing_slash(m.path), mode)
                     : equal(path, m.path, mode);
    case path_match_kind::prefix:
        return starts_with(path, m.path, mode) ||
               (slash && equal(path, drop_trailing_slash(m.path), mode));
    case path_match_kind::pattern:
        return slash
                   ? matches_template(drop_trailing_slash(m.path), drop_trailing_slash(path), mode)
                   : matches_template(m.path, path, mode);
    }
    return false;
}

bool refuses_path(const route_config& route, std::string_view path) noexcept {
    return route.match.path_params == path_params_match::refuse &&
           find_param(path) != std::string_view::npos;
}

const route_config* find_route(const config& cfg, std::string_view method, std::string_view path,
                               bool grpc_call) {
    for (const auto& route : cfg.routes) {
        if ((grpc_call || route.match.grpc.empty()) && matches(route.match, method, path)) {
            return &route;
        }
    }
    return nullptr;
}

} // namespace onceproxy::config
