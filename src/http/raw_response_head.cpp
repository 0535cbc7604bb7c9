#include "onceproxy/http/raw_response_head.hpp"

#include "onceproxy/http/headers.hpp"
#include "onceproxy/wire/head_writer.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>

namespace onceproxy::http {

namespace bhttp = boost::beast::http;
namespace beast = boost::beast;

bool named_by_connection(const wire::raw_header_store& raw, std::string_view name) noexcept {
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

namespace {

/// True when a field of `raw` is hop-by-hop (is_hop_by_hop). Most answers carry none.
bool has_hop_by_hop(const wire::raw_header_store& raw) noexcept {
    for (std::size_t i = 0; i < raw.size(); ++i) {
        const auto line = raw[i];
        if (is_hop_by_hop(line.name, line.name_string)) {
            return true;
        }
    }
    return false;
}

/// Appends the end-to-end lines of `raw`: the whole block in one copy when no field is
/// hop-by-hop (most answers), otherwise line by line without them.
void append_end_to_end(const wire::raw_header_store& raw, std::string& out) {
    if (!has_hop_by_hop(raw)) {
        out += raw.lines();
        return;
    }
    for_each_end_to_end(raw, [&out](const auto& line) { out += line.line; });
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
