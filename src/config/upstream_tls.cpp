#include "onceproxy/config/upstream_tls.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace onceproxy::config {

void ssl_ctx_free::operator()(ssl_ctx_st* ctx) const noexcept {
    SSL_CTX_free(ctx);
}

namespace {

/// The oldest queued OpenSSL error as text (the queue is cleared).
std::string openssl_error() {
    const unsigned long code = ERR_peek_error();
    ERR_clear_error();
    if (code == 0) {
        return "unknown error";
    }
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    return buf;
}

/// Empty when `path` can be opened for reading, else why not.
std::string unreadable(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        return "cannot read '" + path + "': " + std::strerror(errno);
    }
    std::fclose(f);
    return {};
}

int no_passphrase(char*, int, int, void*) {
    return -1;
}

upstream_tls_context failure(upstream_tls_field field, std::string error) {
    upstream_tls_context out;
    out.failed = field;
    out.error = std::move(error);
    return out;
}

} // namespace

upstream_tls_context make_upstream_tls_context(const upstream_tls_config& s) {
    ERR_clear_error();
    ssl_ctx_ptr ctx(SSL_CTX_new(TLS_client_method()));
    if (!ctx) {
        return failure(upstream_tls_field::none, "cannot create a TLS context: " + openssl_error());
    }
    SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
    SSL_CTX_set_default_passwd_cb(ctx.get(), no_passphrase);
    if (!s.ca_file.empty()) {
        if (auto why = unreadable(s.ca_file); !why.empty()) {
            return failure(upstream_tls_field::ca_file, why);
        }
        if (SSL_CTX_load_verify_locations(ctx.get(), s.ca_file.c_str(), nullptr) != 1) {
            return failure(upstream_tls_field::ca_file, "cannot load CA certificates from '" +
                                                            s.ca_file + "': " + openssl_error());
        }
    } else if (s.verify && SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
        return failure(upstream_tls_field::none,
                       "cannot load the system's trust store: " + openssl_error());
    }
    SSL_CTX_set_verify(ctx.get(), s.verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);
    if (!s.client_cert_file.empty()) {
        if (auto why = unreadable(s.client_cert_file); !why.empty()) {
            return failure(upstream_tls_field::client_cert_file, why);
        }
        if (SSL_CTX_use_certificate_chain_file(ctx.get(), s.client_cert_file.c_str()) != 1) {
            return failure(upstream_tls_field::client_cert_file,
                           "cannot load a PEM certificate chain from '" + s.client_cert_file +
                               "': " + openssl_error());
        }
    }
    if (!s.client_key_file.empty()) {
        if (auto why = unreadable(s.client_key_file); !why.empty()) {
            return failure(upstream_tls_field::client_key_file, why);
        }
        EVP_PKEY* key = nullptr;
        if (BIO* in = BIO_new_file(s.client_key_file.c_str(), "r"); in != nullptr) {
            key = PEM_read_bio_PrivateKey(in, nullptr, no_passphrase, nullptr);
            BIO_free(in);
        }
        if (key == nullptr) {
            return failure(upstream_tls_field::client_key_file,
                           "cannot load an unencrypted PEM private key from '" + s.client_key_file +
                               "': " + openssl_error());
        }
        const int used = SSL_CTX_use_PrivateKey(ctx.get(), key);
        EVP_PKEY_free(key);
        if (used != 1 || SSL_CTX_check_private_key(ctx.get()) != 1) {
            return failure(upstream_tls_field::client_key_file,
                           "the key in '" + s.client_key_file +
                               "' does not match the certificate in '" + s.client_cert_file +
                               "': " + openssl_error());
        }
    }
    upstream_tls_context out;
    out.ctx = std::move(ctx);
    return out;
}

std::string upstream_peer_name(const upstream_config& up) {
    return up.tls_settings.server_name.empty() ? up.host : up.tls_settings.server_name;
}

bool set_upstream_peer_name(ssl_st* ssl, const upstream_config& up) {
    const auto name = upstream_peer_name(up);
    // An IP literal (an IPv6 zone id aside) is checked against IP SANs and sent as no SNI.
    const auto bare = name.substr(0, name.find('%'));
    unsigned char addr[16];
    const bool is_ip = ::inet_pton(AF_INET, bare.c_str(), addr) == 1 ||
                       ::inet_pton(AF_INET6, bare.c_str(), addr) == 1;
    if (!is_ip) {
        SSL_set_tlsext_host_name(ssl, name.c_str()); // too long a name: no SNI, as before
    }
    if (!up.tls_settings.verify) {
        return true;
    }
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    return (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                  : X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0)) == 1;
}

std::array<file_stamp, 3> upstream_tls_stamps(const upstream_tls_config& s) {
    const auto of = [](const std::string& path) {
        return path.empty() ? file_stamp{} : file_stamp_of(path);
    };
    return {of(s.ca_file), of(s.client_cert_file), of(s.client_key_file)};
}

} // namespace onceproxy::config
