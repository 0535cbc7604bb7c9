#pragma once
// The HTTP/1.1 message parser of both sides of the proxy (client requests, upstream responses,
// admin requests): Beast's basic_parser with onceproxy's own storage.
//
// Beast's stock `http::parser` merges trailer fields into the header (RFC 9110 §6.5.1 forbids
// that: a client could add a Host, an Authorization or an Idempotency-Key after the fact) and
// stores every field in Beast's `fields`, whose 16-bit offsets make an insert *throw* for a
// value of 65,534 bytes or more; thrown inside a composed read, that ends the worker thread.
// This parser
//  - keeps trailers apart (`trailers()`), bounded by `trailer_limit` bytes in all,
//  - refuses a field that `fields` cannot hold with an error instead of throwing,
//  - bounds chunk extensions (`chunk_extension_limit` bytes per chunk; they are never stored)
//    and refuses a control character in them,
//  - refuses an obsolete line fold in a request's trailer section,
//  - stores a response's Content-Length once, as plain digits: Beast accepts `2, 2` and repeated
//    equal lines, which a proxy must not pass on as they are (RFC 9110 §8.6).
// Pair it with a read buffer bounded by `read_buffer_limit(header_limit)`: Beast needs a whole
// header, chunk-size line or trailer section in the buffer, so a bounded buffer turns anything
// longer into `http::error::buffer_overflow` rather than unbounded memory.

#include "onceproxy/wire/raw_header_store.hpp"

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cstddef>
#include <cstdint>

namespace onceproxy::wire {

/// Largest header section either side accepts: below 64 KiB so no single field can reach the
/// 65,534-byte value Beast's `fields` cannot store (`limits.max_header_bytes` is capped at it:
/// http/server.cpp checks that config's cap and this one agree).
inline constexpr std::size_t max_header_section = 60 * 1024;

/// Bytes of one chunk's extensions (`;name=value...`) accepted; they are parsed and dropped.
inline constexpr std::size_t max_chunk_extension = 4 * 1024;

/// Read-buffer bound for a parser with header limit `header_limit`: room for the whole header
/// (or chunk line, or trailer section) plus a partial next read.
constexpr std::size_t read_buffer_limit(std::size_t header_limit) noexcept {
    return header_limit + 4 * 1024;
}

/// Parses one request (isRequest = true) or response (false) with a string body.
template <bool isRequest>
class message_parser : public boost::beast::http::basic_parser<isRequest> {
public:
    using message_type = boost::beast::http::message<isRequest, boost::beast::http::string_body>;

    message_parser() = default;

    /// Bytes of trailer fields (names + values) accepted in all; above it the read fails with
    /// `http::error::header_limit`. Set it with the header limit (same budget, RFC 9110 §6.5).
    void trailer_limit(std::size_t n) noexcept { trailer_limit_ = n; }

    /// Streaming: the body is not kept whole; `get().body()` is a staging buffer of at most
    /// `capacity` bytes that the caller drains (and clears) between reads. When it is full the
    /// read stops with `http::error::need_buffer`, which is not an error: drain, then read on.
    void stream_body(std::size_t capacity) noexcept { stream_capacity_ = capacity; }

    /// A response whose Transfer-Encoding names a coding other than `chunked` (`gzip, chunked`)
    /// fails with `http::error::bad_transfer_encoding`: for a reader that re-frames the body and
    /// could not pass the coding on (a recorded answer has no Transfer-Encoding).
    void refuse_transfer_codings() noexcept { refuse_codings_ = true; }

    /// Header fields go to `store` (cleared here) instead of the message: for a head that is
    /// passed on as received and never looked up, which saves `fields`' allocation and tree
    /// insert per field. A response's reason phrase goes there too; `get()` keeps the status
    /// code, the version and the body. Every limit applies as before, and trailer fields still
    /// go to `trailers()`. `store` must outlive the parse; set this before the first read.
    void keep_raw_fields(raw_header_store* store) noexcept {
        raw_ = store;
        if (raw_ != nullptr) {
            raw_->clear();
        }
    }

    /// The message read so far (the header, then the body). Trailer fields are not in it.
    message_type& get() noexcept { return m_; }
    const message_type& get() const noexcept { return m_; }
    message_type release() noexcept { return std::move(m_); }

    /// Trailer fields of a chunked message, apart from the header (RFC 9110 §6.5.1).
    const boost::beast::http::fields& trailers() const noexcept { return trailers_; }

    /// True when the message ended with at least one trailer field.
    bool has_trailers() const noexcept { return trailers_.begin() != trailers_.end(); }

private:
    using error_code = boost::system::error_code;
    using string_view = boost::beast::string_view;

    void on_request_impl(boost::beast::http::verb method, string_view method_str,
                         string_view target, int version, error_code& ec) override;
    void on_response_impl(int code, string_view reason, int version, error_code& ec) override;
    void on_field_impl(boost::beast::http::field name, string_view name_string, string_view value,
                       error_code& ec) override;
    void on_header_impl(error_code& ec) override;
    void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                           error_code& ec) override;
    std::size_t on_body_impl(string_view body, error_code& ec) override;
    void on_chunk_header_impl(std::uint64_t size, string_view extensions, error_code& ec) override;
    std::size_t on_chunk_body_impl(std::uint64_t remain, string_view body, error_code& ec) override;
    void on_finish_impl(error_code& ec) override;

    message_type m_;
    boost::beast::http::fields trailers_;
    raw_header_store* raw_ = nullptr; ///< keep_raw_fields: the header fields go there
    bool header_done_ = false;
    std::size_t trailer_limit_ = 16 * 1024;
    std::size_t trailer_bytes_ = 0;
    std::size_t stream_capacity_ = 0; ///< 0: the body is kept whole
    bool refuse_codings_ = false;     ///< refuse_transfer_codings()
    bool length_seen_ = false;        ///< a response's Content-Length line was stored
};

using request_parser = message_parser<true>;
using response_parser = message_parser<false>;

extern template class message_parser<true>;
extern template class message_parser<false>;

} // namespace onceproxy::wire
