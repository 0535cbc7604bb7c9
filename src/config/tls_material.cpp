#include "onceproxy/config/tls_material.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstdio>
#include <ctime>
#include <string_view>

namespace onceproxy::config {

namespace {

/// Mozilla's "intermediate" policy (TLS 1.2 suites; TLS 1.3 keeps OpenSSL's three defaults).
constexpr const char* tls12_ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305";

constexpr unsigned char session_id_context[] = "onceproxy";

/// The oldest OpenSSL error, as text ("" when there is none); clears the queue.
std::string openssl_reason() {
    const unsigned long e = ERR_peek_error();
    std::string out;
    if (e != 0) {
        const char* reason = ERR_reason_error_string(e);
        out = reason != nullptr ? reason : "error " + std::to_string(e);
    }
    ERR_clear_error();
    return out;
}

bool readable(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        return false;
    }
    std::fclose(f);
    return true;
}

tls_material fail(tls_file_kind kind, std::string message) {
    tls_material m;
    m.error = tls_load_error{kind, std::move(message)};
    ERR_clear_error();
    return m;
}

/// The protocols the TLS listener offers, in its order of preference (ALPN wire format).
struct alpn_offer {
    const unsigned char* list;
    unsigned int size;
};
constexpr unsigned char h2_and_http11[] = {2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
constexpr alpn_offer with_h2{h2_and_http11, sizeof h2_and_http11};
constexpr alpn_offer http11_only{h2_and_http11 + 3, sizeof h2_and_http11 - 3};

/// ALPN: h2 (when offered, see tls_files::http2) or http/1.1, the server's preference first; a
/// client offering only other protocols goes on without ALPN rather than being refused.
int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                unsigned int inlen, void* arg) {
    const auto* offer = static_cast<const alpn_offer*>(arg);
    unsigned char* selected = nullptr;
    if (SSL_select_next_proto(&selected, outlen, offer->list, offer->size, in, inlen) ==
        OPENSSL_NPN_NEGOTIATED) {
        *out = selected;
        return SSL_TLSEXT_ERR_OK;
    }
    return SSL_TLSEXT_ERR_NOACK;
}

std::int64_t expiry_of(SSL_CTX* ctx) {
    X509* leaf = SSL_CTX_get0_certificate(ctx);
    if (leaf == nullptr) {
        return 0;
    }
    std::tm tm{};
    if (ASN1_TIME_to_tm(X509_get0_notAfter(leaf), &tm) != 1) {
        return 0;
    }
    return static_cast<std::int64_t>(timegm(&tm));
}

} // namespace

tls_material load_server_tls(const tls_files& tls) {
    ERR_clear_error();
    if (!readable(tls.cert_file)) {
        return fail(tls_file_kind::cert, "cannot read cert_file '" + tls.cert_file + "'");
    }
    if (!readable(tls.key_file)) {
        return fail(tls_file_kind::key, "cannot read key_file '" + tls.key_file + "'");
    }
    if (!tls.client_ca_file.empty() && !readable(tls.client_ca_file)) {
        return fail(tls_file_kind::client_ca,
                    "cannot read client_ca_file '" + tls.client_ca_file + "'");
    }
    std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
    if (!ctx) {
        return fail(tls_file_kind::cert, "cannot create a TLS context: " + openssl_reason());
    }
    SSL_CTX* c = ctx.get();
    SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
    SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                               SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(c, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_set_cipher_list(c, tls12_ciphers) != 1 ||
        SSL_CTX_set1_groups_list(c, "X25519:P-256:P-384") != 1) {
        return fail(tls_file_kind::cert, "cannot set the cipher policy: " + openssl_reason());
    }
    SSL_CTX_set_alpn_select_cb(c, select_alpn,
                               const_cast<alpn_offer*>(tls.http2 ? &with_h2 : &http11_only));
    // Resumption: tickets (OpenSSL's default, keys per context) and a server-side cache.
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_SERVER);
    SSL_CTX_sess_set_cache_size(c, 20'480);
    SSL_CTX_set_session_id_context(c, session_id_context, sizeof session_id_context - 1);

    if (SSL_CTX_use_certificate_chain_file(c, tls.cert_file.c_str()) != 1) {
        return fail(tls_file_kind::cert, "cert_file '" + tls.cert_file +
                                             "' holds no usable PEM certificate (" +
                                             openssl_reason() + ")");
    }
    if (SSL_CTX_use_PrivateKey_file(c, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
        const auto why = openssl_reason();
        if (why.find("mismatch") != std::string::npos) {
            return fail(tls_file_kind::key, "key_file '" + tls.key_file +
                                                "' does not match the certificate of cert_file '" +
                                                tls.cert_file + "'");
        }
        return fail(tls_file_kind::key, "key_file '" + tls.key_file +
                                            "' holds no usable PEM private key (" + why + ")");
    }
    if (SSL_CTX_check_private_key(c) != 1) {
        return fail(tls_file_kind::key, "key_file '" + tls.key_file +
                                            "' does not match the certificate of cert_file '" +
                                            tls.cert_file + "'");
    }
    if (!tls.client_ca_file.empty()) {
        STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca_file.c_str());
        if (names == nullptr ||
            SSL_CTX_load_verify_locations(c, tls.client_ca_file.c_str(), nullptr) != 1) {
            if (names != nullptr) {
                sk_X509_NAME_pop_free(names, X509_NAME_free);
            }
            return fail(tls_file_kind::client_ca, "client_ca_file '" + tls.client_ca_file +
                                                      "' holds no usable PEM certificate");
        }
        SSL_CTX_set_client_CA_list(c, names); // takes ownership
        SSL_CTX_set_verify(
            c, SSL_VERIFY_PEER | (tls.require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
            nullptr);
    }
    tls_material m;
    m.not_after = expiry_of(c);
    m.ctx = std::move(ctx);
    ERR_clear_error();
    return m;
}

} // namespace onceproxy::config
