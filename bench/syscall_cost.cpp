// onceproxy_syscall_cost: what one system call costs on this machine, for bench/run.sh's header.
//
//   onceproxy_syscall_cost [--calls 300000]
//
// Times, on one thread, calls that do no work to speak of: getppid(), a recv() on a connected
// loopback TCP socket with nothing to read (EAGAIN), the same with MSG_PEEK, and an
// EPOLL_CTL_MOD of that socket. What they cost is the price of entering and leaving the kernel,
// which a proxy pays for every read and write on top of the work the TCP stack does; on a
// virtual machine it can be ten times the bare-metal figure. Prints one JSON object, nanoseconds
// per call.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "onceproxy_syscall_cost: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

template <typename F>
double ns_per_call(long calls, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) {
        f(i);
    }
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(calls);
}

} // namespace

int main(int argc, char** argv) {
    long calls = 300000;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--calls" && i + 1 < argc) {
            calls = std::strtol(argv[++i], nullptr, 10);
        } else {
            std::fprintf(stderr, "usage: onceproxy_syscall_cost [--calls N]\n");
            return 2;
        }
    }
    if (calls <= 0) {
        std::fprintf(stderr, "onceproxy_syscall_cost: --calls must be positive\n");
        return 2;
    }

    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        fail("loopback listener");
    }
    const int client = ::socket(AF_INET, SOCK_STREAM, 0);
    if (client < 0 || ::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        fail("connect");
    }
    const int server = ::accept(listener, nullptr, nullptr);
    if (server < 0 || ::fcntl(server, F_SETFL, O_NONBLOCK) != 0) {
        fail("accept");
    }
    const int ep = ::epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    ev.data.fd = server;
    if (ep < 0 || ::epoll_ctl(ep, EPOLL_CTL_ADD, server, &ev) != 0) {
        fail("epoll");
    }

    char buf[512];
    const double getppid_ns = ns_per_call(calls, [](long) { (void)::getppid(); });
    const double recv_ns =
        ns_per_call(calls, [&](long) { (void)::recv(server, buf, sizeof buf, 0); });
    const double peek_ns =
        ns_per_call(calls, [&](long) { (void)::recv(server, buf, 1, MSG_PEEK | MSG_DONTWAIT); });
    const double ctl_ns = ns_per_call(calls, [&](long i) {
        ev.events = EPOLLIN | EPOLLET | ((i & 1) != 0 ? EPOLLOUT : 0u);
        (void)::epoll_ctl(ep, EPOLL_CTL_MOD, server, &ev);
    });
    std::printf("{\"calls\": %ld, \"getppid_ns\": %.0f, \"recv_eagain_ns\": %.0f, "
                "\"recv_peek_ns\": %.0f, \"epoll_ctl_mod_ns\": %.0f}\n",
                calls, getppid_ns, recv_ns, peek_ns, ctl_ns);
    ::close(ep);
    ::close(server);
    ::close(client);
    ::close(listener);
    return 0;
}
