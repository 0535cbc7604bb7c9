#include "onceproxy/wire/raw_header_store.hpp"

#include "onceproxy/text/ows.hpp"

namespace onceproxy::wire {

namespace {

/// Above these, clear() gives the memory back: a head that large is rare, and an idle pooled
/// connection should not keep its storage for good (60 KiB of one-byte fields would leave a
/// quarter of a megabyte of records).
constexpr std::size_t kept_bytes = 16 * 1024;
constexpr std::size_t kept_lines = 256;

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
    lines_.push_back({name, static_cast<std::uint32_t>(bytes_.size()),
                      static_cast<std::uint32_t>(name_string.size()),
                      static_cast<std::uint32_t>(value.size())});
    bytes_.append(name_string).append(": ").append(value).append("\r\n");
}

raw_header_store::field_line raw_header_store::operator[](std::size_t i) const noexcept {
    const auto& e = lines_[i];
    const std::string_view all = bytes_;
    return {e.name, all.substr(e.at, e.name_size), all.substr(e.at + e.name_size + 2, e.value_size),
            all.substr(e.at, std::size_t{e.name_size} + e.value_size + 4)};
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
