#pragma once
// The client side of one HTTP/2 connection (RFC 9113), on nghttp2's session: requests in,
// bytes to write out, bytes read in, responses out as events. No I/O and no clock of its own
// (the caller passes the time): the upstream pool owns the connection, its deadlines and the
// keep-alive timer; everything the protocol decides (framing, HPACK, flow control, stream
// states, SETTINGS, PING, GOAWAY) happens here, where a unit test reaches it without a socket.
//
// Flow control both ways: a response body is taken only as fast as the caller consumes it (the
// windows are opened by consume(), never automatically), and a request body is queued only up
// to what the caller pushed (back-pressure through queued() and on_send_room).
//
// A stream the server did not process (RST_STREAM REFUSED_STREAM, a stream id above the
// last-stream-id of its GOAWAY, a request never sent) is closed with `refused`: only those may
// be retried on another connection whatever the request was (RFC 9113 §8.7).
//
// Defences, lighter than the server side's (the upstream is configured, not anyone): a
// response header block is bounded by client_limits::max_header_bytes (past it the stream is
// reset and closed without a response); the control frames and RST_STREAM frames a server
// sends are counted per second and past their budget the connection ends with GOAWAY
// ENHANCE_YOUR_CALM (control_flood), as the CONTINUATION frames of one header block are
// (header_flood); a stream takes at most 16 interim (1xx) responses.

#include "onceproxy/h2/common.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace onceproxy::h2 {

struct client_limits {
    /// One response's header block, decoded (name + value + 32 per field, as
    /// SETTINGS_MAX_HEADER_LIST_SIZE counts), across HEADERS and CONTINUATION frames.
    std::size_t max_header_bytes = 64 * 1024;
    std::uint32_t stream_window = 256 * 1024;      ///< per-stream receive window we advertise
    std::uint32_t connection_window = 1024 * 1024; ///< connection receive window
    std::uint32_t header_table_size = 4096;        ///< our HPACK decoder's dynamic table bound
    /// SETTINGS/PING/WINDOW_UPDATE/PRIORITY/RST_STREAM/empty DATA frames received per second,
    /// plus two for each DATA frame sent that second (the WINDOW_UPDATE frames an upload earns).
    std::uint32_t max_control_frames_per_second = 1000;
};

/// What the session tells its caller. Called from within receive(), take_output() and the
/// calls that end the session; a callback may call the session's submit/push/consume/reset
/// functions.
class client_events {
public:
    virtual ~client_events() = default;
    /// The final response's head (1xx interim responses are skipped; a 101 fails the stream);
    /// `end_stream`: no body follows.
    virtual void on_response(std::int32_t stream, unsigned status, std::vector<field>&& fields,
                             bool end_stream) = 0;
    /// Response body bytes, valid during the call only. The caller calls consume() once it has
    /// passed them on: until then they count against the stream's window (back-pressure).
    virtual void on_data(std::int32_t stream, std::span<const char> bytes) = 0;
    /// The response body ended; its trailer fields (usually none). Not called when on_response
    /// said end_stream.
    virtual void on_response_end(std::int32_t stream, std::vector<field>&& trailers) = 0;
    /// The stream closed, once for every stream submit_request returned: `code` no_error after
    /// a complete exchange, else the reset's code (the server's RST_STREAM, ours, or the code
    /// the connection ended with). Closed without on_response (or before on_response_end): the
    /// response is missing or cut (a malformed or too large response head is reset with
    /// protocol_error). `refused`: the server did not process the request (RST_STREAM
    /// REFUSED_STREAM, above a GOAWAY's last-stream-id, or never sent), so it may be retried
    /// elsewhere. Response body bytes not consumed by then are given back to the connection.
    virtual void on_stream_close(std::int32_t stream, error_code code, bool refused) = 0;
    /// Bytes pushed with push_body were framed: queued(stream) dropped (more may be pushed).
    virtual void on_send_room(std::int32_t stream) = 0;
    /// The server's GOAWAY: no new stream opens on this connection; the streams above
    /// `last_stream_id` are closed refused, the others go on.
    virtual void on_goaway(std::int32_t last_stream_id, error_code code) = 0;
    /// The server acknowledged our PING (see ping()).
    virtual void on_ping_ack() = 0;
};

class client_session {
public:
    /// Queues the connection preface and our SETTINGS (ENABLE_PUSH 0, the windows, the header
    /// list and table sizes): take_output() has them before any request.
    client_session(client_events& ev, const client_limits& l, clock::time_point now);
    ~client_session();
    client_session(const client_session&) = delete;
    client_session& operator=(const client_session&) = delete;

    /// A request on a new stream: its id, or nullopt when none can open (see can_open_stream).
    /// `fields` lose their connection-specific and pseudo-header fields; `end_stream`: no body
    /// (else push_body/end_body give it).
    std::optional<std::int32_t> submit_request(std::string_view method, std::string_view scheme,
                                               std::string_view authority, std::string_view path,
                                               const std::vector<field>& fields, bool end_stream);
    /// Appends request body bytes to the stream's queue (copied); framed as the server's
    /// windows allow.
    void push_body(std::int32_t stream, std::string_view bytes);
    /// The request body ends after what was pushed; `trailers` non-empty: sent as a trailing
    /// HEADERS.
    void end_body(std::int32_t stream, const std::vector<field>& trailers = {});
    /// Bytes pushed on `stream` and not yet framed.
    std::size_t queued(std::int32_t stream) const;
    /// `n` response body bytes of `stream` were passed on: the server may send that much more.
    void consume(std::int32_t stream, std::size_t n);
    /// Ends the stream with RST_STREAM `code` (on_stream_close follows).
    void reset(std::int32_t stream, error_code code);

    /// Feeds bytes read from the server. Returns false when the session ended (ended() says
    /// why); a GOAWAY of ours is then queued in the output.
    bool receive(std::span<const char> bytes, clock::time_point now);
    /// The bytes to write next (empty: nothing to write now); valid until the next call to
    /// take_output(). Call again after writing them, until empty.
    std::span<const char> take_output();
    /// More is expected from the server / there are bytes to write; false for both: the
    /// connection is done and closes.
    bool wants_read() const;
    bool wants_write() const;
    end_reason ended() const noexcept;

    /// A new stream may open now: no GOAWAY either way, the session goes on, and fewer streams
    /// than the server's SETTINGS_MAX_CONCURRENT_STREAMS are open.
    bool can_open_stream() const;
    /// Streams submitted and not closed yet.
    std::size_t open_streams() const;
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS (100 until its SETTINGS arrive; unlimited
    /// reads as 2^32 - 1).
    std::uint32_t peer_max_concurrent_streams() const;

    /// Sends a PING (keep-alive); on_ping_ack follows when the server answers. No new PING
    /// while one is unanswered.
    void ping(clock::time_point now);
    /// When the unanswered PING was sent (nullopt: none is): the caller ends the connection
    /// when it stays unanswered too long.
    std::optional<clock::time_point> ping_sent() const;
    /// When the last PING ack arrived (nullopt: none yet).
    std::optional<clock::time_point> last_ping_ack() const;

    /// Graceful end: GOAWAY NO_ERROR; the open streams finish, no new one opens, then the
    /// session ends.
    void shutdown();
    /// Ends the connection now with GOAWAY `code`; the open streams close with `code` (those
    /// whose request never left, refused). Also what the caller calls when the connection
    /// breaks (end of stream, a read or write error, a PING unanswered): the session itself
    /// closes no stream for that, and its destructor tells nothing.
    void terminate(error_code code);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

} // namespace onceproxy::h2
