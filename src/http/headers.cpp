#include "onceproxy/http/headers.hpp"

#include "onceproxy/config/cidr.hpp"
#include "onceproxy/text/ows.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/verb.hpp>

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

} // namespace

bool is_hop_by_hop(bhttp::field name, std::string_view name_string) noexcept {
    switch (name) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::te:
    case bhttp::field::trailer:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
    case bhttp::field::proxy_authenticate:
    case bhttp::field::proxy_authentication_info:
    case bhttp::field::proxy_authorization:
    case bhttp::field::proxy_connection:
    case bhttp::field::proxy_features:
    case bhttp::field::proxy_instruction:
        return true;
    case bhttp::field::unknown:
        return starts_with_icase(name_string, "proxy-");
    default:
        return false; // a name Beast knows, none of the above: not Proxy-*
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

/// `a` and `b` are equal ignoring case, with '_' in `a` read as '-'.
bool iequals_dashed(std::string_view a, std::string_view b) {
    const auto fold = [](char c) {
        return c == '_' ? '-' : c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    };
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                              [&](char x, char y) { return fold(x) == fold(y); });
}

/// Forwarding fields that the proxy does not set but an app may read as the client's address,
/// port or path prefix. A client that is not a trusted proxy could forge them.
constexpr std::array<std::string_view, 3> other_forwarding_names{"X-Real-IP", "X-Forwarded-Port",
                                                                 "X-Forwarded-Prefix"};

/// Every forwarding field name, as an app may read it (CGI, WSGI, Rack and PHP turn '-' and '_'
/// alike into '_', so `X_Forwarded_For` arrives as X-Forwarded-For).
constexpr std::array<std::string_view, 7> all_forwarding_names{
    "X-Forwarded-For",  "X-Forwarded-Proto",  "X-Forwarded-Host", "Forwarded",
    "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Real-IP"};

/// Removes the forwarding fields this hop does not rewrite: every underscore spelling of a
/// forwarding field (no proxy sends those), and, unless `extend`, X-Real-IP, X-Forwarded-Port
/// and X-Forwarded-Prefix.
void strip_other_forwarding(fields& f, bool extend) {
    for (auto it = f.begin(); it != f.end();) {
        const auto n = it->name_string();
        const bool underscore =
            it->name() == bhttp::field::unknown && n.find('_') != std::string_view::npos &&
            std::any_of(all_forwarding_names.begin(), all_forwarding_names.end(),
                        [&](std::string_view fw) { return iequals_dashed(n, fw); });
        const bool other =
            !extend && it->name() == bhttp::field::unknown && listed(n, other_forwarding_names);
        it = underscore || other ? f.erase(it) : std::next(it);
    }
}

/// True when a Forwarded list (RFC 7239 §4) ends outside a quoted-string and holds no control
/// character: an unbalanced quote would swallow the element this hop appends.
bool forwarded_list_closed(std::string_view v) {
    bool quoted = false;
    for (std::size_t i = 0; i < v.size(); ++i) {
        const auto c = static_cast<unsigned char>(v[i]);
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            return false;
        }
        if (quoted && c == '\\') {
            ++i; // quoted-pair
            if (i == v.size()) {
                return false;
            }
        } else if (c == '"') {
            quoted = !quoted;
        }
    }
    return !quoted;
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
    strip_other_forwarding(f, extend);
    // Fields are nodes of their own: inserting or erasing other fields leaves Host's value
    // where it is.
    const std::string_view host = first_value(f, bhttp::field::host);

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
        if (!forwarded_list_closed(value)) {
            value.clear(); // a broken chain is not extended: this hop starts a new one
        }
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

std::string_view first_value(const fields& f, bhttp::field name) noexcept {
    for (const auto& field : f) {
        if (field.name() == name) {
            return field.value();
        }
    }
    return {};
}

void ready_for_upstream(bhttp::request<bhttp::string_body>& req, std::string_view client_ip,
                        std::string_view proto, std::span<const config::cidr> trusted) {
    add_forwarded(req, client_ip, proto, trusted);
    req.version(11);
    req.keep_alive(true);
    req.prepare_payload();
}

bool changed_for_upstream(std::string_view name) noexcept {
    return beast::iequals(name, "Connection") || beast::iequals(name, "Content-Length") ||
           beast::iequals(name, "Transfer-Encoding") ||
           std::any_of(all_forwarding_names.begin(), all_forwarding_names.end(),
                       [&](std::string_view fw) { return iequals_dashed(name, fw); });
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
    /// The first line's value of each (what f[name] would look up).
    std::string_view content_length_value;
    std::string_view transfer_encoding_value;
    std::string_view host_value;
};

framing_lines count_framing_lines(const fields& f) {
    framing_lines n;
    const auto count = [](std::size_t& lines, std::string_view& first, std::string_view v) {
        if (lines++ == 0) {
            first = v;
        }
    };
    for (const auto& field : f) {
        switch (field.name()) {
        case bhttp::field::content_length:
            count(n.content_length, n.content_length_value, field.value());
            break;
        case bhttp::field::transfer_encoding:
            count(n.transfer_encoding, n.transfer_encoding_value, field.value());
            break;
        case bhttp::field::host:
            count(n.host, n.host_value, field.value());
            break;
        default:
            break;
        }
    }
    return n;
}

framing_error check_framing(const framing_lines& n) {
    if (n.content_length > 0 && n.transfer_encoding > 0) {
        return framing_error::content_length_and_transfer_encoding;
    }
    if (n.content_length > 1) {
        return framing_error::repeated_content_length;
    }
    if (n.content_length == 1) {
        const auto v = text::trim_ows(n.content_length_value);
        if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) {
            return framing_error::repeated_content_length; // a list "5, 5" or garbage
        }
    }
    if (n.transfer_encoding > 1) {
        return framing_error::bad_transfer_encoding;
    }
    if (n.transfer_encoding == 1 &&
        !beast::iequals(text::trim_ows(n.transfer_encoding_value), "chunked")) {
        return framing_error::bad_transfer_encoding;
    }
    return framing_error::none;
}

} // namespace

framing_error check_framing(const fields& f) {
    return check_framing(count_framing_lines(f));
}

} // namespace onceproxy::http

namespace onceproxy::http {

namespace {

/// The reg-name and IPv4 characters accepted in Host: RFC 3986 unreserved. Sub-delims and
/// pct-encoded are refused although RFC 3986 allows them: no DNS name uses them, and a ',' or a
/// ';' copied into X-Forwarded-Host or Forwarded would read as a list or a parameter.
constexpr auto reg_name_table = alnum_and("-._~");

/// An IP-literal's inside (RFC 3986 §3.2.2): an IPv6 address (hex digits, ':' and a dotted
/// IPv4 tail) or an IPvFuture ("v" HEXDIG "." 1*( unreserved / sub-delims / ":" )).
constexpr auto ip_literal_table = alnum_and(":.");

} // namespace

bool valid_host_value(std::string_view v) {
    // RFC 9110 §7.2: Host = uri-host [ ":" port ]; uri-host = IP-literal / IPv4address / reg-name.
    std::string_view host = v;
    std::string_view port;
    bool has_port = false;
    if (v.starts_with('[')) {
        const auto close = v.find(']');
        if (close == std::string_view::npos || close < 3) {
            return false;
        }
        host = v.substr(1, close - 1);
        if (host.find(':') == std::string_view::npos ||
            !std::all_of(host.begin(), host.end(),
                         [](char c) { return ip_literal_table[static_cast<unsigned char>(c)]; })) {
            return false;
        }
        const auto rest = v.substr(close + 1);
        if (!rest.empty() && rest.front() != ':') {
            return false;
        }
        has_port = !rest.empty();
        port = has_port ? rest.substr(1) : rest;
    } else {
        const auto colon = v.find(':');
        has_port = colon != std::string_view::npos;
        host = v.substr(0, colon);
        port = has_port ? v.substr(colon + 1) : std::string_view{};
        if (!std::all_of(host.begin(), host.end(),
                         [](char c) { return reg_name_table[static_cast<unsigned char>(c)]; })) {
            return false;
        }
        if (host.empty() && has_port) {
            return false; // ":80" names no host
        }
    }
    // port = *DIGIT; at most five of them (a TCP port).
    return !has_port ||
           (port.size() <= 5 && port.find_first_not_of("0123456789") == std::string_view::npos);
}

namespace {

/// True for `method` that Beast does not know as it is but does once upper-cased (`post`,
/// `Get`, `propfind`): a registered method spelled in another case.
bool is_standard_method_in_other_case(std::string_view method) {
    std::string upper(method);
    for (auto& c : upper) {
        c = c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
    }
    return upper != method && bhttp::string_to_verb(upper) != bhttp::verb::unknown;
}

} // namespace

std::string_view refuse_request_head(const request_head& h) {
    const auto lines = count_framing_lines(h);
    switch (check_framing(lines)) {
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
    if (lines.host == 1 && !valid_host_value(lines.host_value)) {
        return "invalid Host header value";
    }
    if (h.method() == bhttp::verb::unknown && is_standard_method_in_other_case(h.method_string())) {
        // RFC 9110 §9.1: the method token is case-sensitive, so `post` is not POST; an app that
        // upper-cases it would run as a POST what no POST route guarded.
        return "the method token differs from a standard method only in case";
    }
    if (h.method() == bhttp::verb::trace) {
        const auto cl = text::trim_ows(lines.content_length_value);
        if (has_te || (!cl.empty() && cl != "0")) {
            // RFC 9110 §9.3.8: a TRACE request carries no content.
            return "a TRACE request must not have a body";
        }
    }
    return {};
}

} // namespace onceproxy::http
