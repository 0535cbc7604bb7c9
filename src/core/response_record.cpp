#include <onceproxy/core/response_record.hpp>

#include <cassert>
#include <cstdint>
#include <limits>

namespace onceproxy::core {

namespace {

constexpr unsigned char flag_replayable = 0x01;
/// A trailer section follows the headers (set only when there are trailers, so a record
/// without them is encoded as before and older versions read it).
constexpr unsigned char flag_trailers = 0x02;
constexpr unsigned min_status = 100;
constexpr unsigned max_status = 999;

void put_uint(std::string& out, std::uint64_t v, std::size_t bytes) {
    char be[8];
    for (std::size_t i = 0; i < bytes; ++i) {
        be[i] = static_cast<char>((v >> (8 * (bytes - 1 - i))) & 0xffU);
    }
    out.append(be, bytes);
}

void put_bytes32(std::string& out, std::string_view s) {
    assert(s.size() <= std::numeric_limits<std::uint32_t>::max());
    put_uint(out, s.size(), 4);
    out.append(s);
}

/// Bounds-checked reader over untrusted bytes: every read fails instead of overrunning.
class reader {
public:
    explicit reader(std::string_view data) : data_(data) {}

    std::optional<std::uint64_t> uint(std::size_t bytes) {
        if (remaining() < bytes) {
            return std::nullopt;
        }
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < bytes; ++i) {
            v = (v << 8) | static_cast<unsigned char>(data_[pos_ + i]);
        }
        pos_ += bytes;
        return v;
    }

    std::optional<std::string_view> bytes(std::uint64_t n) {
        if (remaining() < n) {
            return std::nullopt;
        }
        const auto len = static_cast<std::size_t>(n);
        const std::string_view s = data_.substr(pos_, len);
        pos_ += len;
        return s;
    }

    std::optional<std::string_view> bytes32() {
        const auto n = uint(4);
        if (!n) {
            return std::nullopt;
        }
        return bytes(*n);
    }

    [[nodiscard]] std::size_t remaining() const noexcept { return data_.size() - pos_; }

private:
    std::string_view data_;
    std::size_t pos_ = 0;
};

} // namespace

namespace {

template <class Record>
std::string encode_any(const Record& record) {
    std::string out;
    const std::string_view body = record.replayable ? std::string_view(record.body) : "";
    std::size_t size = 16 + body.size();
    for (const auto& [name, value] : record.headers) {
        size += 8 + name.size() + value.size();
    }
    for (const auto& [name, value] : record.trailers) {
        size += 8 + name.size() + value.size();
    }
    out.reserve(size + 4);
    out.push_back(static_cast<char>(record_format_version));
    const bool trailers = !record.trailers.empty();
    out.push_back(static_cast<char>((record.replayable ? flag_replayable : 0) |
                                    (trailers ? flag_trailers : 0)));
    put_uint(out, record.status, 2);
    const auto put_fields = [&](const auto& fields) {
        assert(fields.size() <= std::numeric_limits<std::uint32_t>::max());
        put_uint(out, fields.size(), 4);
        for (const auto& [name, value] : fields) {
            put_bytes32(out, name);
            put_bytes32(out, value);
        }
    };
    put_fields(record.headers);
    if (trailers) {
        put_fields(record.trailers);
    }
    put_uint(out, body.size(), 8);
    out.append(body);
    return out;
}

template <class Record>
std::string encode_stored_any(const Record& record, const record_cipher* cipher,
                              const record_binding& bound) {
    auto encoded = encode_any(record);
    if (cipher == nullptr) {
        return encoded;
    }
    return cipher->seal(encoded, record_binding_aad(bound));
}

/// What `stored` was bound to when sealed: by its marker, `bound` whole or its store key.
std::string aad_of(std::string_view stored, const record_binding& bound) {
    return is_sealed_v1(stored) ? std::string(bound.store_key) : record_binding_aad(bound);
}

} // namespace

std::string record_binding_aad(const record_binding& bound) {
    std::string aad;
    aad.reserve(16 + bound.store_key.size() + bound.fingerprint.size());
    put_bytes32(aad, bound.store_key);
    put_bytes32(aad, bound.fingerprint);
    put_uint(aad, static_cast<std::uint64_t>(bound.created_ms), 8);
    return aad;
}

std::string encode_record(const response_record& record) {
    return encode_any(record);
}

std::string encode_record(const response_record_view& record) {
    return encode_any(record);
}

std::optional<response_record_view> decode_record_view(std::string_view data) {
    reader in(data);
    const auto version = in.uint(1);
    const auto flags = in.uint(1);
    const auto status = in.uint(2);
    if (!version || !flags || !status || *version != record_format_version ||
        (*flags & ~std::uint64_t{flag_replayable | flag_trailers}) != 0 || *status < min_status ||
        *status > max_status) {
        return std::nullopt;
    }
    const auto read_fields = [&](auto& fields) {
        const auto count = in.uint(4);
        // Each field takes at least 8 bytes: refuse a count the input cannot hold before
        // reserving anything for it.
        if (!count || *count > in.remaining() / 8) {
            return false;
        }
        fields.reserve(static_cast<std::size_t>(*count));
        for (std::uint64_t i = 0; i < *count; ++i) {
            const auto name = in.bytes32();
            if (!name) {
                return false;
            }
            const auto value = in.bytes32();
            if (!value) {
                return false;
            }
            fields.emplace_back(*name, *value);
        }
        return true;
    };
    response_record_view record;
    record.status = static_cast<unsigned>(*status);
    record.replayable = (*flags & flag_replayable) != 0;
    if (!read_fields(record.headers) ||
        ((*flags & flag_trailers) != 0 &&
         (!read_fields(record.trailers) || record.trailers.empty()))) {
        return std::nullopt;
    }
    const auto body_size = in.uint(8);
    if (!body_size) {
        return std::nullopt;
    }
    const auto body = in.bytes(*body_size);
    if (!body || in.remaining() != 0 || (!record.replayable && !body->empty())) {
        return std::nullopt;
    }
    record.body = *body;
    return record;
}

std::optional<response_record> decode_record(std::string_view data) {
    const auto view = decode_record_view(data);
    if (!view) {
        return std::nullopt;
    }
    response_record record;
    record.status = view->status;
    record.replayable = view->replayable;
    record.headers.reserve(view->headers.size());
    for (const auto& [name, value] : view->headers) {
        record.headers.emplace_back(std::string(name), std::string(value));
    }
    record.trailers.reserve(view->trailers.size());
    for (const auto& [name, value] : view->trailers) {
        record.trailers.emplace_back(std::string(name), std::string(value));
    }
    record.body.assign(view->body);
    return record;
}

std::string encode_stored_record(const response_record& record, const record_cipher* cipher,
                                 const record_binding& bound) {
    return encode_stored_any(record, cipher, bound);
}

std::string encode_stored_record(const response_record_view& record, const record_cipher* cipher,
                                 const record_binding& bound) {
    return encode_stored_any(record, cipher, bound);
}

std::optional<std::string> open_stored_record(std::string stored, const record_cipher* cipher,
                                              const record_binding& bound,
                                              record_open_failure* why) {
    if (cipher != nullptr) {
        return cipher->open(stored, aad_of(stored, bound), why);
    }
    if (is_sealed(stored)) {
        if (why != nullptr) {
            *why = record_open_failure::unknown_key;
        }
        return std::nullopt;
    }
    return stored;
}

std::optional<response_record> decode_stored_record(std::string_view stored,
                                                    const record_cipher* cipher,
                                                    const record_binding& bound,
                                                    record_open_failure* why) {
    if (cipher != nullptr) {
        const auto plain = cipher->open(stored, aad_of(stored, bound), why);
        return plain ? decode_record(*plain) : std::nullopt;
    }
    if (is_sealed(stored)) {
        if (why != nullptr) {
            *why = record_open_failure::unknown_key;
        }
        return std::nullopt;
    }
    return decode_record(stored);
}

} // namespace onceproxy::core
