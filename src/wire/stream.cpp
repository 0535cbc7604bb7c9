#include "onceproxy/wire/stream.hpp"

#include "onceproxy/asio/use_tuple.hpp"

#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/reactor.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/detail/socket_ops.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>
#include <memory>
#include <type_traits>

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

namespace {

namespace ad = net::detail;

// plain_read works with Asio's reactor itself, which the project builds with epoll (not
// io_uring): another reactor would need another operation.
static_assert(std::is_same_v<ad::reactor, ad::epoll_reactor>);

/// The socket's state inside Asio (descriptor, non-blocking flags, the reactor's registration).
struct socket_access : net::ip::tcp::socket {
    static auto& implementation(net::ip::tcp::socket& s) {
        return (s.*&socket_access::impl_).get_implementation();
    }
};

/// One read as the reactor performs it, like Asio's own receive operation (registered once,
/// edge-triggered; tried at once, then again at each readiness of the socket), with two
/// differences: it notes whether the read drained the socket, and with `skip_first` set while
/// it starts it does not try at once but waits for the next readiness (async_read_next).
class recv_op : public ad::reactor_op {
public:
    recv_op(int fd, net::mutable_buffer b, bool& drained, stream::read_handler h)
        : ad::reactor_op(boost::system::error_code(), &recv_op::do_perform, &recv_op::do_complete),
          fd_(fd), buffer_(b), drained_(drained), handler_(std::move(h)) {}

    bool skip_first = false;

private:
    // Runs at the start and at each readiness, never after the socket closed (its operations
    // are aborted first), so the stream that owns `drained_` is alive.
    static status do_perform(ad::reactor_op* base) {
        auto* o = static_cast<recv_op*>(base);
        if (o->skip_first) {
            return not_done; // the attempt at the start (see plain_read)
        }
        for (;;) {
            const auto n = ::recv(o->fd_, o->buffer_.data(), o->buffer_.size(), 0);
            if (n > 0) {
                o->bytes_transferred_ = static_cast<std::size_t>(n);
                o->drained_ = o->bytes_transferred_ < o->buffer_.size();
                return done;
            }
            if (n == 0) {
                o->ec_ = net::error::eof;
                o->drained_ = false;
                return done;
            }
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return not_done;
            }
            o->ec_ = boost::system::error_code(errno, boost::asio::error::get_system_category());
            o->drained_ = false;
            return done;
        }
    }

    // `owner` is null when the operation is destroyed unrun (the event loop is shut down).
    static void do_complete(void* owner, ad::operation* base, const boost::system::error_code&,
                            std::size_t) {
        std::unique_ptr<recv_op> o(static_cast<recv_op*>(base));
        if (owner == nullptr) {
            return;
        }
        auto h = std::move(o->handler_);
        const auto ec = o->ec_;
        const auto n = o->bytes_transferred_;
        o.reset();
        std::move(h)(ec, n);
    }

    int fd_;
    net::mutable_buffer buffer_;
    bool& drained_;
    stream::read_handler handler_;
};

} // namespace

void stream::plain_read(net::mutable_buffer b, bool next, read_handler h) {
    auto& impl = socket_access::implementation(sock_);
    boost::system::error_code ec;
    if (b.size() == 0 || impl.socket_ == ad::invalid_socket ||
        ((impl.state_ & ad::socket_ops::non_blocking) == 0 &&
         !ad::socket_ops::set_internal_non_blocking(impl.socket_, impl.state_, true, ec))) {
        // Nothing to read into, or a closed socket: the socket's own read says so as usual.
        sock_.async_read_some(b, std::move(h));
        return;
    }
    if (reactor_ == nullptr) {
        reactor_ = &net::use_service<ad::reactor>(
            net::query(sock_.get_executor(), net::execution::context));
    }
    auto* op = new recv_op(impl.socket_, b, drained_, std::move(h));
    // The attempt at the start is skipped while skip_first is set; every later one (at a
    // readiness) reads. The event loop is single-threaded: the operation cannot run in between.
    op->skip_first = next && drained_;
    reactor_->start_op(ad::reactor::read_op, impl.socket_, impl.reactor_data_, op, false, true);
    op->skip_first = false;
}

std::size_t stream::try_write(std::span<const net::const_buffer> buffers,
                              boost::system::error_code& ec) noexcept {
    ec = {};
    if (tls_ != nullptr || !sock_.is_open()) {
        return 0;
    }
    std::array<::iovec, 16> iov{};
    std::size_t n = 0;
    for (const auto& b : buffers) {
        if (b.size() != 0 && n < iov.size()) {
            iov[n++] = {const_cast<void*>(b.data()), b.size()};
        }
    }
    if (n == 0) {
        return 0;
    }
    ::msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n;
    for (;;) {
        const auto sent = ::sendmsg(sock_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent >= 0) {
            return static_cast<std::size_t>(sent);
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            ec = boost::system::error_code(errno, net::error::get_system_category());
        }
        return 0;
    }
}

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
