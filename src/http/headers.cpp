#include "onceproxy/http/headers.hpp"

#include "onceproxy/config/cidr.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;
namespace beast = boost::beast;

namespace {

bool starts_with_icase(std::string_view s, std::string_view prefix) {
    return s.size() >= prefix.size() && beast::iequals(s.substr(0, prefix.size()), prefix);
}

bool listed(std::string_view name, std::span<const std::string_view> names) {
    for (const auto n : names) {
        if (beast::iequals(name, n)) {
            return true;
        }
    }
    return false;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
        s.remove_suffix(1);
    }
    return s;
}

} // namespace

bool is_hop_by_hop(bhttp::field name, std::string_view name_string) noexcept {
    switch (name) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::te:
    case bhttp::field::trailer:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
        return true;
    default:
        return starts_with_icase(name_string, "proxy-");
    }
}

namespace {

/// True when `f` holds a field strip_hop_by_hop removes or acts on. Most requests and answers
/// carry none: one pass over the fields then replaces a lookup per hop-by-hop name.
bool has_hop_by_hop(const fields& f) {
    return std::any_of(f.begin(), f.end(), [](const auto& field) {
        return is_hop_by_hop(field.name(), field.name_string());
    });
}

} // namespace

void strip_hop_by_hop(fields& f, std::span<const std::string_view> keep) {
    if (!has_hop_by_hop(f)) {
        return;
    }
    // Headers named by Connection are hop-by-hop too (RFC 9110 §7.6.1), except those in `keep`.
    // The RFC forbids a sender to nominate a field meant for every recipient; a client that does
    // anyway is not obeyed for the fields the proxy reads, or `Connection: Idempotency-Key` would
    // run a keyed request as a keyless one and `Connection: Authorization` would drop the scope.
    std::vector<std::string> named;
    for (auto it = f.find(bhttp::field::connection);
         it != f.end() && it->name() == bhttp::field::connection; ++it) {
        for (auto token : bhttp::token_list{it->value()}) {
            if (!listed(token, keep)) {
                named.emplace_back(token);
            }
        }
    }
    for (const auto& n : named) {
        f.erase(n);
    }
    f.erase(bhttp::field::connection);
    f.erase(bhttp::field::keep_alive);
    f.erase(bhttp::field::te);
    f.erase(bhttp::field::trailer);
    f.erase(bhttp::field::transfer_encoding);
    f.erase(bhttp::field::upgrade);
    for (auto it = f.begin(); it != f.end();) {
        if (starts_with_icase(it->name_string(), "proxy-")) {
            it = f.erase(it);
        } else {
            ++it;
        }
    }
}

std::vector<std::string_view> request_fields_in_use(const config::idempotency_config& idem) {
    std::vector<std::string_view> out{"Host",          "Content-Length", "Content-Type",
                                      "Authorization", "Cookie",         idem.key.header};
    out.insert(out.end(), idem.scope_headers.begin(), idem.scope_headers.end());
    out.insert(out.end(), idem.fingerprint_headers.begin(), idem.fingerprint_headers.end());
    return out;
}

namespace {

/// Every line of `name`, joined with ", " (several lines form one list, RFC 9110 §5.3).
std::string joined_lines(const fields& f, std::string_view name) {
    std::string out;
    for (auto it = f.find(name); it != f.end() && beast::iequals(it->name_string(), name); ++it) {
        if (it->value().empty()) {
            continue;
        }
        if (!out.empty()) {
            out += ", ";
        }
        out += it->value();
    }
    return out;
}

/// A byte table that is true for ASCII letters, digits and the bytes of `extra`: the character
/// classes below are checked for every byte of a header value.
constexpr std::array<bool, 256> alnum_and(std::string_view extra) {
    std::array<bool, 256> t{};
    for (int c = 0; c < 256; ++c) {
        t[static_cast<std::size_t>(c)] =
            (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    for (const char c : extra) {
        t[static_cast<unsigned char>(c)] = true;
    }
    return t;
}

/// RFC 9110 §5.6.2 tchar.
constexpr auto tchar_table = alnum_and("!#$%&'*+-.^_`|~");

bool is_token(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return tchar_table[static_cast<unsigned char>(c)];
    });
}

/// Appends a Forwarded parameter value (RFC 7239 §4) to `out`: a token as is, anything else
/// a quoted-string (escaping runs copied whole, not byte by byte).
void append_forwarded_value(std::string& out, std::string_view v) {
    if (is_token(v)) {
        out += v;
        return;
    }
    out += '"';
    std::size_t from = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '"' || v[i] == '\\') {
            out.append(v.substr(from, i - from)).append(1, '\\');
            from = i;
        }
    }
    out.append(v.substr(from)).append(1, '"');
}

/// Appends the for= node of an address (RFC 7239 §6): IPv6 in brackets, which makes it
/// quoted.
void append_forwarded_node(std::string& out, std::string_view ip) {
    if (ip.find(':') == std::string_view::npos) {
        append_forwarded_value(out, ip);
        return;
    }
    // Brackets and hex digits, colons and dots need no escape inside the quotes.
    out.append("\"[").append(ip).append("]\"");
}

} // namespace

namespace {

/// Which forwarding headers a request carries, found in one pass (most carry none).
struct forwarding_lines {
    bool x_forwarded_for = false;
    bool x_forwarded_proto = false;
    bool x_forwarded_host = false;
    bool forwarded = false;
};

forwarding_lines find_forwarding_lines(const fields& f) {
    static constexpr std::string_view prefix = "x-forwarded-";
    forwarding_lines out;
    for (const auto& field : f) {
        if (field.name() == bhttp::field::forwarded) {
            out.forwarded = true;
            continue;
        }
        const auto n = field.name_string();
        if (field.name() != bhttp::field::unknown || !starts_with_icase(n, prefix)) {
            continue;
        }
        const auto rest = n.substr(prefix.size());
        out.x_forwarded_for = out.x_forwarded_for || beast::iequals(rest, "for");
        out.x_forwarded_proto = out.x_forwarded_proto || beast::iequals(rest, "proto");
        out.x_forwarded_host = out.x_forwarded_host || beast::iequals(rest, "host");
    }
    return out;
}

/// Sets `name` to `value`: a plain insert when the request had no such line (the common case
/// saves the erase's lookup).
template <class Name>
void put(fields& f, Name name, bool present, std::string_view value) {
    if (present) {
        f.set(name, value);
    } else {
        f.insert(name, value);
    }
}

} // namespace

void add_forwarded(fields& f, std::string_view client_ip, std::string_view proto,
                   std::span<const config::cidr> trusted) {
    // A peer in trusted_proxies is a proxy in front of this one: its chain is extended. Anyone
    // else could write any chain, so theirs is dropped and this hop starts a new one.
    const bool extend = config::address_in(client_ip, trusted);
    const auto seen = find_forwarding_lines(f);
    // Fields are nodes of their own: inserting or erasing other fields leaves Host's value
    // where it is.
    const std::string_view host = f[bhttp::field::host];

    std::string value;
    value.reserve(64 + client_ip.size() + host.size());
    if (extend && seen.x_forwarded_for) {
        value = joined_lines(f, "X-Forwarded-For");
    }
    value += value.empty() ? "" : ", ";
    value += client_ip;
    put(f, "X-Forwarded-For", seen.x_forwarded_for, value);

    if (!extend || !seen.x_forwarded_proto) {
        put(f, "X-Forwarded-Proto", seen.x_forwarded_proto, proto);
    }
    if (!extend || !seen.x_forwarded_host) {
        if (seen.x_forwarded_host) {
            f.erase("X-Forwarded-Host");
        }
        if (!host.empty()) {
            f.insert("X-Forwarded-Host", host);
        }
    }

    value.clear();
    if (extend && seen.forwarded) {
        value = joined_lines(f, "Forwarded");
    }
    value += value.empty() ? "for=" : ", for=";
    append_forwarded_node(value, client_ip);
    if (!host.empty()) {
        value += ";host=";
        append_forwarded_value(value, host);
    }
    value += ";proto=";
    append_forwarded_value(value, proto);
    put(f, bhttp::field::forwarded, seen.forwarded, value);
}

std::size_t count_lines(const fields& f, std::string_view name) {
    std::size_t n = 0;
    for (const auto& field : f) {
        if (beast::iequals(field.name_string(), name)) {
            ++n;
        }
    }
    return n;
}

namespace {

/// The lines of the fields framing and routing depend on, counted in one pass over the
/// field list: Beast resolves every known name to its enum once, at parse time, so a switch
/// per field replaces a case-insensitive name comparison per field and per name.
struct framing_lines {
    std::size_t content_length = 0;
    std::size_t transfer_encoding = 0;
    std::size_t host = 0;
};

framing_lines count_framing_lines(const fields& f) {
    framing_lines n;
    for (const auto& field : f) {
        switch (field.name()) {
        case bhttp::field::content_length:
            ++n.content_length;
            break;
        case bhttp::field::transfer_encoding:
            ++n.transfer_encoding;
            break;
        case bhttp::field::host:
            ++n.host;
            break;
        default:
            break;
        }
    }
    return n;
}

framing_error check_framing(const fields& f, const framing_lines& n) {
    if (n.content_length > 0 && n.transfer_encoding > 0) {
        return framing_error::content_length_and_transfer_encoding;
    }
    if (n.content_length > 1) {
        return framing_error::repeated_content_length;
    }
    if (n.content_length == 1) {
        const auto v = trim(f[bhttp::field::content_length]);
        if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) {
            return framing_error::repeated_content_length; // a list "5, 5" or garbage
        }
    }
    if (n.transfer_encoding > 1) {
        return framing_error::bad_transfer_encoding;
    }
    if (n.transfer_encoding == 1 &&
        !beast::iequals(trim(f[bhttp::field::transfer_encoding]), "chunked")) {
        return framing_error::bad_transfer_encoding;
    }
    return framing_error::none;
}

} // namespace

framing_error check_framing(const fields& f) {
    return check_framing(f, count_framing_lines(f));
}

} // namespace onceproxy::http

namespace onceproxy::http {

namespace {

/// RFC 3986 host [":" port] characters: reg-name / IPv4 / IP-literal, and the port's digits.
constexpr auto host_char_table = alnum_and("-._~%!$&'()*+,;=:[]");

bool valid_host_value(std::string_view v) {
    return std::all_of(v.begin(), v.end(),
                       [](char c) { return host_char_table[static_cast<unsigned char>(c)]; });
}

} // namespace

std::string_view refuse_request_head(const request_head& h) {
    const auto lines = count_framing_lines(h);
    switch (check_framing(h, lines)) {
    case framing_error::none:
        break;
    case framing_error::content_length_and_transfer_encoding:
    case framing_error::repeated_content_length:
    case framing_error::bad_transfer_encoding:
        return "ambiguous message framing (Content-Length / Transfer-Encoding)";
    }
    const bool has_te = lines.transfer_encoding > 0;
    if (h.version() < 11 && has_te) {
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
        return "Transfer-Encoding is not allowed in an HTTP/1.0 request";
    }
    // RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, for more than one Host line,
    // and for an invalid Host value. HTTP/1.0 clients may omit it.
    if (lines.host > 1) {
        return "more than one Host header";
    }
    if (lines.host == 0 && h.version() >= 11) {
        return "an HTTP/1.1 request needs a Host header";
    }
    if (lines.host == 1 && !valid_host_value(h[bhttp::field::host])) {
        return "invalid Host header value";
    }
    if (h.method() == bhttp::verb::trace) {
        const auto cl = trim(h[bhttp::field::content_length]);
        if (has_te || (!cl.empty() && cl != "0")) {
            // RFC 9110 §9.3.8: a TRACE request carries no content.
            return "a TRACE request must not have a body";
        }
    }
    return {};
}

} // namespace onceproxy::http
