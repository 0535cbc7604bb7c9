#pragma once
// A deliberately plain HTTP/1.1 client over a real loopback socket: it sends exactly the bytes a
// test gives it (malformed ones included) and parses responses with Beast. Every read is bounded.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onceproxy::test {

using header_list = std::vector<std::pair<std::string, std::string>>;

struct http_response {
    unsigned status = 0;
    header_list headers; ///< in order, names as sent
    std::string body;
    /// First value of a header (case-insensitive), "" when absent.
    std::string header(std::string_view name) const;
    bool has_header(std::string_view name) const;
    std::size_t count(std::string_view name) const;
};

/// A TCP connection to 127.0.0.1:`port` with TCP_NODELAY (a blocking socket; the caller owns
/// and closes it). Throws std::runtime_error when the connect fails.
int connect_loopback(unsigned short port);

/// Serialises a request. Adds Host and, when `body` is non-empty, Content-Length.
std::string make_request(std::string_view method, std::string_view target,
                         const header_list& headers = {}, std::string_view body = {});

class http_client {
public:
    explicit http_client(unsigned short port);
    ~http_client();
    http_client(const http_client&) = delete;
    http_client& operator=(const http_client&) = delete;

    void send_raw(std::string_view bytes);
    /// Reads one response; nullopt when the connection closed or the time ran out first.
    std::optional<http_response>
    read_response(std::chrono::milliseconds timeout = std::chrono::seconds(10), bool head = false);
    /// Reads the interim "100 Continue" line block; true if it arrived.
    bool read_continue(std::chrono::milliseconds timeout);
    /// True if the server closed the connection within `timeout` (EOF or reset).
    bool wait_closed(std::chrono::milliseconds timeout);
    /// send + read; throws std::runtime_error when no response comes.
    http_response request(std::string_view method, std::string_view target,
                          const header_list& headers = {}, std::string_view body = {});

private:
    bool fill(std::chrono::steady_clock::time_point deadline); ///< false on EOF/timeout
    int fd_ = -1;
    bool eof_ = false; ///< the server closed (or reset) the connection
    std::string buf_;
};

/// One request on a fresh connection.
http_response fetch(unsigned short port, std::string_view method, std::string_view target,
                    const header_list& headers = {}, std::string_view body = {});

} // namespace onceproxy::test
