#include "onceproxy/http/raw_response_head.hpp"

#include "onceproxy/http/headers.hpp"
#include "onceproxy/wire/head_writer.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;
namespace beast = boost::beast;

namespace {

/// True when a Connection line of `raw` names `name` (RFC 9110 §7.6.1: it is hop-by-hop then).
bool named_by_connection(const wire::raw_header_store& raw, std::string_view name) {
    for (std::size_t i = 0; i < raw.size(); ++i) {
        const auto line = raw[i];
        if (line.name != bhttp::field::connection) {
            continue;
        }
        for (const auto token : bhttp::token_list{line.value}) {
            if (beast::iequals(token, name)) {
                return true;
            }
        }
    }
    return false;
}

/// Appends the end-to-end lines of `raw`: the whole block in one copy when no field is
/// hop-by-hop (most answers), otherwise line by line without them.
void append_end_to_end(const wire::raw_header_store& raw, std::string& out) {
    bool any_hop_by_hop = false;
    for (std::size_t i = 0; i < raw.size() && !any_hop_by_hop; ++i) {
        const auto line = raw[i];
        any_hop_by_hop = is_hop_by_hop(line.name, line.name_string);
    }
    if (!any_hop_by_hop) {
        out += raw.lines();
        return;
    }
    for (std::size_t i = 0; i < raw.size(); ++i) {
        const auto line = raw[i];
        if (!is_hop_by_hop(line.name, line.name_string) &&
            !named_by_connection(raw, line.name_string)) {
            out += line.line;
        }
    }
}

} // namespace

void serialize_raw_response_head(unsigned version, unsigned code, const wire::raw_header_store& raw,
                                 std::span<const added_field> added, std::string& out) {
    std::size_t size = 64 + raw.reason().size() + raw.lines().size();
    for (const auto& f : added) {
        size += f.name.size() + f.value.size() + 4;
    }
    out.clear();
    out.reserve(size);
    wire::append_status_line(version, code, raw.reason(), out);
    append_end_to_end(raw, out);
    for (const auto& f : added) {
        out.append(f.name).append(": ").append(f.value).append("\r\n");
    }
    out += "\r\n";
}

std::string transfer_codings(const wire::raw_header_store& raw) {
    std::string out;
    for (std::size_t i = 0; i < raw.size(); ++i) {
        const auto line = raw[i];
        if (line.name != bhttp::field::transfer_encoding) {
            continue;
        }
        for (const auto coding : bhttp::token_list{line.value}) {
            if (!beast::iequals(coding, "chunked")) {
                out.append(out.empty() ? "" : ", ").append(coding);
            }
        }
    }
    return out;
}

} // namespace onceproxy::http
