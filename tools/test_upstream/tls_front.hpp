#pragma once
// The test upstream's TLS listener: each connection is handshaken here, then relayed byte for
// byte to the plain listener of the same process (so every X-Test-* behaviour and count works
// the same over TLS). GET /__tls on either listener reports the handshake counts.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include <atomic>
#include <cstdint>
#include <string>

namespace onceproxy::test_upstream {

struct tls_counters {
    std::atomic<std::uint64_t> handshakes{0}; ///< completed handshakes
    std::atomic<std::uint64_t> resumed{0};    ///< of which resumed a session
    std::atomic<std::uint64_t> failed{0};     ///< handshakes that failed
};

/// The process's counters (zero when there is no TLS listener).
tls_counters& tls_stats();

/// A server context: the certificate chain and key; with `client_ca`, a client certificate
/// signed by it is required. Throws on a file that does not load.
boost::asio::ssl::context make_tls_server_context(const std::string& cert_file,
                                                  const std::string& key_file,
                                                  const std::string& client_ca);

/// Accepts on `acceptor` until it closes; relays each connection to 127.0.0.1:`plain_port`.
boost::asio::awaitable<void> tls_accept_loop(boost::asio::ip::tcp::acceptor& acceptor,
                                             boost::asio::ssl::context& ctx,
                                             unsigned short plain_port);

} // namespace onceproxy::test_upstream
