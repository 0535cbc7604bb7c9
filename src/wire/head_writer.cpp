#include "onceproxy/wire/head_writer.hpp"

#include <boost/beast/http/status.hpp>

#include <cstring>
#include <string_view>

namespace onceproxy::wire {

namespace bhttp = boost::beast::http;

namespace {

void append_version(unsigned version, std::string& out) {
    out += "HTTP/";
    out += static_cast<char>('0' + version / 10);
    out += '.';
    out += static_cast<char>('0' + version % 10);
}

/// Sized first, then copied: one resize instead of four appends (each a capacity check and a
/// call) per field.
void append_fields(const bhttp::fields& f, std::string& out) {
    std::size_t n = 2;
    for (const auto& field : f) {
        n += field.name_string().size() + field.value().size() + 4;
    }
    const auto at = out.size();
    out.resize(at + n);
    char* p = out.data() + at;
    const auto put = [&p](std::string_view s) {
        std::memcpy(p, s.data(), s.size());
        p += s.size();
    };
    for (const auto& field : f) {
        put(field.name_string());
        put(": ");
        put(field.value());
        put("\r\n");
    }
    put("\r\n");
}

} // namespace

void serialize_head(const bhttp::request<bhttp::string_body>& m, std::string& out) {
    out.clear();
    out.reserve(512);
    out += m.method_string();
    out += ' ';
    out += m.target();
    out += ' ';
    append_version(m.version(), out);
    out += "\r\n";
    append_fields(m.base(), out);
}

void append_status_line(unsigned version, unsigned code, std::string_view reason,
                        std::string& out) {
    append_version(version, out);
    out += ' ';
    out += static_cast<char>('0' + code / 100);
    out += static_cast<char>('0' + code / 10 % 10);
    out += static_cast<char>('0' + code % 10);
    out += ' ';
    if (reason.empty()) {
        out += bhttp::obsolete_reason(static_cast<bhttp::status>(code));
    } else {
        out += reason;
    }
    out += "\r\n";
}

void serialize_head(const bhttp::response<bhttp::string_body>& m, std::string& out) {
    out.clear();
    out.reserve(512);
    append_status_line(m.version(), m.result_int(), m.reason(), out);
    append_fields(m.base(), out);
}

} // namespace onceproxy::wire
