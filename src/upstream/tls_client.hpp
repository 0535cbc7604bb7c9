#pragma once
// TLS to an https:// upstream: the client context of one pool, the session kept for resumption,
// and the handshake of a new connection (its wire::stream carries the TLS).

#include "onceproxy/config/config.hpp"
#include "onceproxy/upstream/forwarder.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>

struct ssl_session_st; // OpenSSL's SSL_SESSION

namespace onceproxy::upstream {

/// The TLS state of one pool (one upstream, one worker): used from that worker's executor only.
class tls_client {
public:
    explicit tls_client(const config::upstream_config& cfg);
    ~tls_client();
    tls_client(const tls_client&) = delete;
    tls_client& operator=(const tls_client&) = delete;

    /// The settings' files loaded (else every handshake fails with why they did not).
    bool loaded() const noexcept;

    /// Puts TLS over `c.stream` (connected) and completes the handshake by `c.dl`'s deadline: SNI,
    /// certificate and host-name checks (RFC 6125) when verifying, the client certificate when
    /// configured, and the session of the last handshake offered for resumption. Empty on
    /// success, else why it failed (also logged).
    boost::asio::awaitable<std::string> handshake(connection& c);

    /// Keeps `s` (a new session the upstream issued) for the next connection's resumption.
    void keep_session(ssl_session_st* s) noexcept;

    /// Logs a failed handshake (a warning per distinct reason or per 10 s, else debug).
    void log_failure(const std::string& reason);

private:
    struct state;
    std::unique_ptr<state> s_;
};

} // namespace onceproxy::upstream
