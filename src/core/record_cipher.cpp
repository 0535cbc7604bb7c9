#include <onceproxy/core/record_cipher.hpp>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <stdexcept>

namespace onceproxy::core {

namespace {

/// Update calls take an int length: long inputs go in pieces.
constexpr std::size_t max_chunk = 1U << 30;

struct ctx_free {
    void operator()(EVP_CIPHER_CTX* c) const noexcept { EVP_CIPHER_CTX_free(c); }
};
using ctx_ptr = std::unique_ptr<EVP_CIPHER_CTX, ctx_free>;

/// AES-256-GCM fetched once: EVP_aes_256_gcm() makes OpenSSL 3 look the implementation up at
/// every init, a cost larger than sealing a small record.
const EVP_CIPHER* aes_256_gcm() {
    static EVP_CIPHER* const cipher = [] {
        EVP_CIPHER* c = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
        return c != nullptr ? c : const_cast<EVP_CIPHER*>(EVP_aes_256_gcm());
    }();
    return cipher;
}

/// Fills `out` with `n` random bytes for a nonce. RAND_bytes costs about 3 µs per call here
/// (more than sealing a small record), so each thread draws 4 KiB at a time and hands out
/// every byte once. The process never forks, so no two holders share a buffer.
bool random_nonce(unsigned char* out, std::size_t n) {
    struct pool {
        std::array<unsigned char, 4096> bytes{};
        std::size_t used = 4096;
    };
    thread_local pool p;
    if (p.used + n > p.bytes.size()) {
        if (RAND_bytes(p.bytes.data(), static_cast<int>(p.bytes.size())) != 1) {
            return false;
        }
        p.used = 0;
    }
    std::copy_n(p.bytes.begin() + static_cast<std::ptrdiff_t>(p.used), n, out);
    std::fill_n(p.bytes.begin() + static_cast<std::ptrdiff_t>(p.used), n, 0); // used once
    p.used += n;
    return true;
}

/// Per thread: an encrypt and a decrypt context for each key of the record_cipher used last,
/// keyed with it once; a record then sets only its nonce (EVP_*Init_ex with no cipher and no
/// key keeps the key schedule).
struct context_cache {
    std::uint64_t owner = 0;
    std::vector<ctx_ptr> enc;
    std::vector<ctx_ptr> dec;
};

/// The context of key `index` (of `keys`, the list named `owner`), keyed; null on failure.
EVP_CIPHER_CTX* keyed_context(std::uint64_t owner, const std::vector<record_key>& keys,
                              std::size_t index, bool enc) {
    thread_local context_cache cache;
    if (cache.owner != owner) {
        cache.owner = 0;
        cache.enc.clear();
        cache.dec.clear();
        cache.enc.resize(keys.size());
        cache.dec.resize(keys.size());
        cache.owner = owner;
    }
    auto& slot = enc ? cache.enc[index] : cache.dec[index];
    if (!slot) {
        ctx_ptr c(EVP_CIPHER_CTX_new());
        const auto* key = reinterpret_cast<const unsigned char*>(keys[index].bytes.data());
        if (!c || (enc ? EVP_EncryptInit_ex(c.get(), aes_256_gcm(), nullptr, key, nullptr)
                       : EVP_DecryptInit_ex(c.get(), aes_256_gcm(), nullptr, key, nullptr)) != 1) {
            return nullptr;
        }
        slot = std::move(c);
    }
    return slot.get();
}

std::uint64_t next_cache_id() {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

const unsigned char* bytes_of(std::string_view s) noexcept {
    return reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* bytes_of(std::string& s, std::size_t at) noexcept {
    return reinterpret_cast<unsigned char*>(s.data() + at);
}

/// Feeds `aad` pieces to an initialised encrypt (`enc`) or decrypt context.
bool feed_aad(EVP_CIPHER_CTX* c, bool enc, std::string_view aad) {
    while (!aad.empty()) {
        const auto n = std::min(aad.size(), max_chunk);
        int out = 0;
        const int ok =
            enc ? EVP_EncryptUpdate(c, nullptr, &out, bytes_of(aad), static_cast<int>(n))
                : EVP_DecryptUpdate(c, nullptr, &out, bytes_of(aad), static_cast<int>(n));
        if (ok != 1) {
            return false;
        }
        aad.remove_prefix(n);
    }
    return true;
}

/// Runs `in` through the context into `out` at `at` (GCM: output length = input length).
bool feed_data(EVP_CIPHER_CTX* c, bool enc, std::string_view in, std::string& out, std::size_t at) {
    while (!in.empty()) {
        const auto n = std::min(in.size(), max_chunk);
        int written = 0;
        const int ok = enc ? EVP_EncryptUpdate(c, bytes_of(out, at), &written, bytes_of(in),
                                               static_cast<int>(n))
                           : EVP_DecryptUpdate(c, bytes_of(out, at), &written, bytes_of(in),
                                               static_cast<int>(n));
        if (ok != 1 || static_cast<std::size_t>(written) != n) {
            return false;
        }
        at += n;
        in.remove_prefix(n);
    }
    return true;
}

/// The head of a sealed record: marker, key id, nonce.
struct sealed_head {
    std::string_view id;
    std::string_view nonce;
    std::size_t size = 0; ///< bytes of the head
};

std::optional<sealed_head> parse_head(std::string_view s) noexcept {
    if (s.size() < 2 || !is_sealed(s)) {
        return std::nullopt;
    }
    const std::size_t id_len = static_cast<unsigned char>(s[1]);
    if (id_len == 0 || id_len > max_record_key_id_bytes ||
        s.size() < 2 + id_len + record_nonce_bytes + record_tag_bytes) {
        return std::nullopt;
    }
    return sealed_head{s.substr(2, id_len), s.substr(2 + id_len, record_nonce_bytes),
                       2 + id_len + record_nonce_bytes};
}

} // namespace

std::string_view to_string(record_open_failure f) noexcept {
    switch (f) {
    case record_open_failure::plaintext:
        return "plaintext";
    case record_open_failure::unknown_key:
        return "unknown_key";
    case record_open_failure::authentication:
        return "authentication";
    case record_open_failure::malformed:
        return "malformed";
    }
    return "malformed";
}

bool is_sealed(std::string_view stored) noexcept {
    return !stored.empty() &&
           (static_cast<unsigned char>(stored[0]) == sealed_record_marker || is_sealed_v1(stored));
}

bool is_sealed_v1(std::string_view stored) noexcept {
    return !stored.empty() && static_cast<unsigned char>(stored[0]) == sealed_record_marker_v1;
}

std::optional<std::string_view> sealed_key_id(std::string_view stored) noexcept {
    const auto head = parse_head(stored);
    return head ? std::optional(head->id) : std::nullopt;
}

record_cipher::record_cipher(std::vector<record_key> keys)
    : keys_(std::move(keys)), cache_id_(next_cache_id()) {
    if (keys_.empty()) {
        throw std::invalid_argument("record_cipher: no key");
    }
    for (std::size_t i = 0; i < keys_.size(); ++i) {
        const auto& k = keys_[i];
        if (k.bytes.size() != record_key_bytes) {
            throw std::invalid_argument("record_cipher: key '" + k.id + "' is not 32 bytes");
        }
        if (k.id.empty() || k.id.size() > max_record_key_id_bytes) {
            throw std::invalid_argument("record_cipher: a key id must be 1..64 bytes");
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (keys_[j].id == k.id) {
                throw std::invalid_argument("record_cipher: key id '" + k.id + "' repeated");
            }
        }
    }
}

const record_key* record_cipher::find(std::string_view id) const noexcept {
    for (const auto& k : keys_) {
        if (k.id == id) {
            return &k;
        }
    }
    return nullptr;
}

std::string record_cipher::seal(std::string_view plain, std::string_view aad) const {
    const auto& key = keys_.front();
    const std::size_t head = 2 + key.id.size() + record_nonce_bytes;
    std::string out(head + plain.size() + record_tag_bytes, '\0');
    out[0] = static_cast<char>(sealed_record_marker);
    out[1] = static_cast<char>(key.id.size());
    out.replace(2, key.id.size(), key.id);
    if (!random_nonce(bytes_of(out, 2 + key.id.size()), record_nonce_bytes)) {
        throw std::runtime_error("record encryption: the random generator failed");
    }
    EVP_CIPHER_CTX* c = keyed_context(cache_id_, keys_, 0, true);
    int n = 0;
    const bool ok =
        c != nullptr &&
        EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, bytes_of(out, 2 + key.id.size())) == 1 &&
        feed_aad(c, true, std::string_view(out).substr(0, head)) && feed_aad(c, true, aad) &&
        feed_data(c, true, plain, out, head) &&
        EVP_EncryptFinal_ex(c, bytes_of(out, head + plain.size()), &n) == 1 && n == 0 &&
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, static_cast<int>(record_tag_bytes),
                            bytes_of(out, head + plain.size())) == 1;
    if (!ok) {
        throw std::runtime_error("record encryption failed");
    }
    return out;
}

std::optional<std::string> record_cipher::open(std::string_view sealed, std::string_view aad,
                                               record_open_failure* why) const {
    const auto fail = [why](record_open_failure f) {
        if (why != nullptr) {
            *why = f;
        }
        return std::nullopt;
    };
    if (!is_sealed(sealed)) {
        return fail(record_open_failure::plaintext);
    }
    const auto head = parse_head(sealed);
    if (!head) {
        return fail(record_open_failure::malformed);
    }
    const auto* key = find(head->id);
    if (key == nullptr) {
        return fail(record_open_failure::unknown_key);
    }
    const auto body = sealed.substr(head->size, sealed.size() - head->size - record_tag_bytes);
    std::string tag(sealed.substr(sealed.size() - record_tag_bytes));
    std::string plain(body.size(), '\0');
    EVP_CIPHER_CTX* c =
        keyed_context(cache_id_, keys_, static_cast<std::size_t>(key - keys_.data()), false);
    int n = 0;
    const bool ok = c != nullptr &&
                    EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, bytes_of(head->nonce)) == 1 &&
                    feed_aad(c, false, sealed.substr(0, head->size)) && feed_aad(c, false, aad) &&
                    feed_data(c, false, body, plain, 0) &&
                    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(record_tag_bytes),
                                        tag.data()) == 1 &&
                    EVP_DecryptFinal_ex(c, bytes_of(plain, 0), &n) == 1;
    if (!ok) {
        return fail(record_open_failure::authentication);
    }
    return plain;
}

} // namespace onceproxy::core
