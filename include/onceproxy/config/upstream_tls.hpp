#pragma once
// The TLS client context of an https:// upstream, built from its `tls` settings. The config
// reader builds one to check the files (so --check-config and a start agree); the forwarder
// builds the one it connects with.

#include "onceproxy/config/config.hpp"
#include "onceproxy/config/file_stamp.hpp"

#include <array>
#include <memory>
#include <string>

struct ssl_ctx_st; // OpenSSL's SSL_CTX
struct ssl_st;     // OpenSSL's SSL

namespace onceproxy::config {

struct ssl_ctx_free {
    void operator()(ssl_ctx_st* ctx) const noexcept;
};
using ssl_ctx_ptr = std::unique_ptr<ssl_ctx_st, ssl_ctx_free>;

/// Which setting a failure is about.
enum class upstream_tls_field { none, ca_file, client_cert_file, client_key_file };

struct upstream_tls_context {
    ssl_ctx_ptr ctx; ///< null on failure
    upstream_tls_field failed = upstream_tls_field::none;
    std::string error; ///< why, e.g. "cannot read '/x.pem': No such file or directory"
};

/// A TLS client context (TLS 1.2 or later): with `verify`, peer verification against `ca_file`
/// (or the system's trust store); the client certificate and key when set. Encrypted keys are
/// refused (no passphrase prompt). Host names are set per connection, not here.
upstream_tls_context make_upstream_tls_context(const upstream_tls_config& settings);

/// The name an https:// upstream's certificate must carry: `server_name`, else the url's host.
std::string upstream_peer_name(const upstream_config& up);

/// Sets on `ssl` (a client connection to `up`) the SNI and, when verifying, the name its
/// certificate is checked against (RFC 6125; an IP address is checked against IP SANs and
/// not sent as SNI, RFC 6066 §3). False when the name cannot be set.
bool set_upstream_peer_name(ssl_st* ssl, const upstream_config& up);

/// The stamps of the files `settings` loads, in the order ca_file, client_cert_file,
/// client_key_file (all zero for one not set): a change means the context should be rebuilt.
std::array<file_stamp, 3> upstream_tls_stamps(const upstream_tls_config& settings);

} // namespace onceproxy::config
