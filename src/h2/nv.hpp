#pragma once
// Fields to and from nghttp2's name/value pairs, for both sides of a connection.

#include "onceproxy/h2/common.hpp"

#include <nghttp2/nghttp2.h>

#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::h2 {

// Fields HTTP/2 forbids in a message (RFC 9113 §8.2.2); dropped from what we send. `name` is
// lower case. TE may travel only as "te: trailers".
inline bool connection_specific(std::string_view name, std::string_view value) {
    return name == "connection" || name == "keep-alive" || name == "proxy-connection" ||
           name == "transfer-encoding" || name == "upgrade" ||
           (name == "te" && value != "trailers");
}

inline std::string lower(std::string_view s) {
    std::string out(s);
    for (auto& c : out) {
        if (c >= 'A' && c <= 'Z') {
            c = static_cast<char>(c - 'A' + 'a');
        }
    }
    return out;
}

inline nghttp2_nv make_nv(const std::string& name, const std::string& value) {
    // nghttp2 takes non-const pointers but only reads them (NO_COPY flags are not set).
    return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
            reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
            value.size(), NGHTTP2_NV_FLAG_NONE};
}

// `storage` (pseudo-header fields first, if any) then `fields` as nghttp2 name/value pairs:
// lower-case names, no pseudo-header or connection-specific field from `fields`. `storage`
// keeps the strings alive.
inline std::vector<nghttp2_nv> make_nva(const std::vector<field>& fields,
                                        std::vector<field>& storage) {
    storage.reserve(storage.size() + fields.size());
    for (const auto& f : fields) {
        auto name = lower(f.name);
        if (name.empty() || name.front() == ':' || connection_specific(name, f.value)) {
            continue;
        }
        storage.push_back({std::move(name), f.value});
    }
    std::vector<nghttp2_nv> nva;
    nva.reserve(storage.size());
    for (const auto& f : storage) {
        nva.push_back(make_nv(f.name, f.value));
    }
    return nva;
}

} // namespace onceproxy::h2
