#pragma once
// An answer head passed on from the fields the upstream sent (wire::raw_header_store), without
// a Beast `fields` in between: the hop-by-hop fields are left out in the copy itself, with the
// rules of strip_hop_by_hop, and the proxy's own fields go after the rest.

#include "onceproxy/http/headers.hpp"
#include "onceproxy/wire/raw_header_store.hpp"

#include <span>
#include <string>
#include <string_view>

namespace onceproxy::http {

/// A field the proxy adds to a head it passes on.
struct added_field {
    std::string_view name;
    std::string_view value;
};

/// True when a Connection line of `raw` names `name` (RFC 9110 §7.6.1: it is hop-by-hop then).
bool named_by_connection(const wire::raw_header_store& raw, std::string_view name) noexcept;

/// Calls `f(line)` for each field of `raw` that strip_hop_by_hop (with nothing kept) would
/// leave, in the order received: the fields a proxy passes on or records.
template <class F>
void for_each_end_to_end(const wire::raw_header_store& raw, F&& f) {
    const bool nominates = raw.contains(boost::beast::http::field::connection);
    for (std::size_t i = 0; i < raw.size(); ++i) {
        const auto line = raw[i];
        if (!is_hop_by_hop(line.name, line.name_string) &&
            !(nominates && named_by_connection(raw, line.name_string))) {
            f(line);
        }
    }
}

/// Writes into `out` (replacing what it held) the head a client gets for an answer whose
/// fields are in `raw`: "HTTP/1.x code reason\r\n" (`version` as Beast counts it, 11 for 1.1;
/// the reason as received, or the code's standard phrase when none came), every field of `raw`
/// in the order received except Connection, the fields Connection names, Keep-Alive, TE,
/// Trailer, Transfer-Encoding, Upgrade and Proxy-* (RFC 9110 §7.6.1, as strip_hop_by_hop with
/// nothing kept), then `added` in order, then the empty line.
///
/// For the same answer the bytes are those of strip_hop_by_hop, `fields::set` of each added
/// field and wire::serialize_head, but for one thing: Beast's `fields` moves a repeated field
/// next to its first line, while here every line keeps its place.
void serialize_raw_response_head(unsigned version, unsigned code, const wire::raw_header_store& raw,
                                 std::span<const added_field> added, std::string& out);

/// The transfer codings of the answer in `raw` other than `chunked`, in order, joined with ", "
/// (`Transfer-Encoding: gzip, chunked` gives "gzip"); empty when there are none. A proxy that
/// re-chunks the body must pass them on ahead of its own `chunked` (RFC 9112 §6.1).
std::string transfer_codings(const wire::raw_header_store& raw);

} // namespace onceproxy::http
