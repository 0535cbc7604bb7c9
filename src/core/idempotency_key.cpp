#include <onceproxy/core/idempotency_key.hpp>

#include <onceproxy/core/canonical_json.hpp>
#include <onceproxy/text/ows.hpp>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

namespace onceproxy::core {

namespace {

key_parse_result failure(key_error e) {
    return key_parse_result{std::nullopt, e};
}

/// RFC 9651 §4.2.5 (Parsing a String), plus "nothing may follow": the whole of `v` must be
/// one sf-string. Returns the unescaped content, or nullopt.
std::optional<std::string> parse_sf_string(std::string_view v) {
    if (v.size() < 2 || v.front() != '"') {
        return std::nullopt;
    }
    std::string out;
    out.reserve(v.size());
    for (std::size_t i = 1; i < v.size(); ++i) {
        const char c = v[i];
        if (c == '\\') {
            if (i + 1 >= v.size()) {
                return std::nullopt;
            }
            const char next = v[++i];
            if (next != '"' && next != '\\') {
                return std::nullopt;
            }
            out.push_back(next);
        } else if (c == '"') {
            // A closing quote must end the value: parameters (`;a=1`) or further list
            // members (`"a", "b"`) make it something other than a single key.
            if (i + 1 != v.size()) {
                return std::nullopt;
            }
            return out;
        } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
            return std::nullopt;
        } else {
            out.push_back(c);
        }
    }
    return std::nullopt; // no closing quote
}

/// A bare key as most clients send it (Stripe's SDKs): visible ASCII without the characters
/// that would make it a list or a quoted string.
bool is_bare_token(std::string_view v) noexcept {
    for (const char c : v) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x21 || u > 0x7e || c == ',' || c == '"' || c == '\\') {
            return false;
        }
    }
    return true;
}

} // namespace

key_parse_result parse_idempotency_key(std::span<const std::string_view> header_lines,
                                       key_syntax syntax, std::size_t max_length) {
    if (header_lines.empty()) {
        return failure(key_error::missing);
    }
    // RFC 9651 would join repeated lines into a list; a list is never a key.
    if (header_lines.size() > 1) {
        return failure(key_error::repeated);
    }
    const std::string_view value = text::trim_ows(header_lines.front());
    if (value.empty()) {
        return failure(key_error::empty);
    }

    std::string key;
    if (value.front() == '"') {
        auto unquoted = parse_sf_string(value);
        if (!unquoted) {
            return failure(key_error::malformed);
        }
        key = std::move(*unquoted);
    } else if (syntax == key_syntax::lenient && is_bare_token(value)) {
        key.assign(value);
    } else {
        return failure(key_error::malformed);
    }

    if (key.empty()) {
        return failure(key_error::empty);
    }
    if (key.size() > max_length) {
        return failure(key_error::too_long);
    }
    return key_parse_result{std::move(key), std::nullopt};
}

std::optional<std::string> extract_json_pointer(std::string_view body, std::string_view pointer) {
    // boost::json::parse keeps the last of duplicate member names while other parsers keep
    // the first: with duplicates, the upstream might read another id than the one we key on.
    // canonicalize_json refuses duplicates (and whatever else is not JSON).
    if (!canonicalize_json(body)) {
        return std::nullopt;
    }
    boost::json::error_code ec;
    const boost::json::value doc = boost::json::parse(body, ec);
    if (ec) {
        return std::nullopt;
    }
    const boost::json::value* found = doc.find_pointer(pointer, ec);
    if (ec || found == nullptr) {
        return std::nullopt;
    }
    if (const auto* s = found->if_string()) {
        return std::string(s->data(), s->size());
    }
    if (const auto* i = found->if_int64()) {
        return std::to_string(*i);
    }
    if (const auto* u = found->if_uint64()) {
        return std::to_string(*u);
    }
    return std::nullopt;
}

} // namespace onceproxy::core
