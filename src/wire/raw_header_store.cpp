#include "onceproxy/wire/raw_header_store.hpp"

#include "onceproxy/text/ows.hpp"

#include <cstring>

namespace onceproxy::wire {

namespace {

/// Above these, clear() gives the memory back: a head that large is rare, and an idle pooled
/// connection should not keep its storage for good (60 KiB of one-byte fields would leave a
/// quarter of a megabyte of records).
constexpr std::size_t kept_bytes = 16 * 1024;
constexpr std::size_t kept_lines = 256;

/// What the first field reserves: enough for most answers' heads.
constexpr std::size_t first_bytes = 512;
constexpr std::size_t first_lines = 16;

} // namespace

void raw_header_store::clear() noexcept {
    if (bytes_.capacity() > kept_bytes) {
        std::string().swap(bytes_);
    } else {
        bytes_.clear();
    }
    if (lines_.capacity() > kept_lines) {
        std::vector<entry>().swap(lines_);
    } else {
        lines_.clear();
    }
    reason_.clear();
}

void raw_header_store::append(boost::beast::http::field name, std::string_view name_string,
                              std::string_view value) {
    // What Beast's `fields` strips from a value: the parser has trimmed already except
    // around an obsolete line fold.
    value = text::trim_ows(value);
    if (lines_.empty()) {
        // Room for a usual head at once (a new store would otherwise grow a few times).
        bytes_.reserve(first_bytes);
        lines_.reserve(first_lines);
    }
    const std::size_t at = bytes_.size();
    lines_.push_back({name, static_cast<std::uint32_t>(at),
                      static_cast<std::uint32_t>(name_string.size()),
                      static_cast<std::uint32_t>(value.size())});
    // One growth for the whole line, then plain copies.
    bytes_.resize(at + name_string.size() + value.size() + 4);
    char* w = bytes_.data() + at;
    std::memcpy(w, name_string.data(), name_string.size());
    w += name_string.size();
    *w++ = ':';
    *w++ = ' ';
    if (!value.empty()) {
        std::memcpy(w, value.data(), value.size());
        w += value.size();
    }
    *w++ = '\r';
    *w = '\n';
}

raw_header_store::field_line raw_header_store::operator[](std::size_t i) const noexcept {
    const auto& e = lines_[i];
    const char* const line = bytes_.data() + e.at;
    return {e.name,
            {line, e.name_size},
            {line + e.name_size + 2, e.value_size},
            {line, std::size_t{e.name_size} + e.value_size + 4}};
}

std::string_view raw_header_store::value_of(boost::beast::http::field name) const noexcept {
    for (std::size_t i = 0; i < lines_.size(); ++i) {
        if (lines_[i].name == name) {
            return (*this)[i].value;
        }
    }
    return {};
}

} // namespace onceproxy::wire
