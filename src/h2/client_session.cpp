#include "onceproxy/h2/client_session.hpp"

#include "h2/session_core.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <string>
#include <utility>

namespace onceproxy::h2 {

namespace {

/// Interim (1xx) responses one stream may take before it fails.
constexpr int max_interim = 16;
/// The server's SETTINGS_MAX_CONCURRENT_STREAMS until its SETTINGS arrive.
constexpr std::uint32_t initial_peer_streams = 100;

} // namespace

struct client_stream : detail::stream_core {
    bool sent = false;         // the request's HEADERS were framed
    bool peer_refused = false; // the server's RST_STREAM REFUSED_STREAM
    // The code the stream closes with, whatever nghttp2 says: we reset it for a bad
    // response, or the caller reset it before the request left.
    std::optional<error_code> failed;
    unsigned status = 0;
    std::vector<field> fields; // of the header block being read
    bool too_large = false;
    int interim = 0; // 1xx responses skipped

    // The response's body goes to the caller: its head did, and the stream has not failed.
    bool body_to_caller() const { return head_done && !failed; }
};

struct client_session::impl : detail::session_core<impl, std::map<std::int32_t, client_stream>> {
    struct closing {
        std::int32_t id;
        error_code code;
        bool refused;
    };

    client_events& ev;
    client_limits lim;
    error_code end_code = error_code::no_error; // what the streams left at the end close with

    bool goaway_received = false;
    std::int32_t goaway_last_id = 0;
    bool goaway_sent = false; // shutdown()

    clock::time_point now;
    std::optional<clock::time_point> ping_at;
    std::optional<clock::time_point> ping_ack_at;

    std::vector<closing> closed; // not told to the caller yet

    impl(client_events& e, const client_limits& l, clock::time_point t)
        : session_core({t, l.max_control_frames_per_second, l.max_control_frames_per_second}),
          ev(e), lim(l), now(t) {}

    // A defence's verdict (frame_budget): RST_STREAM frames count as control frames here.
    int check(end_reason r) {
        if (r == end_reason::none) {
            return 0;
        }
        return fail(r == end_reason::rapid_reset ? end_reason::control_flood : r,
                    error_code::enhance_your_calm);
    }

    void terminate_with(error_code code) {
        end_code = code;
        session_core::terminate_with(code);
    }

    bool reading() const { return !recv_broken && reason == end_reason::none; }

    // The server did not process the stream: it said so, or the request never left.
    bool refused(std::int32_t id, const stream_state& st) const {
        return st.peer_refused || !st.sent || (goaway_received && id > goaway_last_id);
    }

    void close(std::int32_t id, error_code code) {
        const auto it = streams.find(id);
        if (it == streams.end()) {
            return;
        }
        auto& st = it->second;
        connection_debt += st.unconsumed;
        closed.push_back({id, st.failed.value_or(code), refused(id, st)});
        streams.erase(it);
    }

    // The events nghttp2 left for after its return: streams closed, room to send; once the
    // session is over, the streams it left open close too.
    void tell() {
        if ((local_end || ended() != end_reason::none) && !streams.empty()) {
            const auto code = end_code == error_code::no_error && reason != end_reason::none
                                  ? error_code::protocol_error
                                  : end_code;
            while (!streams.empty()) {
                close(streams.begin()->first, code);
            }
        }
        auto gone = std::move(closed);
        closed.clear();
        for (const auto& c : gone) {
            ev.on_stream_close(c.id, c.code, c.refused);
        }
        tell_room();
    }

    // Ends the stream for a bad response: RST_STREAM PROTOCOL_ERROR, closed with that code.
    void fail_stream(std::int32_t id, stream_state& st) {
        if (!st.failed) {
            st.failed = error_code::protocol_error;
            nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_PROTOCOL_ERROR);
        }
    }

    // ---- nghttp2 callbacks

    static int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        if (auto* st = s.find(frame->hd.stream_id); st != nullptr) {
            st->in_trailers = st->head_done;
            st->fields.clear();
            st->block_bytes = 0;
            st->status = 0;
        }
        return 0;
    }

    static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
                         std::size_t namelen, const std::uint8_t* value, std::size_t valuelen,
                         std::uint8_t, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        auto* st = s.find(frame->hd.stream_id);
        if (st == nullptr || st->failed) {
            return 0;
        }
        st->block_bytes += namelen + valuelen + 32;
        if (st->block_bytes > 4 * s.lim.max_header_bytes) {
            return s.fail(end_reason::header_flood, error_code::enhance_your_calm);
        }
        if (st->block_bytes > s.lim.max_header_bytes) {
            st->too_large = true;
            return 0; // dropped; the stream fails once the block is read
        }
        try {
            const std::string_view n(reinterpret_cast<const char*>(name), namelen);
            const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
            if (n == ":status") {
                unsigned status = 0;
                const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), status);
                st->status = ec == std::errc{} && end == v.data() + v.size() ? status : 0;
            } else if (!n.empty() && n.front() != ':') {
                st->fields.push_back({std::string(n), std::string(v)});
            }
            return 0;
        } catch (...) {
            return s.fail(std::current_exception());
        }
    }

    static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        const auto id = frame->hd.stream_id;
        const bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
        try {
            switch (frame->hd.type) {
            case NGHTTP2_DATA:
                if (const int rv = s.check_padding(*frame); rv != 0) {
                    return rv;
                }
                if (auto* st = s.find(id); end_stream && st != nullptr && st->body_to_caller()) {
                    s.ev.on_response_end(id, {});
                }
                return 0;
            case NGHTTP2_HEADERS:
                return s.on_headers(id, end_stream);
            case NGHTTP2_RST_STREAM:
                if (auto* st = s.find(id);
                    st != nullptr && frame->rst_stream.error_code == NGHTTP2_REFUSED_STREAM) {
                    st->peer_refused = true;
                }
                return 0;
            case NGHTTP2_GOAWAY:
                s.goaway_received = true;
                s.goaway_last_id = frame->goaway.last_stream_id;
                s.ev.on_goaway(frame->goaway.last_stream_id,
                               static_cast<error_code>(frame->goaway.error_code));
                return 0;
            case NGHTTP2_PING:
                if ((frame->hd.flags & NGHTTP2_FLAG_ACK) != 0 && s.ping_at) {
                    s.ping_at.reset();
                    s.ping_ack_at = s.now;
                    s.ev.on_ping_ack();
                }
                return 0;
            default:
                return 0;
            }
        } catch (...) {
            return s.fail(std::current_exception());
        }
    }

    // A header block of `id` was read whole.
    int on_headers(std::int32_t id, bool end_stream) {
        auto* st = find(id);
        if (st == nullptr || st->failed) {
            return 0;
        }
        if (st->too_large) {
            fail_stream(id, *st);
            return 0;
        }
        if (st->in_trailers) {
            if (end_stream) {
                ev.on_response_end(id, std::move(st->fields));
            }
            return 0;
        }
        if (st->status / 100 == 1 && st->status != 101 && !end_stream &&
            ++st->interim <= max_interim) {
            return 0; // interim: the final response follows
        }
        if (st->status < 200 || st->status > 999) {
            fail_stream(id, *st);
            return 0;
        }
        st->head_done = true;
        ev.on_response(id, st->status, std::move(st->fields), end_stream);
        return 0;
    }

    // Also called while framing output: the caller is told once nghttp2 has returned (tell).
    static int on_stream_close(nghttp2_session*, std::int32_t id, std::uint32_t code, void* user) {
        try {
            self(user).close(id, static_cast<error_code>(code));
            return 0;
        } catch (...) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
    }

    static int on_frame_send(nghttp2_session*, const nghttp2_frame* frame, void* user) {
        auto& s = self(user);
        if (frame->hd.type == NGHTTP2_HEADERS) {
            if (auto* st = s.find(frame->hd.stream_id); st != nullptr) {
                st->sent = true;
            }
        }
        if (s.note_sent(*frame)) {
            s.end_code = static_cast<error_code>(frame->goaway.error_code);
        }
        return 0;
    }

    // A request that could not be sent (a GOAWAY came first): its stream never opened.
    static int on_frame_not_send(nghttp2_session*, const nghttp2_frame* frame, int, void* user) {
        if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
            try {
                self(user).close(frame->hd.stream_id, error_code::refused_stream);
            } catch (...) {
                return NGHTTP2_ERR_CALLBACK_FAILURE;
            }
        }
        return 0;
    }
};

client_session::client_session(client_events& ev, const client_limits& l, clock::time_point now)
    : impl_(std::make_unique<impl>(ev, l, now)) {
    impl_->open(&nghttp2_session_client_new2, l, {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                [](nghttp2_session_callbacks* cbs, nghttp2_option* opt) {
                    nghttp2_session_callbacks_set_on_frame_not_send_callback(
                        cbs, &impl::on_frame_not_send);
                    nghttp2_option_set_peer_max_concurrent_streams(opt, initial_peer_streams);
                });
}

client_session::~client_session() = default;

std::optional<std::int32_t>
client_session::submit_request(std::string_view method, std::string_view scheme,
                               std::string_view authority, std::string_view path,
                               const std::vector<field>& fields, bool end_stream) {
    auto& s = *impl_;
    if (!can_open_stream()) {
        return std::nullopt;
    }
    std::vector<field> storage;
    storage.push_back({":method", std::string(method)});
    if (!scheme.empty()) {
        storage.push_back({":scheme", std::string(scheme)});
    }
    if (!authority.empty()) {
        storage.push_back({":authority", std::string(authority)});
    }
    if (!path.empty()) {
        storage.push_back({":path", std::string(path)});
    }
    const auto nva = make_nva(fields, storage);
    nghttp2_data_provider provider{};
    provider.read_callback = &impl::read_body;
    const auto id = nghttp2_submit_request(s.session, nullptr, nva.data(), nva.size(),
                                           end_stream ? nullptr : &provider, nullptr);
    if (id <= 0) {
        return std::nullopt;
    }
    s.streams.try_emplace(id);
    return id;
}

void client_session::push_body(std::int32_t stream, std::string_view bytes) {
    impl_->push_body(stream, bytes);
}

void client_session::end_body(std::int32_t stream, const std::vector<field>& trailers) {
    impl_->end_body(stream, trailers);
}

std::size_t client_session::queued(std::int32_t stream) const {
    return impl_->queued(stream);
}

void client_session::consume(std::int32_t stream, std::size_t n) {
    impl_->consume(stream, n);
}

void client_session::reset(std::int32_t stream, error_code code) {
    auto& s = *impl_;
    if (auto* st = s.find(stream); st != nullptr) {
        if (!st->sent && !st->failed) {
            st->failed = code; // nghttp2 drops the request unsent (on_frame_not_send)
        }
        nghttp2_submit_rst_stream(s.session, NGHTTP2_FLAG_NONE, stream,
                                  static_cast<std::uint32_t>(code));
    }
}

bool client_session::receive(std::span<const char> bytes, clock::time_point now) {
    impl_->now = now; // the time a PING ACK that comes now arrived at
    return impl_->receive(bytes, now);
}

std::span<const char> client_session::take_output() {
    return impl_->take_output();
}

bool client_session::wants_read() const {
    return impl_->wants_read();
}

bool client_session::wants_write() const {
    return impl_->wants_write();
}

end_reason client_session::ended() const noexcept {
    return impl_->ended();
}

bool client_session::can_open_stream() const {
    const auto& s = *impl_;
    return !s.goaway_received && !s.goaway_sent && !s.local_end && ended() == end_reason::none &&
           nghttp2_session_check_request_allowed(s.session) != 0 &&
           s.streams.size() < peer_max_concurrent_streams();
}

std::size_t client_session::open_streams() const {
    return impl_->streams.size();
}

std::uint32_t client_session::peer_max_concurrent_streams() const {
    return nghttp2_session_get_remote_settings(impl_->session,
                                               NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
}

void client_session::ping(clock::time_point now) {
    auto& s = *impl_;
    if (s.ping_at || s.local_end || s.reason != end_reason::none) {
        return;
    }
    if (nghttp2_submit_ping(s.session, NGHTTP2_FLAG_NONE, nullptr) == 0) {
        s.ping_at = now;
    }
}

std::optional<clock::time_point> client_session::ping_sent() const {
    return impl_->ping_at;
}

std::optional<clock::time_point> client_session::last_ping_ack() const {
    return impl_->ping_ack_at;
}

void client_session::shutdown() {
    auto& s = *impl_;
    if (s.goaway_sent || s.local_end) {
        return;
    }
    s.goaway_sent = true;
    nghttp2_submit_goaway(s.session, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, nullptr, 0);
}

void client_session::terminate(error_code code) {
    auto& s = *impl_;
    if (s.stop_in_recv(code) || s.local_end) {
        return;
    }
    s.local_end = true;
    s.terminate_with(code);
    s.tell();
}

} // namespace onceproxy::h2
