#pragma once
// HTTP/1.1 start line and header block, serialised into one contiguous buffer. Writing that
// buffer and the body as two buffers is markedly cheaper than walking Beast's serializer, whose
// buffer sequence has several entries per header field (measured on the proxy's hot path).

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <string>
#include <string_view>

namespace onceproxy::wire {

/// "METHOD target HTTP/1.x\r\n" + fields + "\r\n". Framing (Content-Length) is the caller's.
void serialize_head(const boost::beast::http::request<boost::beast::http::string_body>& m,
                    std::string& out);

/// Appends "HTTP/1.x code reason\r\n" to `out`: `version` as Beast counts it (11 for 1.1), a
/// three-digit `code`, and `reason`, or the code's standard phrase when it is empty.
void append_status_line(unsigned version, unsigned code, std::string_view reason, std::string& out);

/// "HTTP/1.x code reason\r\n" + fields + "\r\n".
void serialize_head(const boost::beast::http::response<boost::beast::http::string_body>& m,
                    std::string& out);

} // namespace onceproxy::wire
