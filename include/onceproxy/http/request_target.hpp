#pragma once
// The request target as routing sees it. A route guards a path; if `/v1//payments`,
// `/v1/./payments` or `/v1/%70ayments` reached the upstream's /v1/payments without matching the
// guarded route, a retry would execute twice. So the path is normalised once, before routing,
// and the normalised target is what the upstream receives: both sides read the same path.
//
// Rules (README "Path normalisation"):
//   - origin-form only ("/path?query"): absolute-form (`http://host/x`), authority-form and the
//     asterisk (`*`) are refused;
//   - percent-encoded unreserved characters (ALPHA DIGIT - . _ ~) are decoded (RFC 3986 §6.2.2.2)
//     and the hex digits of every other escape are upper-cased;
//   - an encoded slash or backslash (%2F, %5C) is refused: decoding it would change the segments,
//     keeping it lets the upstream decode it differently;
//   - a malformed escape, a control character, a space, a backslash or a '#' is refused, and so
//     is an encoded NUL (%00);
//   - a dot segment with path parameters ("..;x", ".;") is refused: Tomcat and Jetty resolve it
//     after stripping the parameters, so /public/..;/admin would be /admin to them;
//   - runs of '/' become one '/';
//   - dot segments ("." and "..", also once decoded from %2E) are removed (RFC 3986 §5.2.4); a
//     ".." above the root is refused.
// The query is kept byte for byte.

#include <cstddef>
#include <string>
#include <string_view>

namespace onceproxy::http {

/// Why a target is refused (empty: accepted).
struct target_result {
    std::string target;            ///< normalised path + the original "?query" (when accepted)
    std::size_t path_size = 0;     ///< length of the path part of `target`
    const char* refused = nullptr; ///< a reason for the 400 detail, or nullptr

    std::string_view path() const noexcept { return std::string_view(target).substr(0, path_size); }
};

/// Normalises `raw` (the request line's target). On success `refused` is null.
target_result normalize_target(std::string_view raw);

/// True when normalize_target would accept `raw` and return it unchanged; false when it might
/// not (then call it). One pass, no allocation: the common request takes only this.
bool is_normal_target(std::string_view raw) noexcept;

} // namespace onceproxy::http
