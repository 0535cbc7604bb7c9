// onceproxy_floor_proxy: the least CPU a proxy that reads and writes each message once can
// spend per request on this machine, for bench/run.sh's `floor` row.
//
//   onceproxy_floor_proxy --upstream PORT --port-file FILE
//
// One thread, one level-triggered epoll loop. Each client connection gets its own upstream
// connection (opened when the client connects, kept for its life); every read on one side is
// written as it is to the other. No parsing, no header, no allocation per request: for a keep-alive
// client that sends a request and waits for its answer (wrk's GETs), that is one read and one write
// on each side per request, nginx's and onceproxy's system calls with nothing around them. It is
// not an HTTP proxy (it would pass anything, and relies on the client waiting for each answer); its
// CPU per request is what the kernel's side of a proxied request costs here when each message is
// read and written once, the floor under nginx's and onceproxy's figures (batching messages of
// several connections per system call, as io_uring can, would be another design). A bench tool: it
// connects to the upstream blocking, and an accept that fails for want of descriptors is retried on
// the next readiness. Listens on 127.0.0.1, an ephemeral port written to FILE.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "onceproxy_floor_proxy: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

/// A relayed connection: non-blocking, and every write goes out at once (as nginx's and
/// onceproxy's, TCP_NODELAY).
int relayed(int fd) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int connect_upstream(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (fd >= 0) {
            ::close(fd);
        }
        return -1;
    }
    return relayed(fd);
}

} // namespace

int main(int argc, char** argv) {
    int upstream_port = 0;
    std::string port_file;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--upstream") {
            upstream_port = std::atoi(argv[i + 1]);
        } else if (a == "--port-file") {
            port_file = argv[i + 1];
        }
    }
    if (upstream_port <= 0 || port_file.empty()) {
        std::fprintf(stderr, "usage: onceproxy_floor_proxy --upstream PORT --port-file FILE\n");
        return 2;
    }
    ::signal(SIGPIPE, SIG_IGN);

    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener, 1024) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        fail("listen");
    }
    ::fcntl(listener, F_SETFL, ::fcntl(listener, F_GETFL) | O_NONBLOCK);
    if (FILE* f = std::fopen(port_file.c_str(), "w")) {
        std::fprintf(f, "%d\n", ntohs(a.sin_port));
        std::fclose(f);
    } else {
        fail("port file");
    }

    const int ep = ::epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listener;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);

    // peer[fd]: the other side of fd's pair, -1 when fd is not a relayed connection.
    std::vector<int> peer(1024, -1);
    auto pair_up = [&](int x, int y) {
        const auto need = static_cast<std::size_t>(x > y ? x : y) + 1;
        if (peer.size() < need) {
            peer.resize(need * 2, -1);
        }
        peer[static_cast<std::size_t>(x)] = y;
        peer[static_cast<std::size_t>(y)] = x;
        for (const int fd : {x, y}) {
            epoll_event e{};
            e.events = EPOLLIN;
            e.data.fd = fd;
            ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
        }
    };
    auto close_pair = [&](int fd) {
        const int other = peer[static_cast<std::size_t>(fd)];
        for (const int x : {fd, other}) {
            if (x >= 0) {
                peer[static_cast<std::size_t>(x)] = -1;
                ::close(x); // also leaves the epoll set
            }
        }
    };

    static char buf[64 * 1024];
    epoll_event events[256];
    for (;;) {
        const int n = ::epoll_wait(ep, events, 256, -1);
        if (n < 0 && errno != EINTR) {
            fail("epoll_wait");
        }
        for (int i = 0; i < n; ++i) {
            const int fd = events[i].data.fd;
            if (fd == listener) {
                for (;;) {
                    const int c = ::accept4(listener, nullptr, nullptr, 0);
                    if (c < 0) {
                        break;
                    }
                    relayed(c);
                    const int u = connect_upstream(upstream_port);
                    if (u < 0) {
                        ::close(c);
                        continue;
                    }
                    pair_up(c, u);
                }
                continue;
            }
            if (static_cast<std::size_t>(fd) >= peer.size() ||
                peer[static_cast<std::size_t>(fd)] < 0) {
                continue; // closed earlier in this batch
            }
            const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
                continue;
            }
            if (got <= 0) {
                close_pair(fd);
                continue;
            }
            // A loopback socket's send buffer takes a request or an answer whole; a short
            // write (a stalled peer) ends the pair rather than buffering.
            const int to = peer[static_cast<std::size_t>(fd)];
            if (::send(to, buf, static_cast<std::size_t>(got), MSG_NOSIGNAL) != got) {
                close_pair(fd);
            }
        }
    }
}
