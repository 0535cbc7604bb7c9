#pragma once
// One decoded RESP2 reply, owned (copied out of hiredis's reader so that hiredis stays private
// to the store module).

#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::redis {

struct redis_reply {
    enum class kind {
        string,  ///< bulk string: `str`
        array,   ///< multi-bulk: `elements`
        integer, ///< `integer`
        nil,     ///< null bulk or null array
        status,  ///< simple string (+OK): `str`
        error,   ///< error reply (-ERR ...): `str`, the connection stays usable
    };

    kind type = kind::nil;
    std::string str;
    long long integer = 0;
    std::vector<redis_reply> elements;

    bool is_error() const noexcept { return type == kind::error; }
    /// True for an error reply whose first word is `prefix` (e.g. "NOSCRIPT", "WRONGPASS").
    bool is_error(std::string_view prefix) const noexcept {
        return type == kind::error && std::string_view(str).substr(0, prefix.size()) == prefix &&
               (str.size() == prefix.size() || str[prefix.size()] == ' ');
    }
};

} // namespace onceproxy::redis
