#pragma once
// An answer head passed on from the fields the upstream sent (wire::raw_header_store), without
// a Beast `fields` in between: the hop-by-hop fields are left out in the copy itself, with the
// rules of strip_hop_by_hop, and the proxy's own fields go after the rest.

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
