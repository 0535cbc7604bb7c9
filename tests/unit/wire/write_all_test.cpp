// wire::async_write_all over a real loopback connection: what the socket takes at once leaves
// without an operation, the rest when the peer reads; the peer receives every byte in order, and
// a connection the peer reset reports an error.

#include "onceproxy/wire/stream.hpp"

#include "support/run_awaitable.hpp"

#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>

namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

namespace {

/// A connected loopback pair: `ours` (as a wire::stream) and the peer's end.
struct connected_pair {
    explicit connected_pair(net::io_context& ioc) : peer(ioc), ours(tcp::socket(ioc)) {
        tcp::acceptor acc(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
        peer.connect(acc.local_endpoint());
        acc.accept(ours.socket());
    }
    tcp::socket peer;
    onceproxy::wire::stream ours;
};

/// `n` bytes that differ from one position to the next, so a reordering shows.
std::string pattern(std::size_t n, char seed) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) {
        s[i] = static_cast<char>(seed + static_cast<char>((i * 7 + i / 251) % 61));
    }
    return s;
}

} // namespace

TEST_SUITE("write all") {

    TEST_CASE("more than the socket takes at once: the rest goes when the peer reads, in order") {
        net::io_context ioc(1);
        connected_pair c(ioc);
        // Small buffers on both sides, so the kernel takes only part of the first attempt.
        c.ours.socket().set_option(net::socket_base::send_buffer_size(16 * 1024));
        c.peer.set_option(net::socket_base::receive_buffer_size(16 * 1024));
        const std::string head = pattern(3000, 'A');
        const std::string body = pattern(4 * 1024 * 1024, 'a');
        std::string received;
        // The peer starts reading only after a pause: the write has to wait for it.
        net::co_spawn(
            ioc,
            [&]() -> net::awaitable<void> {
                net::steady_timer pause(ioc, 50ms);
                co_await pause.async_wait(net::use_awaitable);
                std::array<char, 8192> buf{};
                while (received.size() < head.size() + body.size()) {
                    const auto n =
                        co_await c.peer.async_read_some(net::buffer(buf), net::use_awaitable);
                    received.append(buf.data(), n);
                }
            },
            net::detached);
        const std::array<net::const_buffer, 2> message{net::buffer(head), net::buffer(body)};
        const auto [ec, n] = onceproxy::test::run(
            ioc, onceproxy::wire::async_write_all(c.ours, message), std::chrono::seconds(20));
        CHECK_FALSE(ec);
        CHECK(n == head.size() + body.size());
        // The last bytes may still be on their way to the peer.
        ioc.restart();
        for (int i = 0; i < 2000 && received.size() < head.size() + body.size(); ++i) {
            ioc.run_for(10ms);
        }
        REQUIRE(received.size() == head.size() + body.size());
        CHECK(received.compare(0, head.size(), head) == 0);
        CHECK(received.compare(head.size(), body.size(), body) == 0);
    }

    TEST_CASE("a message the socket takes whole completes with its size") {
        net::io_context ioc(1);
        connected_pair c(ioc);
        const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        const std::array<net::const_buffer, 2> message{net::buffer(head), net::buffer("hello", 5)};
        const auto [ec, n] =
            onceproxy::test::run(ioc, onceproxy::wire::async_write_all(c.ours, message));
        CHECK_FALSE(ec);
        CHECK(n == head.size() + 5);
        std::string got(head.size() + 5, '\0');
        net::read(c.peer, net::buffer(got));
        CHECK(got == head + "hello");
    }

    TEST_CASE("a connection the peer reset reports an error") {
        net::io_context ioc(1);
        connected_pair c(ioc);
        // Closed with a reset (linger 0): the next writes fail rather than wait.
        c.peer.set_option(net::socket_base::linger(true, 0));
        c.peer.close();
        const std::string body = pattern(1024 * 1024, 'x');
        boost::system::error_code ec;
        for (int i = 0; i < 20 && !ec; ++i) { // the first write may still be taken
            std::tie(ec, std::ignore) = onceproxy::test::run(
                ioc, onceproxy::wire::async_write_all(c.ours, net::buffer(body)));
        }
        CHECK(ec);
    }
}
