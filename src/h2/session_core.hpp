#pragma once
// What the client and the server session keep and do alike, as the base of their impl
// (session_core<impl, streams>): the nghttp2 session and its options, the receive and output
// steps, the stop a receive callback decides on, the window accounting of the body bytes
// received, and the queue of the body each stream sends.
//
// The impl adds its own stream state (deriving from stream_core, with body_to_caller(): the
// body bytes received go to the caller, else they are dropped) and provides:
//   ev                        its events (on_data, on_send_room)
//   reading()                 whether input is still read: receive() takes bytes
//   check(end_reason)         a defence's verdict (frame_budget), from a receive callback
//   tell()                    the events nghttp2 left for after its return (tell_room does the
//                             room to send)
//   on_begin_headers, on_header, on_frame_recv, on_stream_close, on_frame_send   callbacks
// and may hide terminate_with() with one of its own that calls this one.

#include "h2/frame_budget.hpp"
#include "h2/nv.hpp"
#include "onceproxy/h2/common.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onceproxy::h2::detail {

/// receive() frames output up to this much on its own (to see a GOAWAY nghttp2 decided on);
/// take_output() frames up to this much per call.
inline constexpr std::size_t output_batch = 64 * 1024;
/// SETTINGS ACK and PING ACK frames nghttp2 may hold unsent before it calls it a flood.
inline constexpr std::size_t max_outbound_ack = 256;
/// Entries one SETTINGS frame may carry.
inline constexpr std::size_t max_settings_entries = 32;
inline constexpr std::uint32_t max_window = (1U << 31) - 1;

/// The state every stream has, on either side.
struct stream_core {
    bool head_done = false;      // the caller was told the head (on_request, on_response)
    bool in_trailers = false;    // a header block after the head's is being read
    std::size_t block_bytes = 0; // of the header block being read
    std::size_t unconsumed = 0;  // body bytes given to on_data, not consumed yet
    // The body we send.
    std::string body;
    std::size_t body_at = 0; // framed up to here
    bool body_ended = false;
    bool deferred = false; // the data provider returned NGHTTP2_ERR_DEFERRED
    std::vector<field> body_trailers;
};

template <class Impl, class Streams>
struct session_core {
    using stream_state = typename Streams::mapped_type;

    nghttp2_session* session = nullptr;
    Streams streams;

    std::string pending; // framed, not handed out yet
    std::string handed;  // the last take_output()

    end_reason reason = end_reason::none;
    bool recv_broken = false; // mem_recv failed: never called again
    bool send_broken = false; // mem_send failed: nothing more comes out

    // A stop decided inside a receive callback: the callbacks fail until mem_recv returns,
    // then the session is terminated with `stop_code`.
    bool stop = false;
    error_code stop_code = error_code::no_error;
    end_reason stop_reason = end_reason::none;
    std::exception_ptr error; // thrown by the caller's events inside a callback
    bool in_recv = false;
    // terminate() was called, or a callback stopped the session: its GOAWAY is not the
    // peer's fault.
    bool local_end = false;

    frame_budget budget;

    std::size_t connection_debt = 0; // body bytes dropped or left unconsumed: give them back
    std::vector<std::int32_t> room;  // streams whose queue the data provider took bytes from

    explicit session_core(const frame_budget& b) : budget(b) {}
    ~session_core() { nghttp2_session_del(session); }
    session_core(const session_core&) = delete;
    session_core& operator=(const session_core&) = delete;

    Impl& derived() { return static_cast<Impl&>(*this); }
    const Impl& derived() const { return static_cast<const Impl&>(*this); }
    static Impl& self(void* p) { return *static_cast<Impl*>(p); }

    /// Makes the nghttp2 session (`make`: nghttp2_session_client_new2 or _server_new2) with
    /// Impl's callbacks and the options both sides take; `tune(callbacks, option)` adds the
    /// side's own. Then submits our SETTINGS, `first` ahead of those both sides send, and
    /// opens the connection window.
    template <class Limits, class Tune>
    void open(int (*make)(nghttp2_session**, const nghttp2_session_callbacks*, void*,
                          const nghttp2_option*),
              const Limits& l, nghttp2_settings_entry first, Tune tune) {
        nghttp2_session_callbacks* cbs = nullptr;
        if (nghttp2_session_callbacks_new(&cbs) != 0) {
            throw std::bad_alloc();
        }
        nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, &Impl::on_begin_frame);
        nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &Impl::on_begin_headers);
        nghttp2_session_callbacks_set_on_header_callback(cbs, &Impl::on_header);
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &Impl::on_frame_recv);
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &Impl::on_data_chunk_recv);
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &Impl::on_stream_close);
        nghttp2_session_callbacks_set_on_frame_send_callback(cbs, &Impl::on_frame_send);

        nghttp2_option* opt = nullptr;
        if (nghttp2_option_new(&opt) != 0) {
            nghttp2_session_callbacks_del(cbs);
            throw std::bad_alloc();
        }
        nghttp2_option_set_no_auto_window_update(opt, 1);
        nghttp2_option_set_max_outbound_ack(opt, max_outbound_ack);
        nghttp2_option_set_max_settings(opt, max_settings_entries);
        nghttp2_option_set_max_continuations(opt, max_continuations);
        tune(cbs, opt);

        const int rv = make(&session, cbs, &derived(), opt);
        nghttp2_option_del(opt);
        nghttp2_session_callbacks_del(cbs);
        if (rv != 0) {
            throw std::bad_alloc();
        }

        const auto header_list = static_cast<std::uint32_t>(
            std::min<std::size_t>(l.max_header_bytes, std::numeric_limits<std::uint32_t>::max()));
        const std::array<nghttp2_settings_entry, 5> settings{{
            first,
            {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, std::min(l.stream_window, max_window)},
            {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, l.header_table_size},
            {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, header_list},
            {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
        }};
        nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
        nghttp2_session_set_local_window_size(
            session, NGHTTP2_FLAG_NONE, 0,
            static_cast<std::int32_t>(std::min(l.connection_window, max_window)));
    }

    stream_state* find(std::int32_t id) {
        const auto it = streams.find(id);
        return it == streams.end() ? nullptr : &it->second;
    }

    // Called from a receive callback: the session ends once mem_recv returns.
    int fail(end_reason r, error_code code) {
        if (!stop) {
            stop = true;
            stop_reason = r;
            stop_code = code;
        }
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }

    int fail(std::exception_ptr e) {
        if (!error) {
            error = std::move(e);
        }
        return fail(end_reason::none, error_code::internal_error);
    }

    // Ends the connection with GOAWAY `code` (once).
    void terminate_with(error_code code) {
        nghttp2_session_terminate_session(session, static_cast<std::uint32_t>(code));
    }

    void pay_debt() {
        if (connection_debt > 0 && !send_broken) {
            nghttp2_session_consume_connection(session, connection_debt);
            connection_debt = 0;
        }
    }

    // Frames output into `out` until it holds `limit` bytes or nghttp2 has nothing more.
    void frame_into(std::string& out, std::size_t limit) {
        pay_debt();
        while (!send_broken && out.size() < limit) {
            const std::uint8_t* data = nullptr;
            const auto n = nghttp2_session_mem_send(session, &data);
            if (n < 0) {
                send_broken = true;
                if (reason == end_reason::none) {
                    reason = end_reason::protocol_error;
                }
                break;
            }
            if (n == 0) {
                break;
            }
            out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
        }
    }

    /// receive(): while reading(), feeds `bytes` to nghttp2. A failure ends the
    /// session: a stop a callback asked for with its code and reason, a flood (too many queued
    /// ACKs, too many CONTINUATION frames) with ENHANCE_YOUR_CALM, anything else with
    /// PROTOCOL_ERROR. Then frames what is due and tells the caller what happened; an
    /// exception a callback caught is rethrown here.
    bool receive(std::span<const char> bytes, clock::time_point now) {
        if (!derived().reading()) {
            return false;
        }
        budget.roll(now);
        in_recv = true;
        const auto rv = nghttp2_session_mem_recv(
            session, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
        in_recv = false;
        if (rv < 0 || stop) {
            recv_broken = rv < 0;
            error_code code = error_code::protocol_error;
            end_reason why = end_reason::protocol_error;
            if (stop) {
                code = stop_code;
                why = stop_reason;
            } else if (rv == NGHTTP2_ERR_FLOODED) {
                code = error_code::enhance_your_calm;
                why = end_reason::control_flood;
            } else if (rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS) {
                code = error_code::enhance_your_calm;
                why = end_reason::header_flood;
            }
            if (why != end_reason::none) {
                if (reason == end_reason::none) {
                    reason = why;
                }
            } else {
                local_end = true;
            }
            stop = false;
            derived().terminate_with(code);
        }
        frame_into(pending, output_batch);
        if (error) {
            std::rethrow_exception(std::exchange(error, nullptr));
        }
        derived().tell();
        return ended() == end_reason::none;
    }

    /// take_output(): what receive() framed, then up to output_batch more.
    std::span<const char> take_output() {
        handed.clear();
        handed.swap(pending);
        frame_into(handed, output_batch);
        if (error) {
            std::rethrow_exception(std::exchange(error, nullptr));
        }
        derived().tell();
        return {handed.data(), handed.size()};
    }

    bool wants_read() const {
        return derived().reading() && nghttp2_session_want_read(session) != 0;
    }

    bool wants_write() const {
        return !pending.empty() || (!send_broken && nghttp2_session_want_write(session) != 0);
    }

    end_reason ended() const {
        if (reason != end_reason::none) {
            return reason;
        }
        if (!wants_read() && !wants_write()) {
            return end_reason::peer_closed;
        }
        return end_reason::none;
    }

    // terminate() inside a receive callback: stop reading, end once mem_recv returns. False
    // outside one.
    bool stop_in_recv(error_code code) {
        if (!in_recv) {
            return false;
        }
        fail(end_reason::none, code);
        return true;
    }

    // The streams the data provider took bytes from get on_send_room, once each.
    void tell_room() {
        if (room.empty()) {
            return;
        }
        auto ids = std::move(room);
        room.clear();
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        for (const auto id : ids) {
            if (streams.contains(id)) {
                derived().ev.on_send_room(id);
            }
        }
    }

    // A DATA frame padded to its length without END_STREAM counts as an empty one (a
    // control frame); from on_frame_recv.
    int check_padding(const nghttp2_frame& frame) {
        if (frame.hd.length > 0 && frame.hd.length <= frame.data.padlen &&
            (frame.hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
            return derived().check(budget.count_control());
        }
        return 0;
    }

    // A frame was sent. A DATA frame earns the peer's WINDOW_UPDATE frames that follow a
    // place in the control budget. A GOAWAY with an error that we did not decide on: nghttp2
    // found the peer broke the protocol; true then.
    bool note_sent(const nghttp2_frame& frame) {
        if (frame.hd.type == NGHTTP2_DATA) {
            budget.earn(updates_per_data_frame);
        }
        if (frame.hd.type == NGHTTP2_GOAWAY && frame.goaway.error_code != NGHTTP2_NO_ERROR &&
            reason == end_reason::none && !local_end) {
            reason = end_reason::protocol_error;
            return true;
        }
        return false;
    }

    // ---- the body bytes received: their window comes back once the caller consumed them

    void consume(std::int32_t id, std::size_t n) {
        auto* st = find(id);
        if (st == nullptr) {
            return; // closed: what it had not consumed was given back then
        }
        n = std::min(n, st->unconsumed);
        st->unconsumed -= n;
        if (n > 0) {
            nghttp2_session_consume(session, id, n);
        }
    }

    // ---- the body we send

    void push_body(std::int32_t id, std::string_view bytes) {
        auto* st = find(id);
        if (st == nullptr || st->body_ended || bytes.empty()) {
            return;
        }
        if (st->body_at > 0 && st->body_at >= st->body.size() / 2) {
            st->body.erase(0, st->body_at);
            st->body_at = 0;
        }
        st->body.append(bytes);
        resume(id, *st);
    }

    void end_body(std::int32_t id, const std::vector<field>& trailers) {
        auto* st = find(id);
        if (st == nullptr || st->body_ended) {
            return;
        }
        st->body_ended = true;
        st->body_trailers = trailers;
        resume(id, *st);
    }

    std::size_t queued(std::int32_t id) const {
        const auto it = streams.find(id);
        return it == streams.end() ? 0 : it->second.body.size() - it->second.body_at;
    }

    void resume(std::int32_t id, stream_state& st) {
        if (st.deferred) {
            st.deferred = false;
            nghttp2_session_resume_data(session, id);
        }
    }

    // ---- nghttp2 callbacks both sides take alike (receive side: may fail; send side: never
    // throw, never call out)

    static int on_begin_frame(nghttp2_session*, const nghttp2_frame_hd* hd, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        return s.check(s.budget.count(*hd));
    }

    // Body bytes of a stream whose head the caller has not taken (or that failed) are
    // dropped, and their window given back.
    static int on_data_chunk_recv(nghttp2_session*, std::uint8_t, std::int32_t id,
                                  const std::uint8_t* data, std::size_t len, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        auto* st = s.find(id);
        if (st == nullptr || !st->body_to_caller()) {
            s.connection_debt += len;
            return 0;
        }
        st->unconsumed += len;
        try {
            s.ev.on_data(id, {reinterpret_cast<const char*>(data), len});
            return 0;
        } catch (...) {
            return s.fail(std::current_exception());
        }
    }

    static ssize_t read_body(nghttp2_session* session, std::int32_t id, std::uint8_t* buf,
                             std::size_t length, std::uint32_t* flags, nghttp2_data_source*,
                             void* user) {
        auto& s = self(user);
        auto* st = s.find(id);
        if (st == nullptr) {
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        const auto avail = st->body.size() - st->body_at;
        const auto n = std::min(length, avail);
        if (n == 0 && !st->body_ended) {
            st->deferred = true;
            return NGHTTP2_ERR_DEFERRED;
        }
        std::memcpy(buf, st->body.data() + st->body_at, n);
        st->body_at += n;
        if (st->body_at == st->body.size()) {
            st->body.clear();
            st->body_at = 0;
        }
        if (n > 0) {
            try {
                s.room.push_back(id);
            } catch (...) {
                // on_send_room is a hint; the caller also sees queued() drop.
            }
        }
        if (n == avail && st->body_ended) {
            *flags |= NGHTTP2_DATA_FLAG_EOF;
            if (!st->body_trailers.empty()) {
                try {
                    std::vector<field> storage;
                    const auto nva = make_nva(st->body_trailers, storage);
                    if (nghttp2_submit_trailer(session, id, nva.data(), nva.size()) == 0) {
                        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
                    }
                } catch (...) {
                    // No memory for the trailers: the body ends without them.
                }
            }
        }
        return static_cast<ssize_t>(n);
    }
};

} // namespace onceproxy::h2::detail
