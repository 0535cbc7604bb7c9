#pragma once
// The server side of inbound TLS made from a `tls` block: one OpenSSL context with the policy
// (TLS 1.2 and 1.3, Mozilla "intermediate" ciphers, ALPN http/1.1, session tickets and a
// session cache) and the block's files. The config reader loads it to validate the files (so
// --check-config and a start agree), the running proxy to serve them and to rotate them.

#include "onceproxy/config/config.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct ssl_ctx_st; // OpenSSL's SSL_CTX

namespace onceproxy::config {

/// The file of a tls block a load failed on.
enum class tls_file_kind { cert, key, client_ca };

struct tls_load_error {
    tls_file_kind file = tls_file_kind::cert;
    std::string message; ///< what is wrong, naming the file
};

struct tls_material {
    std::shared_ptr<ssl_ctx_st> ctx; ///< null when `error` is set
    std::int64_t not_after = 0;      ///< the leaf certificate's expiry, seconds since the epoch
    std::optional<tls_load_error> error;
};

/// Reads the certificate chain, the private key (which must match it) and, when set, the
/// client CA bundle of `tls`, and makes a server context of them. Never throws for bad files.
[[nodiscard]] tls_material load_server_tls(const tls_files& tls);

} // namespace onceproxy::config
