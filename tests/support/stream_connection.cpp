#include "support/stream_connection.hpp"

#include "support/http_client.hpp"

#include <boost/beast/core/string.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace onceproxy::test {

namespace {

using clock = std::chrono::steady_clock;

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
        s.remove_suffix(1);
    }
    return s;
}

int millis_left(clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1'000'000));
}

/// "Name: value" lines of a header or trailer block (without the final empty line).
header_list parse_fields(std::string_view block) {
    header_list out;
    while (!block.empty()) {
        const auto eol = block.find("\r\n");
        const std::string_view line = block.substr(0, eol);
        block = eol == std::string_view::npos ? std::string_view{} : block.substr(eol + 2);
        const auto colon = line.find(':');
        if (colon == std::string_view::npos) {
            continue;
        }
        out.emplace_back(std::string(line.substr(0, colon)),
                         std::string(trim(line.substr(colon + 1))));
    }
    return out;
}

std::uint64_t status_file_kib(int pid, std::string_view key) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.starts_with(key) && line.size() > key.size() && line[key.size()] == ':') {
            return std::stoull(line.substr(key.size() + 1));
        }
    }
    return 0;
}

} // namespace

void fnv1a::update(std::string_view bytes) noexcept {
    std::uint64_t h = hash_;
    for (const char c : bytes) {
        h ^= static_cast<unsigned char>(c);
        h *= 1099511628211ULL;
    }
    hash_ = h;
}

std::string fnv1a::hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (int shift = 60; shift >= 0; shift -= 4) {
        out += digits[(hash_ >> shift) & 0xf];
    }
    return out;
}

std::string response_head::header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
        if (boost::beast::iequals(n, name)) {
            return v;
        }
    }
    return {};
}

bool response_head::has_header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
        if (boost::beast::iequals(n, name)) {
            return true;
        }
    }
    return false;
}

stream_connection::stream_connection(unsigned short port) : fd_(connect_loopback(port)) {
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

stream_connection::~stream_connection() {
    if (fd_ >= 0) {
        ::close(fd_);
    }
}

bool stream_connection::send(std::string_view bytes, std::chrono::milliseconds timeout) {
    while (!bytes.empty()) {
        const auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n > 0) {
            bytes.remove_prefix(static_cast<std::size_t>(n));
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return false; // reset or closed
        }
        // The timeout runs from the last progress: a slow but moving peer is fine.
        pollfd p{fd_, POLLOUT, 0};
        if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) {
            return false;
        }
        if ((p.revents & (POLLERR | POLLHUP)) != 0 && (p.revents & POLLOUT) == 0) {
            return false;
        }
    }
    return true;
}

void stream_connection::shutdown_send() {
    ::shutdown(fd_, SHUT_WR);
}

bool stream_connection::fill(clock::time_point deadline) {
    if (eof_) {
        return false;
    }
    if (pos_ > 0 && pos_ == buf_.size()) {
        buf_.clear();
        pos_ = 0;
    } else if (pos_ > (std::size_t{1} << 20)) {
        buf_.erase(0, pos_);
        pos_ = 0;
    }
    for (;;) {
        char tmp[256 * 1024];
        const auto n = ::recv(fd_, tmp, sizeof tmp, 0);
        if (n > 0) {
            buf_.append(tmp, static_cast<std::size_t>(n));
            return true;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            eof_ = true;
            return false;
        }
        const int left = millis_left(deadline);
        if (left == 0) {
            return false;
        }
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, left) <= 0) {
            return false;
        }
    }
}

void stream_connection::consume(std::size_t n) {
    pos_ += n;
}

std::optional<response_head> stream_connection::read_head(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    std::size_t end = std::string_view::npos;
    while ((end = pending().find("\r\n\r\n")) == std::string_view::npos) {
        if (pending().size() > 256 * 1024 || !fill(deadline)) {
            return std::nullopt;
        }
    }
    response_head h;
    h.raw = std::string(pending().substr(0, end + 4));
    consume(end + 4);
    const std::string_view text = h.raw;
    const auto eol = text.find("\r\n");
    const std::string_view status_line = text.substr(0, eol);
    if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12) {
        return std::nullopt;
    }
    h.version = status_line[7] == '0' ? 10 : 11;
    unsigned code = 0;
    const auto res = std::from_chars(status_line.data() + 9, status_line.data() + 12, code);
    if (res.ec != std::errc{}) {
        return std::nullopt;
    }
    h.status = code;
    h.headers = parse_fields(text.substr(eol + 2, text.size() - eol - 2 - 2));
    return h;
}

void stream_connection::begin_body(const response_head& head, bool head_request) {
    body_ = body_result{};
    remaining_ = 0;
    const auto te = head.header("Transfer-Encoding");
    if (head_request || head.status < 200 || head.status == 204 || head.status == 304) {
        body_.framing = body_framing::none;
        body_state_ = state::done;
        body_.complete = true;
    } else if (!te.empty()) {
        // Only chunked as the final coding is framing the client can use (RFC 9112 §6.3).
        const auto last = te.substr(te.rfind(',') == std::string::npos ? 0 : te.rfind(',') + 1);
        if (boost::beast::iequals(trim(last), "chunked")) {
            body_.framing = body_framing::chunked;
            body_state_ = state::chunk_size;
        } else {
            body_.framing = body_framing::close;
            body_state_ = state::until_close;
        }
    } else if (head.has_header("Content-Length")) {
        body_.framing = body_framing::content_length;
        remaining_ = std::stoull(head.header("Content-Length"));
        body_state_ = remaining_ == 0 ? state::done : state::length;
        body_.complete = remaining_ == 0;
    } else {
        body_.framing = body_framing::close;
        body_state_ = state::until_close;
    }
}

void stream_connection::decode(const std::function<void(std::string_view)>& sink) {
    for (;;) {
        const std::string_view in = pending();
        switch (body_state_) {
        case state::idle:
        case state::done:
            return;
        case state::length:
        case state::until_close: {
            if (in.empty()) {
                return;
            }
            const auto n =
                body_state_ == state::length
                    ? static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in.size()))
                    : in.size();
            sink(in.substr(0, n));
            body_.bytes += n;
            consume(n);
            if (body_state_ == state::length) {
                remaining_ -= n;
                if (remaining_ == 0) {
                    body_state_ = state::done;
                    body_.complete = true;
                }
            }
            break;
        }
        case state::chunk_size: {
            const auto eol = in.find("\r\n");
            if (eol == std::string_view::npos) {
                if (in.size() > 4096) {
                    body_.framing_error = true;
                    body_state_ = state::done;
                }
                return;
            }
            const auto line = in.substr(0, eol);
            const auto digits = trim(line.substr(0, line.find(';')));
            std::uint64_t size = 0;
            const auto res =
                std::from_chars(digits.data(), digits.data() + digits.size(), size, 16);
            if (digits.empty() || res.ec != std::errc{} ||
                res.ptr != digits.data() + digits.size()) {
                body_.framing_error = true;
                body_state_ = state::done;
                return;
            }
            consume(eol + 2);
            if (size == 0) {
                body_state_ = state::trailer;
            } else {
                ++body_.chunks;
                remaining_ = size;
                body_state_ = state::chunk_data;
            }
            break;
        }
        case state::chunk_data: {
            if (in.empty()) {
                return;
            }
            const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in.size()));
            sink(in.substr(0, n));
            body_.bytes += n;
            consume(n);
            remaining_ -= n;
            if (remaining_ == 0) {
                body_state_ = state::chunk_crlf;
            }
            break;
        }
        case state::chunk_crlf:
            if (in.size() < 2) {
                return;
            }
            if (!in.starts_with("\r\n")) {
                body_.framing_error = true;
                body_state_ = state::done;
                return;
            }
            consume(2);
            body_state_ = state::chunk_size;
            break;
        case state::trailer: {
            // The trailer section ends with an empty line (RFC 9112 §7.1.2).
            if (in.starts_with("\r\n")) {
                consume(2);
                body_state_ = state::done;
                body_.complete = true;
                return;
            }
            const auto end = in.find("\r\n\r\n");
            if (end == std::string_view::npos) {
                return;
            }
            body_.raw_trailer = std::string(in.substr(0, end + 2));
            body_.trailers = parse_fields(in.substr(0, end));
            consume(end + 4);
            body_state_ = state::done;
            body_.complete = true;
            return;
        }
        }
    }
}

std::optional<std::string>
stream_connection::read_body_until(const std::function<bool(std::string_view)>& until,
                                   std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    std::string got;
    const auto sink = [&](std::string_view piece) { got.append(piece); };
    for (;;) {
        decode(sink);
        if (until(got) || body_state_ == state::done) {
            return got;
        }
        if (!fill(deadline)) {
            if (eof_ && body_state_ == state::until_close) {
                body_state_ = state::done;
                body_.complete = true;
                return got;
            }
            return std::nullopt;
        }
    }
}

body_result stream_connection::read_body(const std::function<void(std::string_view)>& sink,
                                         std::chrono::milliseconds idle_timeout,
                                         std::chrono::milliseconds total_timeout) {
    const auto end = clock::now() + total_timeout;
    for (;;) {
        decode(sink);
        if (body_state_ == state::done) {
            return body_;
        }
        if (!fill(std::min(end, clock::now() + idle_timeout))) {
            if (eof_ && body_state_ == state::until_close) {
                body_state_ = state::done;
                body_.complete = true;
            }
            return body_;
        }
    }
}

std::string stream_connection::read_raw(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    if (pending().empty() && !fill(deadline)) {
        return {};
    }
    std::string out(pending());
    consume(out.size());
    return out;
}

std::optional<std::string> stream_connection::read_exact(std::size_t n,
                                                         std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    while (pending().size() < n) {
        if (!fill(deadline)) {
            return std::nullopt;
        }
    }
    std::string out(pending().substr(0, n));
    consume(n);
    return out;
}

std::optional<std::string> stream_connection::read_raw_until(std::string_view needle,
                                                             std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    std::size_t at = std::string_view::npos;
    while ((at = pending().find(needle)) == std::string_view::npos) {
        if (!fill(deadline)) {
            return std::nullopt;
        }
    }
    std::string out(pending().substr(0, at + needle.size()));
    consume(out.size());
    return out;
}

bool stream_connection::wait_closed(std::chrono::milliseconds timeout) {
    const auto deadline = clock::now() + timeout;
    while (fill(deadline)) {
        consume(pending().size());
    }
    return eof_;
}

std::uint64_t rss_kib(int pid) {
    return status_file_kib(pid, "VmRSS");
}

std::uint64_t peak_rss_kib(int pid) {
    return status_file_kib(pid, "VmHWM");
}

std::vector<std::string> small_asan_quarantine() {
    std::string options = "ASAN_OPTIONS=";
    if (const char* existing = std::getenv("ASAN_OPTIONS"); existing != nullptr && *existing) {
        options += std::string(existing) + ":";
    }
    options += "quarantine_size_mb=8:thread_local_quarantine_size_kb=256";
    return {"/usr/bin/env", options};
}

bool reset_peak_rss(int pid) {
    std::ofstream out("/proc/" + std::to_string(pid) + "/clear_refs");
    out << "5";
    out.flush();
    return static_cast<bool>(out);
}

} // namespace onceproxy::test
