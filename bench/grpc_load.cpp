// onceproxy_grpc_load: a unary gRPC load generator for bench/run.sh's gRPC rows (h2c with prior
// knowledge, libnghttp2's client session on nonblocking sockets and poll, one thread).
//
//   onceproxy_grpc_load --port P [--host 127.0.0.1] [--path /bench.Payments/Charge]
//                       [--connections 2] [--streams 100] [--duration 10] [--message-bytes 64]
//                       [--key-prefix PREFIX | --key KEY] [--key-header idempotency-key]
//
// Each of --connections connections keeps --streams calls in flight for --duration seconds:
// POST PATH, content-type application/grpc, te: trailers, a body of one length-prefixed message
// of --message-bytes bytes. With --key-prefix every call carries a new key (PREFIX0, PREFIX1, ...:
// first executions on a guarded route), with --key every call the same one. Prints one JSON
// object: calls completed within the duration, calls/s, p50/p99 latency in ms, counts by HTTP
// status and by grpc-status (from the trailers, or from a trailers-only answer), and errors
// (streams reset, connections lost). Exits non-zero when no call completed.
#include <nghttp2/nghttp2.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using bench_clock = std::chrono::steady_clock;

struct options {
    std::string host = "127.0.0.1";
    int port = 0;
    std::string path = "/bench.Payments/Charge";
    int connections = 2;
    int streams = 100;
    double duration = 10;
    std::size_t message_bytes = 64;
    std::string key_prefix;
    std::string key;
    std::string key_header = "idempotency-key";
};

struct totals {
    std::vector<std::uint32_t> latencies_us;
    std::map<int, std::uint64_t> http_status;
    std::map<std::string, std::uint64_t> grpc_status;
    std::uint64_t errors = 0;
    std::uint64_t next_key = 0;
};

struct call {
    bench_clock::time_point start;
    int http_status = 0;
    std::string grpc_status;
    std::size_t sent = 0;
    std::string key;
};

struct connection {
    int fd = -1;
    nghttp2_session* session = nullptr;
    std::vector<std::uint8_t> out; // bytes nghttp2 produced that the socket did not take yet
    std::size_t out_pos = 0;
    int in_flight = 0;
    bool dead = false;
};

struct load {
    options opt;
    totals tot;
    std::string body;
    std::string authority;
    bench_clock::time_point deadline;
    bool stopping = false;
};

// The user data of a connection's nghttp2 session.
struct session_context {
    load* l;
    connection* conn;
};

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "onceproxy_grpc_load: %s\n", what.c_str());
    std::exit(2);
}

nghttp2_nv header(const std::string& name, const std::string& value) {
    return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
            reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(),
            value.size(), NGHTTP2_NV_FLAG_NONE};
}

ssize_t read_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length,
                  std::uint32_t* flags, nghttp2_data_source* source, void* user) {
    const load* l = static_cast<session_context*>(user)->l;
    auto* c = static_cast<call*>(source->ptr);
    const std::size_t n = std::min(length, l->body.size() - c->sent);
    std::memcpy(buf, l->body.data() + c->sent, n);
    c->sent += n;
    if (c->sent == l->body.size())
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
}

void submit_call(load& l, connection& conn) {
    auto* c = new call;
    c->start = bench_clock::now();
    if (!l.opt.key_prefix.empty()) {
        c->key = l.opt.key_prefix + std::to_string(l.tot.next_key++);
    } else {
        c->key = l.opt.key;
    }
    static const std::string method = ":method", post = "POST", scheme = ":scheme", http = "http",
                             authority = ":authority", path = ":path", ctype = "content-type",
                             grpc = "application/grpc", te = "te", trailers = "trailers";
    std::vector<nghttp2_nv> nva = {
        header(method, post),     header(scheme, http), header(authority, l.authority),
        header(path, l.opt.path), header(ctype, grpc),  header(te, trailers)};
    if (!c->key.empty())
        nva.push_back(header(l.opt.key_header, c->key));
    nghttp2_data_provider provider{};
    provider.source.ptr = c;
    provider.read_callback = read_body;
    const std::int32_t id =
        nghttp2_submit_request(conn.session, nullptr, nva.data(), nva.size(), &provider, c);
    if (id < 0) {
        delete c;
        conn.dead = true;
        ++l.tot.errors;
        return;
    }
    ++conn.in_flight;
}

int on_header(nghttp2_session* session, const nghttp2_frame* frame, const std::uint8_t* name,
              std::size_t namelen, const std::uint8_t* value, std::size_t valuelen, std::uint8_t,
              void*) {
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    auto* c =
        static_cast<call*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
    if (c == nullptr)
        return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") {
        c->http_status = std::atoi(std::string(v).c_str());
    } else if (n == "grpc-status") {
        c->grpc_status = std::string(v);
    }
    return 0;
}

int on_data(nghttp2_session*, std::uint8_t, std::int32_t, const std::uint8_t*, std::size_t, void*) {
    return 0; // the answer's message is not looked at: only its status counts
}

int on_close(nghttp2_session* session, std::int32_t stream_id, std::uint32_t error_code,
             void* user) {
    auto* ctx = static_cast<session_context*>(user);
    auto* c = static_cast<call*>(nghttp2_session_get_stream_user_data(session, stream_id));
    if (c == nullptr)
        return 0;
    load& l = *ctx->l;
    const auto now = bench_clock::now();
    if (now <= l.deadline) {
        if (error_code != NGHTTP2_NO_ERROR || c->http_status == 0) {
            ++l.tot.errors;
        } else {
            const auto us =
                std::chrono::duration_cast<std::chrono::microseconds>(now - c->start).count();
            l.tot.latencies_us.push_back(static_cast<std::uint32_t>(us));
            ++l.tot.http_status[c->http_status];
            ++l.tot.grpc_status[c->grpc_status.empty() ? "none" : c->grpc_status];
        }
    }
    delete c;
    --ctx->conn->in_flight;
    if (!l.stopping && now < l.deadline)
        submit_call(l, *ctx->conn);
    return 0;
}

int connect_to(const options& opt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        fail("socket: " + std::string(std::strerror(errno)));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(opt.port));
    if (::inet_pton(AF_INET, opt.host.c_str(), &addr.sin_addr) != 1)
        fail("bad --host " + opt.host);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        fail("connect to " + opt.host + ":" + std::to_string(opt.port) + ": " +
             std::strerror(errno));
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

// Moves what nghttp2 wants to send into the socket, as far as it takes it.
void flush(connection& conn) {
    for (;;) {
        if (conn.out_pos == conn.out.size()) {
            conn.out.clear();
            conn.out_pos = 0;
            const std::uint8_t* data = nullptr;
            const ssize_t n = nghttp2_session_mem_send(conn.session, &data);
            if (n < 0) {
                conn.dead = true;
                return;
            }
            if (n == 0)
                return;
            conn.out.assign(data, data + n);
        }
        const ssize_t w = ::send(conn.fd, conn.out.data() + conn.out_pos,
                                 conn.out.size() - conn.out_pos, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn.dead = true;
            return;
        }
        conn.out_pos += static_cast<std::size_t>(w);
    }
}

void receive(connection& conn) {
    std::uint8_t buf[65536];
    for (;;) {
        const ssize_t n = ::recv(conn.fd, buf, sizeof buf, 0);
        if (n == 0) {
            conn.dead = true;
            return;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn.dead = true;
            return;
        }
        if (nghttp2_session_mem_recv(conn.session, buf, static_cast<std::size_t>(n)) < 0) {
            conn.dead = true;
            return;
        }
    }
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc)
            fail("missing value after " + a);
        const std::string v = argv[++i];
        if (a == "--host")
            o.host = v;
        else if (a == "--port")
            o.port = std::atoi(v.c_str());
        else if (a == "--path")
            o.path = v;
        else if (a == "--connections")
            o.connections = std::atoi(v.c_str());
        else if (a == "--streams")
            o.streams = std::atoi(v.c_str());
        else if (a == "--duration")
            o.duration = std::atof(v.c_str());
        else if (a == "--message-bytes")
            o.message_bytes = std::strtoul(v.c_str(), nullptr, 10);
        else if (a == "--key-prefix")
            o.key_prefix = v;
        else if (a == "--key")
            o.key = v;
        else if (a == "--key-header")
            o.key_header = v;
        else
            fail("unknown option " + a);
    }
    if (o.port <= 0 || o.connections < 1 || o.streams < 1 || o.duration <= 0) {
        fail("need --port, and --connections, --streams, --duration above 0");
    }
    return o;
}

double percentile_ms(const std::vector<std::uint32_t>& sorted, double p) {
    if (sorted.empty())
        return 0;
    const auto i = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1));
    return sorted[i] / 1000.0;
}

} // namespace

int main(int argc, char** argv) {
    load l;
    l.opt = parse(argc, argv);
    l.authority = l.opt.host + ":" + std::to_string(l.opt.port);
    // One gRPC message: the 5-byte prefix (uncompressed, big-endian length), then the bytes.
    const auto n = static_cast<std::uint32_t>(l.opt.message_bytes);
    l.body = {'\0', static_cast<char>(n >> 24), static_cast<char>(n >> 16),
              static_cast<char>(n >> 8), static_cast<char>(n)};
    for (std::size_t i = 0; i < l.opt.message_bytes; ++i)
        l.body += static_cast<char>('a' + i % 26);

    nghttp2_session_callbacks* cbs = nullptr;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);

    std::vector<connection> conns(static_cast<std::size_t>(l.opt.connections));
    std::vector<session_context> contexts(conns.size());
    for (std::size_t i = 0; i < conns.size(); ++i) {
        conns[i].fd = connect_to(l.opt);
        contexts[i] = {&l, &conns[i]};
        nghttp2_session_client_new(&conns[i].session, cbs, &contexts[i]);
        const nghttp2_settings_entry settings[] = {
            {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
            {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (1 << 20)},
        };
        nghttp2_submit_settings(conns[i].session, NGHTTP2_FLAG_NONE, settings, 2);
    }
    const auto start = bench_clock::now();
    l.deadline = start + std::chrono::microseconds(static_cast<long>(l.opt.duration * 1e6));
    for (auto& conn : conns) {
        for (int s = 0; s < l.opt.streams; ++s)
            submit_call(l, conn);
        flush(conn);
    }
    // Past the deadline, the calls in flight get 2 s to end (they are not counted).
    const auto hard_end = l.deadline + std::chrono::seconds(2);
    std::vector<pollfd> fds(conns.size());
    for (;;) {
        const auto now = bench_clock::now();
        if (now >= l.deadline)
            l.stopping = true;
        bool busy = false;
        for (std::size_t i = 0; i < conns.size(); ++i) {
            auto& conn = conns[i];
            fds[i] = {conn.fd, 0, 0};
            if (conn.dead || (l.stopping && conn.in_flight == 0)) {
                fds[i].fd = -1;
                continue;
            }
            busy = true;
            fds[i].events = POLLIN;
            if (conn.out_pos < conn.out.size() || nghttp2_session_want_write(conn.session)) {
                fds[i].events |= POLLOUT;
            }
        }
        if (!busy || now >= hard_end)
            break;
        ::poll(fds.data(), fds.size(), 50);
        for (std::size_t i = 0; i < conns.size(); ++i) {
            auto& conn = conns[i];
            if (fds[i].fd < 0)
                continue;
            if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
                receive(conn);
            if (!conn.dead)
                flush(conn);
        }
    }
    const double elapsed =
        std::chrono::duration<double>(std::min(bench_clock::now(), l.deadline) - start).count();
    for (auto& conn : conns) {
        if (conn.in_flight > 0 && conn.dead)
            l.tot.errors += static_cast<std::uint64_t>(conn.in_flight);
        nghttp2_session_del(conn.session);
        ::close(conn.fd);
    }
    nghttp2_session_callbacks_del(cbs);

    auto& lat = l.tot.latencies_us;
    std::sort(lat.begin(), lat.end());
    std::printf("{\"calls\": %zu, \"seconds\": %.3f, \"rps\": %.1f, \"p50_ms\": %.3f, "
                "\"p99_ms\": %.3f, \"errors\": %llu, \"http_status\": {",
                lat.size(), elapsed, elapsed > 0 ? static_cast<double>(lat.size()) / elapsed : 0.0,
                percentile_ms(lat, 0.50), percentile_ms(lat, 0.99),
                static_cast<unsigned long long>(l.tot.errors));
    const char* sep = "";
    for (const auto& [status, count] : l.tot.http_status) {
        std::printf("%s\"%d\": %llu", sep, status, static_cast<unsigned long long>(count));
        sep = ", ";
    }
    std::printf("}, \"grpc_status\": {");
    sep = "";
    for (const auto& [status, count] : l.tot.grpc_status) {
        std::printf("%s\"%s\": %llu", sep, status.c_str(), static_cast<unsigned long long>(count));
        sep = ", ";
    }
    std::printf("}}\n");
    return lat.empty() ? 1 : 0;
}
