#include "tls_front.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <chrono>
#include <memory>

namespace onceproxy::test_upstream {

namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

struct relay {
    relay(tcp::socket s, ssl::context& ctx) : tls(std::move(s), ctx), plain(tls.get_executor()) {}
    ssl::stream<tcp::socket> tls;
    tcp::socket plain;

    void close() {
        boost::system::error_code ignored;
        tls.next_layer().shutdown(tcp::socket::shutdown_both, ignored);
        tls.next_layer().close(ignored);
        plain.shutdown(tcp::socket::shutdown_both, ignored);
        plain.close(ignored);
    }
};

net::awaitable<void> tls_to_plain(std::shared_ptr<relay> r) {
    std::array<char, 16 * 1024> buf{};
    for (;;) {
        auto [ec, n] = co_await r->tls.async_read_some(net::buffer(buf), use_tuple);
        if (ec) {
            break;
        }
        auto [wec, wn] = co_await net::async_write(r->plain, net::buffer(buf.data(), n), use_tuple);
        if (wec) {
            break;
        }
    }
    r->close();
}

net::awaitable<void> plain_to_tls(std::shared_ptr<relay> r) {
    std::array<char, 16 * 1024> buf{};
    for (;;) {
        auto [ec, n] = co_await r->plain.async_read_some(net::buffer(buf), use_tuple);
        if (ec) {
            // The session closed the connection: a clean TLS close, so the client sees EOF.
            auto [sec] = co_await r->tls.async_shutdown(use_tuple);
            (void)sec;
            break;
        }
        auto [wec, wn] = co_await net::async_write(r->tls, net::buffer(buf.data(), n), use_tuple);
        if (wec) {
            break;
        }
    }
    r->close();
}

net::awaitable<void> serve(tcp::socket socket, ssl::context& ctx, unsigned short plain_port) {
    auto r = std::make_shared<relay>(std::move(socket), ctx);
    net::steady_timer deadline(r->tls.get_executor(), std::chrono::seconds(5));
    deadline.async_wait([r](boost::system::error_code ec) {
        if (!ec) {
            r->close(); // a handshake that never completes
        }
    });
    auto [ec] = co_await r->tls.async_handshake(ssl::stream_base::server, use_tuple);
    deadline.cancel();
    if (ec) {
        tls_stats().failed.fetch_add(1);
        r->close();
        co_return;
    }
    tls_stats().handshakes.fetch_add(1);
    if (SSL_session_reused(r->tls.native_handle()) == 1) {
        tls_stats().resumed.fetch_add(1);
    }
    auto [cec] = co_await r->plain.async_connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), plain_port), use_tuple);
    if (cec) {
        r->close();
        co_return;
    }
    r->plain.set_option(tcp::no_delay(true), cec);
    r->tls.next_layer().set_option(tcp::no_delay(true), cec);
    net::co_spawn(r->tls.get_executor(), plain_to_tls(r), net::detached);
    co_await tls_to_plain(r);
}

} // namespace

tls_counters& tls_stats() {
    static tls_counters counters;
    return counters;
}

ssl::context make_tls_server_context(const std::string& cert_file, const std::string& key_file,
                                     const std::string& client_ca) {
    ssl::context ctx(ssl::context::tls_server);
    ctx.use_certificate_chain_file(cert_file);
    ctx.use_private_key_file(key_file, ssl::context::pem);
    static const unsigned char id[] = "onceproxy_test_upstream";
    SSL_CTX_set_session_id_context(ctx.native_handle(), id, sizeof id - 1);
    if (!client_ca.empty()) {
        ctx.load_verify_file(client_ca);
        ctx.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
    return ctx;
}

net::awaitable<void> tls_accept_loop(tcp::acceptor& acceptor, ssl::context& ctx,
                                     unsigned short plain_port) {
    net::steady_timer backoff(acceptor.get_executor());
    for (;;) {
        auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
        if (ec == net::error::operation_aborted || !acceptor.is_open()) {
            co_return;
        }
        if (ec) {
            backoff.expires_after(std::chrono::milliseconds(10));
            co_await backoff.async_wait(use_tuple);
            continue;
        }
        net::co_spawn(acceptor.get_executor(), serve(std::move(socket), ctx, plain_port),
                      net::detached);
    }
}

} // namespace onceproxy::test_upstream
