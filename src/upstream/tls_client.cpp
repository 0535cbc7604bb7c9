#include "upstream/tls_client.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/config/upstream_tls.hpp"
#include "onceproxy/log/log.hpp"

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace onceproxy::upstream {

namespace net = boost::asio;
namespace ssl = net::ssl;
using clock = std::chrono::steady_clock;

namespace {

/// The ex_data slot of an SSL_CTX that points back at its tls_client.
int client_index() {
    static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
    return index;
}

/// OpenSSL's new-session callback (client side): TLS 1.3 sessions arrive after the handshake.
/// A copy is kept: OpenSSL marks the session of a connection that ends without a TLS shutdown
/// (how pooled connections usually end) not resumable, and the copy must not follow it.
int on_new_session(SSL* ssl, SSL_SESSION* session) {
    auto* client =
        static_cast<tls_client*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), client_index()));
    if (client != nullptr && SSL_SESSION_is_resumable(session) == 1) {
        if (SSL_SESSION* copy = SSL_SESSION_dup(session); copy != nullptr) {
            client->keep_session(copy);
        }
    }
    return 0; // OpenSSL keeps (and frees) its own reference
}

} // namespace

struct tls_client::state {
    explicit state(const config::upstream_config& c)
        : cfg(c), name(config::upstream_peer_name(c)) {}
    config::upstream_config cfg; ///< its name (logs), host and tls settings (each peer name)
    std::string name;            ///< SNI and the name the certificate must carry (logs)
    /// Null when the settings did not load; shared with the connections (their TLS).
    std::shared_ptr<ssl::context> ctx;
    std::string ctx_error;
    SSL_SESSION* session = nullptr; ///< of the last handshake; owned
    std::string last_logged;
    clock::time_point logged_at{};
};

tls_client::tls_client(const config::upstream_config& cfg) : s_(std::make_unique<state>(cfg)) {
    auto built = config::make_upstream_tls_context(cfg.tls_settings);
    if (!built.ctx) {
        s_->ctx_error = built.error;
        return;
    }
    SSL_CTX* raw = built.ctx.release();
    SSL_CTX_set_session_cache_mode(raw, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(raw, on_new_session);
    SSL_CTX_set_ex_data(raw, client_index(), this);
    s_->ctx = std::make_shared<ssl::context>(raw); // takes ownership
}

tls_client::~tls_client() {
    if (s_->ctx) {
        // A connection may outlive this pool state for a moment: it must not call back into it.
        SSL_CTX_set_ex_data(s_->ctx->native_handle(), client_index(), nullptr);
    }
    if (s_->session != nullptr) {
        SSL_SESSION_free(s_->session);
    }
}

bool tls_client::loaded() const noexcept {
    return s_->ctx != nullptr;
}

void tls_client::keep_session(SSL_SESSION* session) noexcept {
    if (s_->session != nullptr) {
        SSL_SESSION_free(s_->session);
    }
    s_->session = session;
}

void tls_client::log_failure(const std::string& reason) {
    // A broken upstream fails every request: one warning per distinct reason (or per 10 s).
    const auto now = clock::now();
    const bool loud = reason != s_->last_logged || now - s_->logged_at >= std::chrono::seconds(10);
    if (loud) {
        s_->last_logged = reason;
        s_->logged_at = now;
    }
    log::write(loud ? log::level::warn : log::level::debug, "upstream", "TLS handshake failed",
               {{"upstream", s_->cfg.name}, {"server_name", s_->name}, {"reason", reason}});
}

net::awaitable<std::string> tls_client::handshake(connection& c) {
    if (!s_->ctx) {
        log_failure(s_->ctx_error);
        co_return s_->ctx_error;
    }
    c.stream.use_tls(s_->ctx);
    c.tls = this;
    SSL* ssl = c.stream.native_handle();
    if (!config::set_upstream_peer_name(ssl, s_->cfg)) {
        std::string reason = "cannot check the certificate against '" + s_->name + "'";
        log_failure(reason);
        co_return reason;
    }
    if (s_->session != nullptr) {
        SSL_set_session(ssl, s_->session);
    }
    const bool h2 = s_->cfg.protocol == config::upstream_protocol::h2;
    if (h2) {
        static constexpr unsigned char alpn_h2[] = {2, 'h', '2'};
        SSL_set_alpn_protos(ssl, alpn_h2, sizeof alpn_h2);
    }
    const auto ec = co_await c.stream.async_handshake(wire::stream::role::client);
    if (!ec && h2 && c.stream.alpn() != "h2") {
        std::string reason = "the upstream did not agree to HTTP/2 (ALPN h2)";
        log_failure(reason);
        co_return reason;
    }
    if (!ec) {
        log::debug("upstream", "TLS handshake",
                   {{"upstream", s_->cfg.name},
                    {"offered", s_->session != nullptr},
                    {"resumed", SSL_session_reused(ssl) == 1}});
        co_return std::string();
    }
    std::string reason;
    if (c.dl.fired()) {
        reason = "the handshake did not complete within connect_timeout";
    } else {
        reason = ec.message();
        const long verify = SSL_get_verify_result(ssl);
        if (verify != X509_V_OK) {
            reason += ": ";
            reason += X509_verify_cert_error_string(verify);
        }
    }
    log_failure(reason);
    co_return reason;
}

bool tls_refused(connection& c, const boost::system::error_code& ec) {
    if (c.tls == nullptr || ec.category() != net::error::get_ssl_category()) {
        return false;
    }
    const auto reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
    switch (reason - SSL_AD_REASON_OFFSET) {
    case SSL_AD_HANDSHAKE_FAILURE:
    case SSL_AD_BAD_CERTIFICATE:
    case SSL_AD_UNSUPPORTED_CERTIFICATE:
    case SSL_AD_CERTIFICATE_REVOKED:
    case SSL_AD_CERTIFICATE_EXPIRED:
    case SSL_AD_CERTIFICATE_UNKNOWN:
    case SSL_AD_UNKNOWN_CA:
    case SSL_AD_ACCESS_DENIED:
    case SSL_AD_DECRYPT_ERROR:
    case SSL_AD_CERTIFICATE_REQUIRED:
        c.tls->log_failure("the upstream refused the handshake: " + ec.message());
        return true;
    default:
        return false;
    }
}

} // namespace onceproxy::upstream
