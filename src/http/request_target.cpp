#include "onceproxy/http/request_target.hpp"

#include "onceproxy/text/hex.hpp"

#include <cstddef>
#include <vector>

namespace onceproxy::http {
namespace {

using text::hex_value;

bool unreserved(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

/// Decodes unreserved escapes and upper-cases the others; refuses what cannot be routed safely.
const char* decode_path(std::string_view in, std::string& out) {
    static constexpr char digits[] = "0123456789ABCDEF";
    out.reserve(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
        const auto c = static_cast<unsigned char>(in[i]);
        if (c <= 0x20 || c == 0x7f || c == '\\' || c == '#') {
            return "the request path contains a character that is not allowed";
        }
        if (c != '%') {
            out += static_cast<char>(c);
            continue;
        }
        const int hi = i + 2 < in.size() ? hex_value(in[i + 1]) : -1;
        const int lo = hi >= 0 ? hex_value(in[i + 2]) : -1;
        if (lo < 0) {
            return "the request path has a malformed percent-encoding";
        }
        const auto decoded = static_cast<unsigned char>(hi * 16 + lo);
        if (decoded == '/' || decoded == '\\') {
            return "the request path contains an encoded slash or backslash";
        }
        if (decoded == 0) {
            // C-string code (and Tomcat, Node's older url module) would end the path here.
            return "the request path contains an encoded NUL (%00)";
        }
        if (unreserved(decoded)) {
            out += static_cast<char>(decoded);
        } else {
            out += '%';
            out += digits[hi];
            out += digits[lo];
        }
        i += 2;
    }
    return nullptr;
}

/// Merges slashes and removes dot segments of an absolute path (it starts with '/').
const char* resolve_segments(std::string_view path, std::string& out) {
    std::vector<std::string_view> segments;
    std::size_t pos = 1;
    bool trailing_slash = false;
    while (pos <= path.size()) {
        const auto slash = path.find('/', pos);
        const auto end = slash == std::string_view::npos ? path.size() : slash;
        const auto seg = path.substr(pos, end - pos);
        const bool last = slash == std::string_view::npos;
        const auto bare = seg.substr(0, seg.find(';'));
        if (bare.size() != seg.size() && (bare == "." || bare == "..")) {
            // Tomcat and Jetty strip ";params" first and then resolve the dot segment:
            // /public/..;/admin is /admin to them, a path below /public to anyone else.
            return "the request path has a dot segment with parameters (..;)";
        }
        if (seg == "..") {
            if (segments.empty()) {
                return "the request path climbs above the root";
            }
            segments.pop_back();
            trailing_slash = true;
        } else if (seg == "." || seg.empty()) {
            trailing_slash = !segments.empty() || last;
        } else {
            segments.push_back(seg);
            trailing_slash = false;
        }
        if (last) {
            break;
        }
        pos = slash + 1;
    }
    out.clear();
    for (const auto seg : segments) {
        out += '/';
        out += seg;
    }
    if (out.empty() || trailing_slash) {
        out += '/';
    }
    return nullptr;
}

} // namespace

target_result normalize_target(std::string_view raw) {
    target_result r;
    if (raw.empty() || raw.front() != '/') {
        r.refused = raw == "*" ? "the asterisk target is not accepted"
                               : "only origin-form request targets (/path?query) are accepted";
        return r;
    }
    const auto q = raw.find('?');
    const auto raw_path = raw.substr(0, q);
    std::string decoded;
    if ((r.refused = decode_path(raw_path, decoded)) != nullptr) {
        return r;
    }
    if ((r.refused = resolve_segments(decoded, r.target)) != nullptr) {
        return r;
    }
    const auto path_size = r.target.size();
    if (q != std::string_view::npos) {
        r.target.append(raw.substr(q));
    }
    r.path_size = path_size;
    return r;
}

bool is_normal_target(std::string_view raw) noexcept {
    if (raw.empty() || raw.front() != '/') {
        return false;
    }
    const auto path = raw.substr(0, raw.find('?'));
    for (std::size_t i = 0; i < path.size(); ++i) {
        const auto c = static_cast<unsigned char>(path[i]);
        if (c <= 0x20 || c == 0x7f || c == '\\' || c == '#' || c == '%') {
            return false;
        }
        if (c == '/' && i + 1 < path.size()) {
            const auto next = path.substr(i + 1);
            // "//", "/." and "/.." segments
            if (next.front() == '/' || next == "." || next.starts_with("./") || next == ".." ||
                next.starts_with("../") || next.starts_with(".;") || next.starts_with("..;")) {
                return false;
            }
        }
    }
    return true;
}

} // namespace onceproxy::http
