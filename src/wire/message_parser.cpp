#include "onceproxy/wire/message_parser.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include <algorithm>
#include <limits>
#include <new>

namespace onceproxy::wire {

namespace bhttp = boost::beast::http;

namespace {

/// What Beast's `fields` can store without throwing (16-bit offsets, name and value each plus
/// their separators).
constexpr std::size_t max_field_part = std::numeric_limits<std::uint16_t>::max() - 2;

/// The body buffer reserved up front for a Content-Length: capped, so a peer announcing a large
/// body it never sends costs no memory (the body still grows to its limit as bytes arrive).
constexpr std::size_t max_reserve = 1024 * 1024;

} // namespace

namespace {

/// The first member of a Content-Length value Beast has accepted ("002, 2" -> "2"): its digits
/// without leading zeros.
std::string_view canonical_length(std::string_view v) {
    v = v.substr(0, v.find(','));
    const auto first = v.find_first_of("0123456789");
    v = first == std::string_view::npos ? std::string_view("0") : v.substr(first);
    v = v.substr(0, v.find_first_not_of("0123456789"));
    const auto nonzero = v.find_first_not_of('0');
    return nonzero == std::string_view::npos ? v.substr(v.size() - 1) : v.substr(nonzero);
}

} // namespace

template <bool isRequest>
void message_parser<isRequest>::on_request_impl(bhttp::verb method, string_view method_str,
                                                string_view target, int version, error_code& ec) {
    if constexpr (isRequest) {
        if (target.size() > max_field_part || method_str.size() > max_field_part) {
            ec = bhttp::error::header_limit;
            return;
        }
        m_.target(target);
        if (method != bhttp::verb::unknown) {
            m_.method(method);
        } else {
            m_.method_string(method_str);
        }
        m_.version(static_cast<unsigned>(version));
    } else {
        (void)method;
        (void)method_str;
        (void)target;
        (void)version;
        (void)ec;
    }
}

template <bool isRequest>
void message_parser<isRequest>::on_response_impl(int code, string_view reason, int version,
                                                 error_code& ec) {
    if constexpr (!isRequest) {
        if (reason.size() > max_field_part) {
            ec = bhttp::error::header_limit;
            return;
        }
        m_.result(static_cast<unsigned>(code));
        if (raw_ != nullptr) {
            raw_->reason(reason); // no allocation for a short phrase, unlike `fields`
        } else {
            m_.reason(reason);
        }
        m_.version(static_cast<unsigned>(version));
    } else {
        (void)code;
        (void)reason;
        (void)version;
        (void)ec;
    }
}

template <bool isRequest>
void message_parser<isRequest>::on_field_impl(bhttp::field name, string_view name_string,
                                              string_view value, error_code& ec) {
    if (name_string.size() > max_field_part || value.size() > max_field_part) {
        ec = bhttp::error::header_limit; // `fields` would throw; refuse instead
        return;
    }
    if (!header_done_) {
        if constexpr (!isRequest) {
            if (name == bhttp::field::content_length) {
                // Beast has checked every member of the list, and every earlier line, against
                // the first value: one line with that value stands for them all.
                if (length_seen_) {
                    return;
                }
                length_seen_ = true;
                value = canonical_length(value);
            } else if (name == bhttp::field::transfer_encoding && refuse_codings_) {
                for (const auto coding : bhttp::token_list{value}) {
                    if (!boost::beast::iequals(coding, "chunked")) {
                        ec = bhttp::error::bad_transfer_encoding;
                        return;
                    }
                }
            }
        }
        if (raw_ != nullptr) {
            raw_->append(name, name_string, value);
        } else {
            m_.insert(name, name_string, value);
        }
        return;
    }
    // A trailer field: kept apart from the header, within its own budget.
    trailer_bytes_ += name_string.size() + value.size() + 4;
    if (trailer_bytes_ > trailer_limit_) {
        ec = bhttp::error::header_limit;
        return;
    }
    trailers_.insert(name, name_string, value);
}

template <bool isRequest>
void message_parser<isRequest>::on_header_impl(error_code& ec) {
    ec = {};
    header_done_ = true;
}

template <bool isRequest>
void message_parser<isRequest>::on_body_init_impl(
    const boost::optional<std::uint64_t>& content_length, error_code& ec) {
    ec = {};
    auto& body = m_.body();
    body.clear();
    if (stream_capacity_ > 0) {
        // Only what this body needs: reserving the whole staging capacity for a small answer
        // cost a 64 KiB allocation (and glibc's consolidation of freed chunks) per message.
        // A body of unknown length grows by appends, up to the capacity.
        // A large capacity (a guarded answer held up to max_record_bytes) is not reserved
        // whole either: a peer announcing a body it never sends costs no memory.
        body.reserve(content_length ? static_cast<std::size_t>(std::min<std::uint64_t>(
                                          *content_length, std::min(stream_capacity_, max_reserve)))
                                    : 0);
    } else if (content_length) {
        try {
            body.reserve(
                static_cast<std::size_t>(std::min<std::uint64_t>(*content_length, max_reserve)));
        } catch (const std::bad_alloc&) {
            ec = bhttp::error::bad_alloc;
        }
    }
}

template <bool isRequest>
std::size_t message_parser<isRequest>::on_body_impl(string_view data, error_code& ec) {
    if (stream_capacity_ > 0) {
        auto& body = m_.body();
        const auto n = std::min(data.size(), stream_capacity_ - body.size());
        if (n == 0 && !data.empty()) {
            ec = bhttp::error::need_buffer; // the staging buffer is full: the caller drains it
            return 0;
        }
        body.append(data.data(), n);
        return n;
    }
    try {
        m_.body().append(data.data(), data.size());
    } catch (const std::bad_alloc&) {
        ec = bhttp::error::bad_alloc;
        return 0;
    }
    return data.size();
}

namespace {

/// True when `ext` holds a control character other than HTAB. Beast's extension grammar lets a
/// bare LF (or CR) through inside a quoted-string; a hop that ends the line there reads the rest
/// of the chunk line as body, so the two would frame the body differently (RFC 9112 §7.1.1
/// allows no CTL in chunk-ext).
bool has_control(std::string_view ext) {
    return std::any_of(ext.begin(), ext.end(), [](char ch) {
        const auto c = static_cast<unsigned char>(ch);
        return (c < 0x20 && c != '\t') || c == 0x7f;
    });
}

/// True when the trailer section that follows the last chunk's line holds an obsolete line fold
/// (a line starting with SP or HTAB, RFC 9112 §5.2). `line_end` points at the LF that ends the
/// "0[;ext]" line. Beast calls on_chunk_header_impl for the last chunk only once the whole
/// trailer section, up to its empty line, is in the contiguous buffer it parses; the scan stops
/// at that empty line (the first LF followed by CR).
bool trailer_has_obs_fold(const char* line_end) {
    for (const char* lf = line_end;; ++lf) {
        if (*lf != '\n') {
            continue;
        }
        const char next = lf[1];
        if (next == '\r') {
            return false;
        }
        if (next == ' ' || next == '\t') {
            return true;
        }
    }
}

} // namespace

template <bool isRequest>
void message_parser<isRequest>::on_chunk_header_impl(std::uint64_t size, string_view extensions,
                                                     error_code& ec) {
    // Extensions have no meaning to the proxy and are not forwarded (the body is re-framed);
    // a bound keeps a peer from making every chunk line arbitrarily long.
    if (extensions.size() > max_chunk_extension || has_control(extensions)) {
        ec = bhttp::error::bad_chunk_extension;
        return;
    }
    if constexpr (isRequest) {
        // Beast joins a folded trailer line to the previous field; another hop may not, so a
        // request with one is refused, as one with a folded header line is (message_reader).
        if (size == 0 && trailer_has_obs_fold(extensions.data() + extensions.size() + 1)) {
            ec = bhttp::error::bad_value;
        }
    } else {
        (void)size;
    }
}

template <bool isRequest>
std::size_t message_parser<isRequest>::on_chunk_body_impl(std::uint64_t, string_view data,
                                                          error_code& ec) {
    return on_body_impl(data, ec);
}

template <bool isRequest>
void message_parser<isRequest>::on_finish_impl(error_code& ec) {
    ec = {};
}

template class message_parser<true>;
template class message_parser<false>;

} // namespace onceproxy::wire
