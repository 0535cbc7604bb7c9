// onceproxy_floor_proxy: the least CPU a proxy that reads and writes each message once can
// spend per request on this machine, for bench/run.sh's `floor` and `floor_first` rows.
//
//   onceproxy_floor_proxy --upstream PORT --port-file FILE [--redis PORT]
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
//
// With --redis, the floor of a first execution: the same relay, plus what any proxy that makes
// a request take effect at most once through Redis must do for it, and nothing else. For each
// request (read whole, as above): the Idempotency-Key line is found (no other parsing), the key
// and the request are hashed (SHA-256: the store key and the fingerprint), the key is claimed
// (SET key value NX PX lease GET, onceproxy's claim), and only on its reply is the request
// forwarded; the answer is recorded (SET key answer XX PX ttl: the completion without the
// fencing script) and only on that reply is it written to the client. Redis commands go out on
// one connection, everything queued while handling one epoll_wait's events in one write, and
// their replies come back in order. It checks nothing (a key already taken is forwarded all the
// same); its CPU per request is the system calls and the copies a first execution cannot avoid.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
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

/// A blocking connection to 127.0.0.1:port, made non-blocking once connected; -1 on failure.
int connect_local(int port) {
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

/// SHA-256 of `data` as 64 hex digits appended to `out`.
void append_sha256_hex(std::string& out, std::string_view data) {
    static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (md == nullptr || EVP_Digest(data.data(), data.size(), d, &len, md, nullptr) != 1) {
        fail("SHA-256");
    }
    static constexpr char hex[] = "0123456789abcdef";
    for (unsigned int i = 0; i < len; ++i) {
        out += hex[d[i] >> 4];
        out += hex[d[i] & 15];
    }
}

/// Appends a RESP command (an array of bulk strings) to `out`.
void append_command(std::string& out, std::initializer_list<std::string_view> args) {
    out += '*';
    out += std::to_string(args.size());
    out += "\r\n";
    for (const auto a : args) {
        out += '$';
        out += std::to_string(a.size());
        out += "\r\n";
        out += a;
        out += "\r\n";
    }
}

/// The length of the first whole RESP2 reply in `in` (a simple string, error, integer or bulk
/// string: what SET answers), 0 when it is not whole yet.
std::size_t reply_length(std::string_view in) {
    const auto eol = in.find("\r\n");
    if (eol == std::string_view::npos) {
        return 0;
    }
    if (in[0] != '$') {
        return eol + 2;
    }
    const long n = std::strtol(in.data() + 1, nullptr, 10);
    if (n < 0) {
        return eol + 2; // nil
    }
    const auto whole = eol + 2 + static_cast<std::size_t>(n) + 2;
    return in.size() >= whole ? whole : 0;
}

/// The guarded floor's state (--redis): the Redis connection, what is queued for it, and the
/// requests whose command awaits its reply.
struct guard {
    enum class phase { claim, complete };
    struct waiting {
        int client;
        phase step;
    };
    struct exchange {
        std::string key;     ///< the store key: a hash of the Idempotency-Key
        std::string request; ///< held until the claim's reply
        std::string answer;  ///< held until the completion's reply
    };

    int redis = -1;
    std::string out;                 ///< commands queued, written once per epoll_wait round
    std::string in;                  ///< replies read, not yet matched
    std::deque<waiting> fifo;        ///< one per command written or queued, in order
    std::vector<exchange> exchanges; ///< by client descriptor
    std::uint64_t owner = 0;

    exchange& of(int client) {
        if (exchanges.size() <= static_cast<std::size_t>(client)) {
            exchanges.resize(static_cast<std::size_t>(client) * 2 + 1);
        }
        return exchanges[static_cast<std::size_t>(client)];
    }

    /// A request read from `client`: hashed and claimed.
    void on_request(int client, std::string_view request) {
        static constexpr std::string_view line = "\r\nIdempotency-Key: ";
        auto& x = of(client);
        std::string_view key;
        if (const auto at = request.find(line); at != std::string_view::npos) {
            key = request.substr(at + line.size());
            key = key.substr(0, key.find("\r\n"));
        }
        x.key.assign("op:");
        append_sha256_hex(x.key, key);
        std::string value = "1;" + std::to_string(++owner) + ";";
        append_sha256_hex(value, request); // the fingerprint, in the claim as onceproxy's
        x.request.assign(request);
        append_command(out, {"SET", x.key, value, "NX", "PX", "30000", "GET"});
        fifo.push_back({client, phase::claim});
    }

    /// The upstream's answer to `client`'s request: recorded.
    void on_answer(int client, std::string_view answer) {
        auto& x = of(client);
        x.answer.assign(answer);
        append_command(out, {"SET", x.key, x.answer, "XX", "PX", "3600000"});
        fifo.push_back({client, phase::complete});
    }

    /// Writes what is queued (once per round of events).
    void flush() {
        if (out.empty()) {
            return;
        }
        if (::send(redis, out.data(), out.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(out.size())) {
            fail("send to Redis"); // a loopback socket takes a round's commands whole
        }
        out.clear();
    }

    /// Replies read, each matched to the command it answers: send_to(client, step, bytes)
    /// passes the held request on (a claim's reply) or the held answer back (a completion's).
    template <class Send>
    void on_replies(std::string_view bytes, Send&& send_to) {
        in.append(bytes);
        std::size_t used = 0;
        while (used < in.size()) {
            const auto n = reply_length(std::string_view(in).substr(used));
            if (n == 0) {
                break;
            }
            if (in[used] == '-' || fifo.empty()) {
                errno = EPROTO;
                fail("Redis reply");
            }
            const auto w = fifo.front();
            fifo.pop_front();
            used += n;
            auto& x = of(w.client);
            send_to(w.client, w.step, w.step == phase::claim ? x.request : x.answer);
        }
        in.erase(0, used);
    }
};

} // namespace

int main(int argc, char** argv) {
    int upstream_port = 0;
    int redis_port = 0;
    std::string port_file;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--upstream") {
            upstream_port = std::atoi(argv[i + 1]);
        } else if (a == "--port-file") {
            port_file = argv[i + 1];
        } else if (a == "--redis") {
            redis_port = std::atoi(argv[i + 1]);
        }
    }
    if (upstream_port <= 0 || port_file.empty()) {
        std::fprintf(stderr, "usage: onceproxy_floor_proxy --upstream PORT --port-file FILE "
                             "[--redis PORT]\n");
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

    const int ep = ::epoll_create1(0);
    auto watch = [&](int fd) {
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.fd = fd;
        ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    };
    watch(listener);

    guard g;
    const bool guarded = redis_port > 0;
    if (guarded) {
        g.redis = connect_local(redis_port);
        if (g.redis < 0) {
            fail("connect to Redis");
        }
        watch(g.redis);
    }
    if (FILE* f = std::fopen(port_file.c_str(), "w")) {
        std::fprintf(f, "%d\n", ntohs(a.sin_port));
        std::fclose(f);
    } else {
        fail("port file");
    }

    // peer[fd]: the other side of fd's pair, -1 when fd is not a relayed connection;
    // is_client[fd]: fd is the client side of its pair.
    std::vector<int> peer(1024, -1);
    std::vector<char> is_client(1024, 0);
    auto pair_up = [&](int c, int u) {
        const auto need = static_cast<std::size_t>(c > u ? c : u) + 1;
        if (peer.size() < need) {
            peer.resize(need * 2, -1);
            is_client.resize(need * 2, 0);
        }
        peer[static_cast<std::size_t>(c)] = u;
        peer[static_cast<std::size_t>(u)] = c;
        is_client[static_cast<std::size_t>(c)] = 1;
        is_client[static_cast<std::size_t>(u)] = 0;
        watch(c);
        watch(u);
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
    // A loopback socket's send buffer takes a request or an answer whole; a short write (a
    // stalled peer) ends the pair rather than buffering.
    auto send_whole = [&](int to, std::string_view bytes) {
        if (to >= 0 && ::send(to, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
                           static_cast<ssize_t>(bytes.size())) {
            close_pair(to);
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
                    const int u = connect_local(upstream_port);
                    if (u < 0) {
                        ::close(c);
                        continue;
                    }
                    pair_up(c, u);
                }
                continue;
            }
            if (guarded && fd == g.redis) {
                const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
                    continue;
                }
                if (got <= 0) {
                    fail("Redis connection");
                }
                g.on_replies({buf, static_cast<std::size_t>(got)},
                             [&](int client, guard::phase step, std::string_view bytes) {
                                 if (static_cast<std::size_t>(client) >= peer.size() ||
                                     peer[static_cast<std::size_t>(client)] < 0) {
                                     return; // the client went away meanwhile
                                 }
                                 send_whole(step == guard::phase::claim
                                                ? peer[static_cast<std::size_t>(client)]
                                                : client,
                                            bytes);
                             });
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
            const std::string_view bytes(buf, static_cast<std::size_t>(got));
            const int to = peer[static_cast<std::size_t>(fd)];
            if (!guarded) {
                send_whole(to, bytes);
            } else if (is_client[static_cast<std::size_t>(fd)] != 0) {
                g.on_request(fd, bytes);
            } else {
                g.on_answer(to, bytes);
            }
        }
        if (guarded) {
            g.flush();
        }
    }
}
