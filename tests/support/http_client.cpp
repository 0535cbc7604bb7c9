#include "support/http_client.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace onceproxy::test {

namespace bhttp = boost::beast::http;
using clock = std::chrono::steady_clock;

std::string http_response::header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
        if (boost::beast::iequals(n, name)) {
            return v;
        }
    }
    return {};
}

bool http_response::has_header(std::string_view name) const {
    return count(name) > 0;
}

std::size_t http_response::count(std::string_view name) const {
    std::size_t c = 0;
    for (const auto& [n, v] : headers) {
        if (boost::beast::iequals(n, name)) {
            ++c;
        }
    }
    return c;
}

std::string make_request(std::string_view method, std::string_view target,
                         const header_list& headers, std::string_view body) {
    std::string r;
    r.append(method).append(" ").append(target).append(" HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    bool has_length = false;
    for (const auto& [n, v] : headers) {
        r.append(n).append(": ").append(v).append("\r\n");
        has_length = has_length || boost::beast::iequals(n, "content-length") ||
                     boost::beast::iequals(n, "transfer-encoding");
    }
    if (!body.empty() && !has_length) {
        r.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
    }
    r.append("\r\n").append(body);
    return r;
}

int connect_loopback(unsigned short port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (fd >= 0) {
            ::close(fd);
        }
        throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + " failed");
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

http_client::http_client(unsigned short port) : fd_(connect_loopback(port)) {}

http_client::~http_client() {
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

void http_client::send_raw(std::string_view bytes) {
    while (!bytes.empty()) {
        const auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n <= 0) {
            throw std::runtime_error("send failed");
        }
        bytes.remove_prefix(static_cast<std::size_t>(n));
    }
}

bool http_client::fill(clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) {
        return false;
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) {
        return false;
    }
    char tmp[65536];
    const auto n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
        eof_ = true;
        return false;
    }
    buf_.append(tmp, static_cast<std::size_t>(n));
    return true;
}

std::optional<http_response> http_client::read_response(std::chrono::milliseconds timeout,
                                                        bool head) {
    const auto deadline = clock::now() + timeout;
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(256 * 1024 * 1024);
    parser.skip(head);
    for (;;) {
        if (!buf_.empty()) {
            boost::system::error_code ec;
            const auto used = parser.put(boost::asio::buffer(buf_.data(), buf_.size()), ec);
            buf_.erase(0, used);
            if (ec == bhttp::error::need_more) {
                ec = {};
            }
            if (ec) {
                throw std::runtime_error("bad response: " + ec.message());
            }
            if (parser.is_done()) {
                break;
            }
            if (used > 0) {
                continue;
            }
        }
        if (!fill(deadline)) {
            // Only a real close ends a body delimited by EOF: running out of time must not turn
            // an unframed keep-alive response into a success.
            if (eof_ && parser.is_header_done() && parser.need_eof()) {
                boost::system::error_code ec;
                parser.put_eof(ec);
                if (!ec) {
                    break;
                }
            }
            return std::nullopt;
        }
    }
    auto& m = parser.get();
    http_response r;
    r.status = m.result_int();
    for (const auto& f : m) {
        r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    }
    r.body = std::move(m.body());
    return r;
}

bool http_client::read_continue(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    while (buf_.find("\r\n\r\n") == std::string::npos) {
        if (!fill(deadline)) {
            return false;
        }
    }
    const auto end = buf_.find("\r\n\r\n");
    const bool ok = buf_.starts_with("HTTP/1.1 100");
    if (ok) {
        buf_.erase(0, end + 4);
    }
    return ok;
}

bool http_client::wait_closed(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    while (fill(deadline)) {
        // bytes after the response are kept in the buffer; keep reading until EOF or timeout
    }
    return eof_;
}

http_response http_client::request(std::string_view method, std::string_view target,
                                   const header_list& headers, std::string_view body) {
    send_raw(make_request(method, target, headers, body));
    auto r = read_response(std::chrono::seconds(15), method == "HEAD");
    if (!r) {
        throw std::runtime_error("no response to " + std::string(method) + " " +
                                 std::string(target));
    }
    return std::move(*r);
}

http_response fetch(unsigned short port, std::string_view method, std::string_view target,
                    const header_list& headers, std::string_view body) {
    http_client c(port);
    return c.request(method, target, headers, body);
}

} // namespace onceproxy::test
