#include "onceproxy/wire/stream.hpp"

#include "onceproxy/asio/use_tuple.hpp"

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <array>

namespace onceproxy::wire {

namespace net = boost::asio;
namespace ssl = net::ssl;

struct stream::tls_state {
    tls_state(net::ip::tcp::socket& sock, std::shared_ptr<ssl::context> c)
        : ctx(std::move(c)), stream(sock, *ctx) {}

    std::shared_ptr<ssl::context> ctx; ///< outlives the stream: a rotation replaces the current one
    ssl::stream<net::ip::tcp::socket&> stream;
    std::array<char, max_gather> gather{};
};

stream::stream(net::ip::tcp::socket sock) : sock_(std::move(sock)) {}

stream::stream(net::ip::tcp::socket sock, std::shared_ptr<ssl::context> ctx)
    : sock_(std::move(sock)), tls_(std::make_unique<tls_state>(sock_, std::move(ctx))) {}

stream::~stream() = default;

void stream::use_tls(std::shared_ptr<ssl::context> ctx) {
    tls_ = std::make_unique<tls_state>(sock_, std::move(ctx));
}

ssl_st* stream::native_handle() noexcept {
    return tls_ == nullptr ? nullptr : tls_->stream.native_handle();
}

net::awaitable<boost::system::error_code> stream::async_handshake(role r) {
    if (tls_ == nullptr) {
        co_return boost::system::error_code{};
    }
    auto [ec] = co_await tls_->stream.async_handshake(
        r == role::server ? ssl::stream_base::server : ssl::stream_base::client, use_tuple);
    co_return ec;
}

net::awaitable<void> stream::async_shutdown() {
    if (tls_ == nullptr || !sock_.is_open() || cut_) {
        co_return;
    }
    // One-way (RFC 8446 §6.1 lets the closing side go without the peer's close_notify): marked
    // as received, SSL_shutdown sends ours and completes once it is written, so a peer that
    // keeps the connection open (an idle pooled one, at a drain) costs no wait.
    SSL* ssl = tls_->stream.native_handle();
    SSL_set_shutdown(ssl, SSL_get_shutdown(ssl) | SSL_RECEIVED_SHUTDOWN);
    auto [ec] = co_await tls_->stream.async_shutdown(use_tuple);
    (void)ec; // the peer closing first, or cutting the connection, ends it just as well
}

void stream::close() noexcept {
    boost::system::error_code ignored;
    sock_.shutdown(net::ip::tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
}

void stream::verify_host_name(const std::string& host) {
    if (tls_ != nullptr) {
        tls_->stream.set_verify_callback(ssl::host_name_verification(host));
    }
}

std::string_view stream::alpn() const {
    if (tls_ == nullptr) {
        return {};
    }
    SSL* ssl = const_cast<ssl::stream<net::ip::tcp::socket&>&>(tls_->stream).native_handle();
    const unsigned char* proto = nullptr;
    unsigned int len = 0;
    SSL_get0_alpn_selected(ssl, &proto, &len);
    return proto == nullptr ? std::string_view()
                            : std::string_view(reinterpret_cast<const char*>(proto), len);
}

std::string stream::verified_peer_subject() const {
    if (tls_ == nullptr) {
        return {};
    }
    SSL* ssl = const_cast<ssl::stream<net::ip::tcp::socket&>&>(tls_->stream).native_handle();
    X509* peer = SSL_get0_peer_certificate(ssl);
    if (peer == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) {
        return {};
    }
    BIO* bio = BIO_new(BIO_s_mem());
    if (bio == nullptr) {
        return {};
    }
    std::string out;
    if (X509_NAME_print_ex(bio, X509_get_subject_name(peer), 0, XN_FLAG_RFC2253) >= 0) {
        char* data = nullptr;
        const long n = BIO_get_mem_data(bio, &data);
        if (n > 0 && data != nullptr) {
            out.assign(data, static_cast<std::size_t>(n));
        }
    }
    BIO_free(bio);
    return out;
}

char* stream::gather_buffer() noexcept {
    return tls_->gather.data();
}

void stream::tls_read_some(net::mutable_buffer b, read_handler h) {
    tls_->stream.async_read_some(b, std::move(h));
}

void stream::tls_write_some(net::const_buffer b, write_handler h) {
    tls_->stream.async_write_some(b, std::move(h));
}

} // namespace onceproxy::wire
