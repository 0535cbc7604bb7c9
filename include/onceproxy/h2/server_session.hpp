#pragma once
// The server side of one HTTP/2 connection (RFC 9113), on nghttp2's session: bytes in, events
// out, bytes to write. No I/O and no clock of its own (the caller passes the time): the
// connection shell in http/ reads and writes the stream, runs the deadlines and serves the
// requests; everything the protocol decides (framing, HPACK, flow control, stream states,
// SETTINGS, PING, GOAWAY) and the defences against hostile peers happen here, where a unit test
// and a fuzzer reach them without a socket.
//
// Defences (SECURITY.md): a header block is bounded by limits::max_header_bytes across its
// CONTINUATION frames (fields past it are dropped and the request is flagged too large; a block
// that goes on past four times the bound, or over 128 CONTINUATION frames, ends the
// connection); RST_STREAM frames, control frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY) and
// empty DATA frames are counted per connection per second and past their budget the connection
// ends with GOAWAY
// ENHANCE_YOUR_CALM (CVE-2023-44487 rapid reset and the flood attacks); the HPACK dynamic table
// is bounded by our SETTINGS_HEADER_TABLE_SIZE; at most max_concurrent_streams streams are open;
// a request body is taken only as fast as the caller consumes it (the window is opened by
// consume(), never automatically), and a response body is queued only up to what the caller
// pushed (back-pressure through queued()).

#include "onceproxy/h2/common.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::h2 {

struct limits {
    std::uint32_t max_concurrent_streams = 100;
    /// One request's header block, decoded (name + value + 32 per field, as
    /// SETTINGS_MAX_HEADER_LIST_SIZE counts), across HEADERS and CONTINUATION frames.
    std::size_t max_header_bytes = 64 * 1024;
    std::uint32_t stream_window = 256 * 1024;           ///< per-stream receive window we advertise
    std::uint32_t connection_window = 1024 * 1024;      ///< connection receive window
    std::uint32_t header_table_size = 4096;             ///< our HPACK decoder's dynamic table bound
    std::uint32_t max_resets_per_second = 200;          ///< RST_STREAM frames received
    std::uint32_t max_control_frames_per_second = 1000; ///< see end_reason::control_flood
};

/// A request's head as it arrived: the pseudo-header fields apart, the others in order.
struct request_head {
    std::string method;
    std::string scheme;
    std::string authority; ///< empty when absent (then a `host` field may be in `fields`)
    std::string path;
    std::string protocol; ///< :protocol (extended CONNECT, RFC 8441); empty when absent
    std::vector<field> fields;
    bool too_large = false; ///< past max_header_bytes: fields were dropped; answer 431
};

/// What the session tells its caller. Called from within receive() and take_output(); a
/// callback may call the session's submit/push/consume/reset functions.
class events {
public:
    virtual ~events() = default;
    /// A request's head; `end_stream`: it has no body.
    virtual void on_request(std::int32_t stream, request_head&& head, bool end_stream) = 0;
    /// Request body bytes, valid during the call only. The caller calls consume() once it has
    /// passed them on: until then they count against the stream's window (back-pressure).
    virtual void on_data(std::int32_t stream, std::span<const char> bytes) = 0;
    /// The request body ended; its trailer fields (usually none). Not called when on_request
    /// said end_stream.
    virtual void on_request_end(std::int32_t stream, std::vector<field>&& trailers) = 0;
    /// The stream closed: `code` no_error after a complete exchange, else the reset's code
    /// (the peer's RST_STREAM, or ours). Nothing more may be submitted on it. Only for streams
    /// that had on_request (a malformed or refused request is reset unseen). Request body bytes
    /// not consumed by then are given back to the connection's window.
    virtual void on_stream_close(std::int32_t stream, error_code code) = 0;
    /// Bytes pushed with push_body were framed: queued(stream) dropped (more may be pushed).
    virtual void on_send_room(std::int32_t stream) = 0;
};

class server_session {
public:
    server_session(events& ev, const limits& l, clock::time_point now);
    ~server_session();
    server_session(const server_session&) = delete;
    server_session& operator=(const server_session&) = delete;

    /// Feeds bytes read from the peer (the client connection preface first). Returns false
    /// when the session ended (end_reason() says why); the GOAWAY is then queued in the output.
    bool receive(std::span<const char> bytes, clock::time_point now);

    /// The bytes to write next (empty: nothing to write now); valid until the next call to
    /// take_output() (receive() and the other calls leave them alone). Call again after
    /// writing them, until empty.
    std::span<const char> take_output();

    /// The peer's connection preface must be read (receive) or there are bytes to write;
    /// false for both: the connection is done and closes.
    bool wants_read() const;
    bool wants_write() const;
    end_reason ended() const noexcept;

    /// The response head. `end_stream`: no body follows (HEAD, 204, 304, a body of 0 bytes).
    void submit_response(std::int32_t stream, unsigned status, const std::vector<field>& fields,
                         bool end_stream);
    /// Appends body bytes to the stream's queue (copied); framed as the peer's windows allow.
    void push_body(std::int32_t stream, std::string_view bytes);
    /// The body ends after what was pushed; `trailers` non-empty: sent as a trailing HEADERS.
    void end_body(std::int32_t stream, const std::vector<field>& trailers = {});
    /// Bytes pushed on `stream` and not yet framed.
    std::size_t queued(std::int32_t stream) const;
    /// Ends the stream with RST_STREAM `code`.
    void reset(std::int32_t stream, error_code code);
    /// `n` request body bytes of `stream` were passed on: the peer may send that much more.
    void consume(std::int32_t stream, std::size_t n);
    /// Graceful end (a drain): GOAWAY NO_ERROR with the last stream id seen; streams already
    /// open finish; new ones are refused.
    void shutdown();
    /// Ends the connection now with GOAWAY `code` (after an idle timeout, a cut).
    void terminate(error_code code);
    /// Open streams.
    std::size_t open_streams() const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

} // namespace onceproxy::h2
