#include <onceproxy/core/fingerprint.hpp>

#include <onceproxy/core/canonical_json.hpp>
#include <onceproxy/text/ows.hpp>

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace onceproxy::core {

namespace {

// OpenSSL 3 looks the algorithm up (an implicit fetch, with locks) on every EVP_sha256()
// initialisation; fetching it once keeps that off the per-request path.
const EVP_MD* sha256_md() {
    static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return md != nullptr ? md : EVP_sha256();
}

/// A SHA-256 digest: 32 raw bytes.
using digest = std::array<char, 32>;

std::string as_string(const digest& d) {
    return {d.data(), d.size()};
}

char lower(char c) noexcept {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

/// Incremental SHA-256 over length-prefixed fields. Small fields gather in a buffer and reach
/// OpenSSL in few updates; each thread keeps one digest context for all its hashes, so a
/// request's three hashes allocate nothing. Not reentrant: one hasher per thread at a time
/// (hashing never calls back into code that hashes).
class hasher {
public:
    hasher() : ctx_(context()) {
        assert(!in_use() && "one hasher per thread at a time");
        if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, sha256_md(), nullptr) != 1) {
            throw std::runtime_error("SHA-256 unavailable");
        }
        in_use() = true;
    }
    ~hasher() { in_use() = false; }
    hasher(const hasher&) = delete;
    hasher& operator=(const hasher&) = delete;

    void raw(std::string_view data) {
        if (data.size() > buf_.size() - used_) {
            flush();
            if (data.size() >= buf_.size()) {
                update(data);
                return;
            }
        }
        // (std::copy: an empty view may have no data pointer, which memcpy may not be given.)
        std::copy(data.begin(), data.end(), buf_.begin() + static_cast<std::ptrdiff_t>(used_));
        used_ += data.size();
    }

    /// 8-byte big-endian length, then the bytes.
    void field(std::string_view data) {
        number(data.size());
        raw(data);
    }

    void number(std::uint64_t n) {
        std::array<char, 8> be{};
        for (std::size_t i = 0; i < be.size(); ++i) {
            be[i] = static_cast<char>((n >> (56 - 8 * i)) & 0xffU);
        }
        raw({be.data(), be.size()});
    }

    /// A header name, lower-cased on the way in.
    void lowered_field(std::string_view name) {
        number(name.size());
        for (const char c : name) {
            if (used_ == buf_.size()) {
                flush();
            }
            buf_[used_++] = lower(c);
        }
    }

    /// The SHA-256 of everything hashed.
    digest finish() {
        flush();
        std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
        unsigned int len = 0;
        if (EVP_DigestFinal_ex(ctx_, out.data(), &len) != 1) {
            throw std::runtime_error("SHA-256 final failed");
        }
        assert(len == 32);
        digest d;
        std::memcpy(d.data(), out.data(), d.size());
        return d;
    }

private:
    static EVP_MD_CTX* context() {
        struct ctx_free {
            void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
        };
        thread_local const std::unique_ptr<EVP_MD_CTX, ctx_free> ctx(EVP_MD_CTX_new());
        return ctx.get();
    }

    static bool& in_use() {
        thread_local bool used = false;
        return used;
    }

    void update(std::string_view data) {
        if (!data.empty() && EVP_DigestUpdate(ctx_, data.data(), data.size()) != 1) {
            throw std::runtime_error("SHA-256 update failed");
        }
    }

    void flush() {
        update({buf_.data(), used_});
        used_ = 0;
    }

    EVP_MD_CTX* ctx_;
    /// Fields not yet given to OpenSSL: [0, used_). Data this long or longer goes to OpenSSL
    /// directly.
    std::array<char, 512> buf_;
    std::size_t used_ = 0;
};

bool iequals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) {
        return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (a[i] != b[i] && lower(a[i]) != lower(b[i])) {
            return false;
        }
    }
    return true;
}

bool ends_with_icase(std::string_view s, std::string_view suffix) noexcept {
    return s.size() >= suffix.size() && iequals(s.substr(s.size() - suffix.size()), suffix);
}

void hash_headers(hasher& h, std::span<const header_view> headers) {
    h.number(headers.size());
    for (const auto& [name, value] : headers) {
        h.lowered_field(name);
        h.field(value);
    }
}

/// "00" to "ff": the two lower-case hex digits of every byte value, one lookup per byte.
constexpr auto hex_pairs = [] {
    constexpr std::string_view digits = "0123456789abcdef";
    std::array<char, 512> pairs{};
    for (std::size_t i = 0; i < 256; ++i) {
        pairs[2 * i] = digits[i >> 4];
        pairs[2 * i + 1] = digits[i & 0xfU];
    }
    return pairs;
}();

/// Appends the lower-case hexadecimal of `bytes` to `out`.
void append_hex(std::string& out, std::string_view bytes) {
    const std::size_t at = out.size();
    out.resize(at + bytes.size() * 2);
    write_hex(bytes, out.data() + at);
}

/// A thread's canonical-JSON buffer larger than this is given back after the request.
constexpr std::size_t kept_canonical_bytes = 64 * 1024;

// Body encodings, hashed before the body so a canonical form and an identical raw body
// (differently typed requests) stay distinct.
constexpr std::string_view body_raw = "raw";
constexpr std::string_view body_jcs = "jcs";

} // namespace

std::string sha256(std::string_view data) {
    hasher h;
    h.raw(data);
    return as_string(h.finish());
}

void write_hex(std::string_view bytes, char* out) noexcept {
    for (const char c : bytes) {
        std::memcpy(out, &hex_pairs[2 * static_cast<unsigned char>(c)], 2);
        out += 2;
    }
}

std::string to_hex(std::string_view bytes) {
    std::string out;
    append_hex(out, bytes);
    return out;
}

bool is_json_media_type(std::string_view content_type) noexcept {
    std::string_view media = content_type.substr(0, content_type.find(';'));
    media = text::trim_ows(media);
    const auto slash = media.find('/');
    if (slash == std::string_view::npos || !iequals(media.substr(0, slash), "application")) {
        return false;
    }
    const std::string_view subtype = media.substr(slash + 1);
    return iequals(subtype, "json") || (subtype.size() > 5 && ends_with_icase(subtype, "+json"));
}

std::string compute_fingerprint(const fingerprint_input& input) {
    hasher h;
    h.field("onceproxy fingerprint v1");
    h.field(input.method);
    h.field(input.target);
    hash_headers(h, input.headers);
    if (input.json_canonical && is_json_media_type(input.content_type)) {
        // One buffer per thread, given back when a large body made it large.
        thread_local std::string canonical;
        const bool valid = canonicalize_json_into(input.body, number_form::distinct, canonical);
        if (valid) {
            h.field(body_jcs);
            h.field(canonical);
        }
        if (canonical.capacity() > kept_canonical_bytes) {
            canonical = std::string();
        }
        if (valid) {
            return as_string(h.finish());
        }
    }
    h.field(body_raw);
    h.field(input.body);
    return as_string(h.finish());
}

std::string principal_hash(std::span<const header_view> headers) {
    hasher h;
    h.field("onceproxy principal v1");
    hash_headers(h, headers);
    return as_string(h.finish());
}

std::string store_key(std::string_view prefix, std::string_view route,
                      std::string_view principal_hash, std::string_view key) {
    hasher h;
    h.field("onceproxy store key v1");
    h.field(route);
    h.field(principal_hash);
    h.field(key);
    const digest d = h.finish();
    std::string out;
    out.reserve(prefix.size() + 2 * d.size());
    out += prefix;
    append_hex(out, {d.data(), d.size()});
    return out;
}

} // namespace onceproxy::core
