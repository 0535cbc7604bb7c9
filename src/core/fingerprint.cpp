#include <onceproxy/core/fingerprint.hpp>

#include <onceproxy/core/canonical_json.hpp>
#include <onceproxy/text/ows.hpp>

#include <openssl/evp.h>

#include <array>
#include <cassert>
#include <cstdint>
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

char lower(char c) noexcept {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

/// Incremental SHA-256 over length-prefixed fields. Small fields gather in a buffer and reach
/// OpenSSL in one update; each thread keeps one digest context and one buffer for all its
/// hashes, so a request's three hashes allocate nothing. Not reentrant: one hasher per thread
/// at a time (hashing never calls back into code that hashes).
class hasher {
public:
    hasher() : ctx_(context()), buf_(buffer()) {
        assert(!in_use() && "one hasher per thread at a time");
        if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, sha256_md(), nullptr) != 1) {
            throw std::runtime_error("SHA-256 unavailable");
        }
        buf_.clear();
        in_use() = true;
    }
    ~hasher() { in_use() = false; }
    hasher(const hasher&) = delete;
    hasher& operator=(const hasher&) = delete;

    void raw(std::string_view data) {
        if (data.size() >= direct_from) {
            flush();
            update(data);
        } else {
            buf_.append(data);
        }
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
        buf_.append(be.data(), be.size());
    }

    /// A header name, lower-cased on the way in.
    void lowered_field(std::string_view name) {
        number(name.size());
        for (const char c : name) {
            buf_.push_back(lower(c));
        }
    }

    std::string finish() {
        flush();
        std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
        unsigned int len = 0;
        if (EVP_DigestFinal_ex(ctx_, out.data(), &len) != 1) {
            throw std::runtime_error("SHA-256 final failed");
        }
        assert(len == 32);
        return std::string(reinterpret_cast<const char*>(out.data()), len);
    }

private:
    /// Data at least this long goes to OpenSSL directly rather than through the buffer.
    static constexpr std::size_t direct_from = 512;

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

    static std::string& buffer() {
        thread_local std::string buf;
        return buf;
    }

    void update(std::string_view data) {
        if (!data.empty() && EVP_DigestUpdate(ctx_, data.data(), data.size()) != 1) {
            throw std::runtime_error("SHA-256 update failed");
        }
    }

    void flush() {
        update(buf_);
        buf_.clear();
    }

    EVP_MD_CTX* ctx_;
    std::string& buf_;
};

bool iequals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) {
        return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (lower(a[i]) != lower(b[i])) {
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

// Body encodings, hashed before the body so a canonical form and an identical raw body
// (differently typed requests) stay distinct.
constexpr std::string_view body_raw = "raw";
constexpr std::string_view body_jcs = "jcs";

} // namespace

std::string sha256(std::string_view data) {
    hasher h;
    h.raw(data);
    return h.finish();
}

std::string to_hex(std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(bytes.size() * 2, '\0');
    char* p = out.data();
    for (const char c : bytes) {
        const auto u = static_cast<unsigned char>(c);
        *p++ = digits[u >> 4];
        *p++ = digits[u & 0xfU];
    }
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
        if (auto canonical = canonicalize_json(input.body, number_form::distinct)) {
            h.field(body_jcs);
            h.field(*canonical);
            return h.finish();
        }
    }
    h.field(body_raw);
    h.field(input.body);
    return h.finish();
}

std::string principal_hash(std::span<const header_view> headers) {
    hasher h;
    h.field("onceproxy principal v1");
    hash_headers(h, headers);
    return h.finish();
}

std::string store_key(std::string_view prefix, std::string_view route,
                      std::string_view principal_hash, std::string_view key) {
    hasher h;
    h.field("onceproxy store key v1");
    h.field(route);
    h.field(principal_hash);
    h.field(key);
    std::string out(prefix);
    out += to_hex(h.finish());
    return out;
}

} // namespace onceproxy::core
