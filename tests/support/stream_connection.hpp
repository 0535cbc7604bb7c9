#pragma once
// A raw HTTP/1.1 client connection for streaming tests: bodies are sent and received piece by
// piece (a 512 MiB transfer never sits in memory), the framing the server chose stays visible
// (Content-Length, chunked with its trailer section, or close-delimited), and every send and
// read is bounded in time. Also: a streaming 64-bit FNV-1a as the test upstream computes it, and
// the resident memory of a process read from /proc.

#include "support/http_client.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::test {

/// 64-bit FNV-1a over a byte stream fed in pieces; `hex()` matches the test upstream's
/// "body_fnv1a" (16 lowercase hex digits).
class fnv1a {
public:
    void update(std::string_view bytes) noexcept;
    std::uint64_t value() const noexcept { return hash_; }
    std::string hex() const;

private:
    std::uint64_t hash_ = 14695981039346656037ULL;
};

/// A response head as received.
struct response_head {
    int version = 11; ///< 10 for HTTP/1.0, 11 for HTTP/1.1
    unsigned status = 0;
    header_list headers; ///< in order, names as sent
    std::string raw;     ///< the bytes of the head, status line to the empty line included
    /// First value of a header (case-insensitive), "" when absent.
    std::string header(std::string_view name) const;
    bool has_header(std::string_view name) const;
};

/// How a response body is delimited on the wire (RFC 9112 §6.3).
enum class body_framing {
    none,           ///< no body: HEAD, 1xx, 204, 304
    content_length, ///< Content-Length bytes
    chunked,        ///< Transfer-Encoding: chunked, ends with the last chunk and trailer section
    close,          ///< the body runs until the server closes the connection
};

/// What `read_body` saw.
struct body_result {
    bool complete = false; ///< the body ended as its framing says (false: timeout, cut short)
    std::uint64_t bytes = 0;
    body_framing framing = body_framing::none;
    header_list trailers;       ///< chunked only: the trailer fields
    std::string raw_trailer;    ///< chunked only: the trailer section bytes (without the CRLF)
    std::uint64_t chunks = 0;   ///< chunked only: data chunks seen
    bool framing_error = false; ///< malformed chunk framing
};

/// One client connection to 127.0.0.1:`port`, non-blocking underneath; each call takes a
/// timeout and throws nothing for a slow or closing peer (it reports it).
class stream_connection {
public:
    explicit stream_connection(unsigned short port);
    ~stream_connection();
    stream_connection(const stream_connection&) = delete;
    stream_connection& operator=(const stream_connection&) = delete;

    /// Sends all of `bytes`; false when the peer closed/reset or no progress was possible for
    /// `timeout` (a server that stopped reading).
    bool send(std::string_view bytes, std::chrono::milliseconds timeout = std::chrono::seconds(20));
    /// Half-closes the sending side (FIN); reading goes on.
    void shutdown_send();

    /// Reads the next response head (1xx included). nullopt on timeout, close or garbage.
    std::optional<response_head> read_head(std::chrono::milliseconds timeout);

    /// Starts the body of the response described by `head` (`head_request`: it answers HEAD).
    void begin_body(const response_head& head, bool head_request = false);
    /// Reads body data until `until` returns true for the data decoded so far by this call
    /// (or the body ends); returns that data. nullopt when `timeout` passes or the connection
    /// ends before `until` holds and before the body ends.
    std::optional<std::string> read_body_until(const std::function<bool(std::string_view)>& until,
                                               std::chrono::milliseconds timeout);
    /// Reads the rest of the body, handing each decoded piece to `sink`. `idle_timeout` bounds
    /// each wait for more bytes; `total_timeout` the whole call.
    body_result read_body(const std::function<void(std::string_view)>& sink,
                          std::chrono::milliseconds idle_timeout = std::chrono::seconds(20),
                          std::chrono::milliseconds total_timeout = std::chrono::seconds(300));
    /// The body so far (framing, trailers, completeness); final once `body_done()`.
    const body_result& body() const noexcept { return body_; }
    bool body_done() const noexcept { return body_state_ == state::done; }

    /// Whatever bytes arrive within `timeout` (at least one read), raw; "" on timeout or close.
    std::string read_raw(std::chrono::milliseconds timeout);
    /// Exactly `n` raw bytes; nullopt on timeout or close first.
    std::optional<std::string> read_exact(std::size_t n, std::chrono::milliseconds timeout);
    /// Raw bytes up to and including `needle` (bounded); nullopt on timeout or close first.
    std::optional<std::string> read_raw_until(std::string_view needle,
                                              std::chrono::milliseconds timeout);
    /// True if the server closed the connection (EOF or reset) within `timeout`; bytes that
    /// arrive meanwhile are discarded.
    bool wait_closed(std::chrono::milliseconds timeout);
    bool closed() const noexcept { return eof_; }

private:
    enum class state {
        idle,
        length,
        chunk_size,
        chunk_data,
        chunk_crlf,
        trailer,
        until_close,
        done
    };
    /// Reads more bytes into buf_ within `deadline`; false on timeout or EOF.
    bool fill(std::chrono::steady_clock::time_point deadline);
    /// Decodes what buf_ holds, handing data to `sink`.
    void decode(const std::function<void(std::string_view)>& sink);
    std::string_view pending() const noexcept { return std::string_view(buf_).substr(pos_); }
    void consume(std::size_t n);

    int fd_ = -1;
    bool eof_ = false;
    std::string buf_;
    std::size_t pos_ = 0; ///< start of the unread bytes in buf_
    state body_state_ = state::idle;
    std::uint64_t remaining_ = 0;
    body_result body_;
};

/// Resident set size of process `pid` (VmRSS), KiB; 0 when it cannot be read.
std::uint64_t rss_kib(int pid);
/// Peak resident set size of `pid` since it started or since `reset_peak_rss` (VmHWM), KiB.
std::uint64_t peak_rss_kib(int pid);
/// Resets the peak that `peak_rss_kib` reports to the current RSS (/proc/PID/clear_refs "5");
/// false when the kernel refuses (then the peak runs from the process start).
bool reset_peak_rss(int pid);
/// Words put before the proxy binary (proxy_fixture's `prefix`): a small ASan quarantine, so
/// that freed buffers are reused and resident memory reflects what the proxy holds, not what
/// ASan keeps (256 MiB by default). Any ASAN_OPTIONS already set are kept.
std::vector<std::string> small_asan_quarantine();

} // namespace onceproxy::test
