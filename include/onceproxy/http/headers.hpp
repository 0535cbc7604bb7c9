#pragma once
// Header rules of a proxy hop (RFC 9110 §7.6.1): hop-by-hop removal, X-Forwarded-*, framing
// checks against request smuggling. Pure functions on Beast field sets.

#include "onceproxy/config/config.hpp"

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <span>
#include <string_view>
#include <vector>

namespace onceproxy::http {

using fields = boost::beast::http::fields;

/// True for a field that is hop-by-hop in its own right (RFC 9110 §7.6.1): Connection,
/// Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade and every Proxy-* field. `name_string`
/// is looked at only for fields Beast does not know by name. The fields Connection names are
/// not in this set (they depend on the message).
bool is_hop_by_hop(boost::beast::http::field name, std::string_view name_string) noexcept;

/// Removes Connection and every header it names, Keep-Alive, TE, Trailer, Transfer-Encoding,
/// Upgrade and every Proxy-* header. Content-Length is left alone (the caller re-frames).
///
/// A name in `keep` (case-insensitive) is not removed because Connection names it: a client must
/// not be able to make the proxy drop a field it depends on (the idempotency key, the principal)
/// by nominating it. `keep` does not save a field that is hop-by-hop in its own right (Upgrade,
/// Proxy-*, ...). The strings `keep` views must outlive the call only.
void strip_hop_by_hop(fields& f, std::span<const std::string_view> keep = {});

/// The request fields the proxy itself depends on for a route with idempotency settings `idem`,
/// to pass to strip_hop_by_hop: Host, Content-Length, Content-Type, Authorization, Cookie, and
/// the route's key header, scope headers and fingerprint headers. The views point into `idem`.
std::vector<std::string_view> request_fields_in_use(const config::idempotency_config& idem);

/// Sets the forwarding headers of a request received from `client_ip` over `proto` ("http" or
/// "https"): X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host and RFC 7239 Forwarded.
/// When `client_ip` is in `trusted` (a proxy in front of this one), the incoming chain is kept:
/// the address is appended to X-Forwarded-For, an element to Forwarded, and the proxy's
/// X-Forwarded-Proto/-Host are kept (set from this hop when absent). Otherwise every incoming
/// forwarding header is replaced by this hop's values, so a client cannot forge an earlier hop.
/// X-Forwarded-Host and Forwarded's host= are the request's Host (left out when it has none).
/// X-Real-IP, X-Forwarded-Port and X-Forwarded-Prefix, which this hop does not set, are removed
/// unless the peer is trusted; an underscore spelling of any forwarding field (X_Forwarded_For)
/// is always removed; a trusted peer's Forwarded list with an unclosed quoted-string is replaced,
/// not extended (this hop's element would be read as part of the string).
void add_forwarded(fields& f, std::string_view client_ip, std::string_view proto,
                   std::span<const config::cidr> trusted = {});

/// The value of the first line of known field `name`, "" when there is none: what f[name] gives,
/// found by walking the field list and comparing Beast's field codes, which for a message's
/// handful of fields costs a fraction of Beast's lookup (case-insensitive name comparisons
/// down its tree).
[[nodiscard]] std::string_view first_value(const fields& f,
                                           boost::beast::http::field name) noexcept;

/// Readies a request received from `client_ip` over `proto` for the upstream: this hop's
/// forwarding fields (add_forwarded), then HTTP/1.1 with keep-alive (Connection), framed by its
/// body's length (Content-Length; no Transfer-Encoding).
void ready_for_upstream(boost::beast::http::request<boost::beast::http::string_body>& req,
                        std::string_view client_ip, std::string_view proto,
                        std::span<const config::cidr> trusted);

/// True when ready_for_upstream may set or remove field `name`: a forwarding field
/// (X-Forwarded-For, -Proto, -Host, -Port, -Prefix, Forwarded, X-Real-IP, in any case and with
/// '_' for '-'), Connection, Content-Length or Transfer-Encoding.
[[nodiscard]] bool changed_for_upstream(std::string_view name) noexcept;

/// Why a request's framing is refused (request smuggling shapes, RFC 9112 §6.3).
enum class framing_error {
    none,
    content_length_and_transfer_encoding, ///< both present
    repeated_content_length,              ///< more than one Content-Length line or list
    bad_transfer_encoding,                ///< anything but a single final `chunked`
};

/// Checks the framing headers of a request header block.
framing_error check_framing(const fields& f);

using request_head = boost::beast::http::request_header<fields>;

/// Why a request head must be refused with 400 before its body is read or anything is sent
/// upstream (empty: acceptable): ambiguous framing (check_framing), Transfer-Encoding on
/// HTTP/1.0, a missing (HTTP/1.1), repeated or invalid Host (valid_host_value), a standard
/// method token in another case (`post`), a TRACE with a body.
std::string_view refuse_request_head(const request_head& h);

/// True for a Host value that is RFC 9110 §7.2 uri-host [":" port] (empty is accepted, for a
/// target without authority): a reg-name of letters, digits and "-._~", an IPv4 address or a
/// bracketed IPv6 literal, and at most five port digits. `a,b`, `a:1:2` and `[::1` are not.
bool valid_host_value(std::string_view v);

/// Number of header lines named `name` (case-insensitive).
std::size_t count_lines(const fields& f, std::string_view name);

} // namespace onceproxy::http
