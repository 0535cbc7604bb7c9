#pragma once
// The header fields of one message kept as the wire had them, for a head that is passed on
// rather than looked up: each field costs an append to one string and one small record, where
// Beast's `fields` costs an allocation, a tree insert with case-insensitive compares and a free
// per field. Reused from message to message (clear keeps the capacity), so a connection that
// carries many answers allocates nothing for their heads once it has seen the largest.

#include <boost/beast/http/field.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::wire {

class raw_header_store {
public:
    /// One field as received: its name (case as sent), its value (OWS trimmed, as Beast's
    /// `fields` would keep it) and its serialised line "name: value\r\n".
    struct field_line {
        boost::beast::http::field name;
        std::string_view name_string;
        std::string_view value;
        std::string_view line;
    };

    /// Forgets every field and the reason phrase. The capacity is kept, unless one unusually
    /// large head grew it past what a connection should hold on to while it sits idle.
    void clear() noexcept;

    /// Adds a field after those already held. Precondition: name and value each below 4 GiB
    /// (the parser's header limit keeps them far below).
    void append(boost::beast::http::field name, std::string_view name_string,
                std::string_view value);

    /// Number of fields held.
    std::size_t size() const noexcept { return lines_.size(); }
    bool empty() const noexcept { return lines_.empty(); }

    /// Field `i` (< size()) in the order received. The views live until the next clear/append.
    field_line operator[](std::size_t i) const noexcept;

    /// Every field's line, in the order received: the header block without its final CRLF.
    std::string_view lines() const noexcept { return bytes_; }

    /// True when a field `name` is held.
    bool contains(boost::beast::http::field name) const noexcept {
        for (const auto& e : lines_) {
            if (e.name == name) {
                return true;
            }
        }
        return false;
    }

    /// The value of the first field `name` (empty when there is none), as Beast's
    /// `fields::operator[]` answers.
    std::string_view value_of(boost::beast::http::field name) const noexcept;

    /// The reason phrase of a response's status line, as received (may be empty).
    void reason(std::string_view r) { reason_.assign(r); }
    std::string_view reason() const noexcept { return reason_; }

private:
    struct entry {
        boost::beast::http::field name;
        std::uint32_t at;         ///< offset of the line in bytes_
        std::uint32_t name_size;  ///< the value starts after name and ": "
        std::uint32_t value_size; ///< the line ends after value and "\r\n"
    };

    std::string bytes_;
    std::vector<entry> lines_;
    std::string reason_;
};

} // namespace onceproxy::wire
