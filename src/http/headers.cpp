#include "onceproxy/http/headers.hpp"

#include "onceproxy/config/cidr.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include <algorithm>
#include <cctype>
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

namespace {

/// True when `f` holds a field strip_hop_by_hop removes or acts on. Most requests and answers
/// carry none: one pass over the fields then replaces a lookup per hop-by-hop name.
bool has_hop_by_hop(const fields& f) {
    for (const auto& field : f) {
        switch (field.name()) {
        case bhttp::field::connection:
        case bhttp::field::keep_alive:
        case bhttp::field::te:
        case bhttp::field::trailer:
        case bhttp::field::transfer_encoding:
        case bhttp::field::upgrade:
            return true;
        default:
            if (starts_with_icase(field.name_string(), "proxy-")) {
                return true;
            }
        }
    }
    return false;
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

bool is_token(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
               std::string_view{"!#$%&'*+-.^_`|~"}.find(c) != std::string_view::npos;
    });
}

/// A Forwarded parameter value (RFC 7239 §4): a token as is, anything else a quoted-string.
std::string forwarded_value(std::string_view v) {
    if (is_token(v)) {
        return std::string{v};
    }
    std::string out = "\"";
    for (const char c : v) {
        if (c == '"' || c == '\\') {
            out += '\\';
        }
        out += c;
    }
    out += '"';
    return out;
}

/// The for= node of an address (RFC 7239 §6): IPv6 in brackets, which makes it quoted.
std::string forwarded_node(std::string_view ip) {
    if (ip.find(':') != std::string_view::npos) {
        return forwarded_value("[" + std::string{ip} + "]");
    }
    return forwarded_value(ip);
}

} // namespace

void add_forwarded(fields& f, std::string_view client_ip, std::string_view proto,
                   std::span<const config::cidr> trusted) {
    // A peer in trusted_proxies is a proxy in front of this one: its chain is extended. Anyone
    // else could write any chain, so theirs is dropped and this hop starts a new one.
    const bool extend = config::address_in(client_ip, trusted);
    const std::string host(f[bhttp::field::host]);

    std::string xff = extend ? joined_lines(f, "X-Forwarded-For") : std::string{};
    xff += xff.empty() ? "" : ", ";
    xff += client_ip;
    f.set("X-Forwarded-For", xff);

    if (!extend || f.find("X-Forwarded-Proto") == f.end()) {
        f.set("X-Forwarded-Proto", proto);
    }
    if (!extend || f.find("X-Forwarded-Host") == f.end()) {
        f.erase("X-Forwarded-Host");
        if (!host.empty()) {
            f.set("X-Forwarded-Host", host);
        }
    }

    std::string element = "for=" + forwarded_node(client_ip);
    if (!host.empty()) {
        element += ";host=" + forwarded_value(host);
    }
    element += ";proto=" + forwarded_value(proto);
    std::string fwd = extend ? joined_lines(f, "Forwarded") : std::string{};
    fwd += fwd.empty() ? "" : ", ";
    fwd += element;
    f.set(bhttp::field::forwarded, fwd);
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

framing_error check_framing(const fields& f) {
    const auto cl = count_lines(f, "content-length");
    const auto te = count_lines(f, "transfer-encoding");
    if (cl > 0 && te > 0) {
        return framing_error::content_length_and_transfer_encoding;
    }
    if (cl > 1) {
        return framing_error::repeated_content_length;
    }
    if (cl == 1) {
        const auto v = trim(f[bhttp::field::content_length]);
        if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) {
            return framing_error::repeated_content_length; // a list "5, 5" or garbage
        }
    }
    if (te > 1) {
        return framing_error::bad_transfer_encoding;
    }
    if (te == 1 && !beast::iequals(trim(f[bhttp::field::transfer_encoding]), "chunked")) {
        return framing_error::bad_transfer_encoding;
    }
    return framing_error::none;
}

} // namespace onceproxy::http

namespace onceproxy::http {

namespace {

/// RFC 3986 host [":" port] characters: reg-name / IPv4 / IP-literal, and the port's digits.
bool valid_host_value(std::string_view v) {
    for (const char c : v) {
        const auto u = static_cast<unsigned char>(c);
        const bool ok = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') ||
                        (u >= '0' && u <= '9') ||
                        std::string_view("-._~%!$&'()*+,;=:[]").find(c) != std::string_view::npos;
        if (!ok) {
            return false;
        }
    }
    return true;
}

} // namespace

std::string_view refuse_request_head(const request_head& h) {
    switch (check_framing(h)) {
    case framing_error::none:
        break;
    case framing_error::content_length_and_transfer_encoding:
    case framing_error::repeated_content_length:
    case framing_error::bad_transfer_encoding:
        return "ambiguous message framing (Content-Length / Transfer-Encoding)";
    }
    const bool has_te = h.find(bhttp::field::transfer_encoding) != h.end();
    if (h.version() < 11 && has_te) {
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
        return "Transfer-Encoding is not allowed in an HTTP/1.0 request";
    }
    // RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, for more than one Host line,
    // and for an invalid Host value. HTTP/1.0 clients may omit it.
    const auto hosts = count_lines(h, "host");
    if (hosts > 1) {
        return "more than one Host header";
    }
    if (hosts == 0 && h.version() >= 11) {
        return "an HTTP/1.1 request needs a Host header";
    }
    if (hosts == 1 && !valid_host_value(h[bhttp::field::host])) {
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
