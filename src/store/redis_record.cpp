#include "store/redis_record.hpp"

#include <algorithm>
#include <charconv>

namespace onceproxy::store::redis_record {

namespace {

template <class Integer>
void put_number(std::string& out, Integer n) {
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
    out.append(digits, end);
}

void put_field(std::string& out, std::string_view field) {
    put_number(out, field.size());
    out += ':';
    out += field;
}

// `<length>:<bytes>` at `pos`; advances `pos` past it.
std::optional<std::string_view> take_field(std::string_view v, std::size_t& pos) noexcept {
    std::size_t len = 0;
    const char* begin = v.data() + pos;
    const char* end = v.data() + v.size();
    auto [p, ec] = std::from_chars(begin, end, len);
    if (ec != std::errc() || p == begin || p == end || *p != ':') {
        return std::nullopt;
    }
    const auto start = static_cast<std::size_t>(p - v.data()) + 1;
    if (len > v.size() - start) {
        return std::nullopt;
    }
    pos = start + len;
    return v.substr(start, len);
}

} // namespace

std::string claim_value(std::string_view owner, std::string_view fingerprint,
                        std::int64_t created_ms) {
    std::string out;
    out.reserve(owner.size() + fingerprint.size() + 40);
    out += version;
    out += in_flight;
    put_field(out, owner);
    put_field(out, fingerprint);
    put_number(out, created_ms);
    out += ';';
    return out;
}

std::string lease_prefix(std::string_view owner) {
    std::string out;
    out.reserve(owner.size() + 24);
    out += version;
    out += in_flight;
    put_field(out, owner);
    return out;
}

std::string completed_value(std::string_view lease, std::string_view payload) {
    std::string out;
    out.reserve(lease.size() + payload.size());
    out += version;
    out += completed;
    out += lease.substr(std::min<std::size_t>(lease.size(), 2));
    out += payload;
    return out;
}

std::optional<view> parse(std::string_view value) noexcept {
    if (value.size() < 2 || value[0] != version ||
        (value[1] != in_flight && value[1] != completed)) {
        return std::nullopt;
    }
    view out;
    out.state = value[1];
    std::size_t pos = 2;
    auto owner = take_field(value, pos);
    if (!owner) {
        return std::nullopt;
    }
    auto fingerprint = take_field(value, pos);
    if (!fingerprint) {
        return std::nullopt;
    }
    const char* begin = value.data() + pos;
    const char* end = value.data() + value.size();
    auto [p, ec] = std::from_chars(begin, end, out.created_ms);
    if (ec != std::errc() || p == begin || p == end || *p != ';') {
        return std::nullopt;
    }
    out.owner = *owner;
    out.fingerprint = *fingerprint;
    out.payload_offset = static_cast<std::size_t>(p - value.data()) + 1;
    if (out.state == in_flight && out.payload_offset != value.size()) {
        return std::nullopt;
    }
    return out;
}

std::string_view redis_version(std::string_view info) noexcept {
    constexpr std::string_view field = "redis_version:";
    std::size_t pos = 0;
    while (pos < info.size()) {
        auto end = info.find('\n', pos);
        if (end == std::string_view::npos) {
            end = info.size();
        }
        auto line = info.substr(pos, end - pos);
        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }
        if (line.substr(0, field.size()) == field) {
            return line.substr(field.size());
        }
        pos = end + 1;
    }
    return {};
}

std::optional<int> major_version(std::string_view text) noexcept {
    int major = 0;
    const char* begin = text.data();
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(begin, end, major);
    if (ec != std::errc() || p == begin || (p != end && *p != '.')) {
        return std::nullopt;
    }
    return major;
}

} // namespace onceproxy::store::redis_record
