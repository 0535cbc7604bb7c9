#include "onceproxy/h2/client_session.hpp"

#include "h2/frame_budget.hpp"
#include "h2/nv.hpp"
#include "h2/session_io.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <utility>

namespace onceproxy::h2 {

namespace {

/// SETTINGS ACK and PING ACK frames nghttp2 may hold unsent before it calls it a flood.
constexpr std::size_t max_outbound_ack = 256;
/// Entries one SETTINGS frame may carry.
constexpr std::size_t max_settings_entries = 32;
/// Interim (1xx) responses one stream may take before it fails.
constexpr int max_interim = 16;
/// The server's SETTINGS_MAX_CONCURRENT_STREAMS until its SETTINGS arrive.
constexpr std::uint32_t initial_peer_streams = 100;

constexpr std::uint32_t max_window = (1U << 31) - 1;

} // namespace

struct client_session::impl {
    struct stream_state {
        bool sent = false;         // the request's HEADERS were framed
        bool head_done = false;    // on_response was called
        bool in_trailers = false;  // a header block after the final response's is being read
        bool peer_refused = false; // the server's RST_STREAM REFUSED_STREAM
        // The code the stream closes with, whatever nghttp2 says: we reset it for a bad
        // response, or the caller reset it before the request left.
        std::optional<error_code> failed;
        unsigned status = 0;
        std::vector<field> fields; // of the header block being read
        std::size_t block_bytes = 0;
        bool too_large = false;
        int interim = 0;            // 1xx responses skipped
        std::size_t unconsumed = 0; // response body bytes given to on_data, not consumed yet
        // Request body.
        std::string body;
        std::size_t body_at = 0; // framed up to here
        bool body_ended = false;
        bool deferred = false; // the data provider returned NGHTTP2_ERR_DEFERRED
        std::vector<field> body_trailers;
    };

    struct closing {
        std::int32_t id;
        error_code code;
        bool refused;
    };

    client_events& ev;
    client_limits lim;
    nghttp2_session* session = nullptr;
    std::map<std::int32_t, stream_state> streams;

    std::string pending; // framed, not handed out yet
    std::string handed;  // the last take_output()

    end_reason reason = end_reason::none;
    bool recv_broken = false;
    bool send_broken = false;

    // A stop decided inside a receive callback (see server_session).
    bool stop = false;
    error_code stop_code = error_code::no_error;
    end_reason stop_reason = end_reason::none;
    std::exception_ptr error;
    bool in_recv = false;
    bool local_end = false; // terminate() was called, or the session was stopped
    error_code end_code = error_code::no_error; // what the streams left at the end close with

    bool goaway_received = false;
    std::int32_t goaway_last_id = 0;
    bool goaway_sent = false; // shutdown()

    clock::time_point now;
    std::optional<clock::time_point> ping_at;
    std::optional<clock::time_point> ping_ack_at;

    frame_budget budget;

    std::size_t connection_debt = 0; // body bytes dropped or left unconsumed: give them back
    std::vector<std::int32_t> room;
    std::vector<closing> closed; // not told to the caller yet

    impl(client_events& e, const client_limits& l, clock::time_point t)
        : ev(e), lim(l), now(t),
          budget(t, l.max_control_frames_per_second, l.max_control_frames_per_second) {}

    ~impl() { nghttp2_session_del(session); }

    stream_state* find(std::int32_t id) {
        const auto it = streams.find(id);
        return it == streams.end() ? nullptr : &it->second;
    }

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
        nghttp2_session_terminate_session(session, static_cast<std::uint32_t>(code));
    }

    void pay_debt() {
        if (connection_debt > 0 && !send_broken) {
            nghttp2_session_consume_connection(session, connection_debt);
            connection_debt = 0;
        }
    }

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

    bool wants_read() const {
        return !recv_broken && reason == end_reason::none &&
               nghttp2_session_want_read(session) != 0;
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
        if (room.empty()) {
            return;
        }
        auto ids = std::move(room);
        room.clear();
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        for (const auto id : ids) {
            if (streams.contains(id)) {
                ev.on_send_room(id);
            }
        }
    }

    // Ends the stream for a bad response: RST_STREAM PROTOCOL_ERROR, closed with that code.
    void fail_stream(std::int32_t id, stream_state& st) {
        if (!st.failed) {
            st.failed = error_code::protocol_error;
            nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_PROTOCOL_ERROR);
        }
    }

    // ---- nghttp2 callbacks

    static impl& self(void* p) { return *static_cast<impl*>(p); }

    static int on_begin_frame(nghttp2_session*, const nghttp2_frame_hd* hd, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        return s.check(s.budget.count(*hd));
    }

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
                if (frame->hd.length > 0 && frame->hd.length <= frame->data.padlen && !end_stream) {
                    if (const int rv = s.check(s.budget.count_control()); rv != 0) {
                        return rv;
                    }
                }
                if (auto* st = s.find(id);
                    end_stream && st != nullptr && st->head_done && !st->failed) {
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

    static int on_data_chunk_recv(nghttp2_session*, std::uint8_t, std::int32_t id,
                                  const std::uint8_t* data, std::size_t len, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        auto* st = s.find(id);
        if (st == nullptr || !st->head_done || st->failed) {
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
        if (frame->hd.type == NGHTTP2_DATA) {
            s.budget.earn(updates_per_data_frame);
        }
        if (frame->hd.type == NGHTTP2_HEADERS) {
            if (auto* st = s.find(frame->hd.stream_id); st != nullptr) {
                st->sent = true;
            }
        }
        // A GOAWAY with an error that we did not decide on: nghttp2 found the server broke
        // the protocol.
        if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code != NGHTTP2_NO_ERROR &&
            s.reason == end_reason::none && !s.local_end) {
            s.reason = end_reason::protocol_error;
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

    void resume(std::int32_t id, stream_state& st) {
        if (st.deferred) {
            st.deferred = false;
            nghttp2_session_resume_data(session, id);
        }
    }
};

client_session::client_session(client_events& ev, const client_limits& l, clock::time_point now)
    : impl_(std::make_unique<impl>(ev, l, now)) {
    nghttp2_session_callbacks* cbs = nullptr;
    if (nghttp2_session_callbacks_new(&cbs) != 0) {
        throw std::bad_alloc();
    }
    nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, &impl::on_begin_frame);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &impl::on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, &impl::on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &impl::on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &impl::on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &impl::on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, &impl::on_frame_send);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, &impl::on_frame_not_send);

    nghttp2_option* opt = nullptr;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cbs);
        throw std::bad_alloc();
    }
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_max_outbound_ack(opt, max_outbound_ack);
    nghttp2_option_set_max_settings(opt, max_settings_entries);
    nghttp2_option_set_max_continuations(opt, max_continuations);
    nghttp2_option_set_peer_max_concurrent_streams(opt, initial_peer_streams);

    const int rv = nghttp2_session_client_new2(&impl_->session, cbs, impl_.get(), opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) {
        throw std::bad_alloc();
    }

    const auto header_list = static_cast<std::uint32_t>(
        std::min<std::size_t>(l.max_header_bytes, std::numeric_limits<std::uint32_t>::max()));
    const std::array<nghttp2_settings_entry, 5> settings{{
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, std::min(l.stream_window, max_window)},
        {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, l.header_table_size},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, header_list},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    }};
    nghttp2_submit_settings(impl_->session, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
    nghttp2_session_set_local_window_size(
        impl_->session, NGHTTP2_FLAG_NONE, 0,
        static_cast<std::int32_t>(std::min(l.connection_window, max_window)));
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
    auto& s = *impl_;
    auto* st = s.find(stream);
    if (st == nullptr || st->body_ended || bytes.empty()) {
        return;
    }
    if (st->body_at > 0 && st->body_at >= st->body.size() / 2) {
        st->body.erase(0, st->body_at);
        st->body_at = 0;
    }
    st->body.append(bytes);
    s.resume(stream, *st);
}

void client_session::end_body(std::int32_t stream, const std::vector<field>& trailers) {
    auto& s = *impl_;
    auto* st = s.find(stream);
    if (st == nullptr || st->body_ended) {
        return;
    }
    st->body_ended = true;
    st->body_trailers = trailers;
    s.resume(stream, *st);
}

std::size_t client_session::queued(std::int32_t stream) const {
    const auto it = impl_->streams.find(stream);
    return it == impl_->streams.end() ? 0 : it->second.body.size() - it->second.body_at;
}

void client_session::consume(std::int32_t stream, std::size_t n) {
    auto& s = *impl_;
    auto* st = s.find(stream);
    if (st == nullptr) {
        return; // closed: what it had not consumed was given back then
    }
    n = std::min(n, st->unconsumed);
    st->unconsumed -= n;
    if (n > 0) {
        nghttp2_session_consume(s.session, stream, n);
    }
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
    auto& s = *impl_;
    if (s.recv_broken || s.reason != end_reason::none) {
        return false;
    }
    s.now = now;
    s.budget.roll(now);
    detail::feed(s, bytes);
    return ended() == end_reason::none;
}

std::span<const char> client_session::take_output() {
    return detail::hand_output(*impl_);
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
    if (s.in_recv) {
        // Inside a receive callback: stop reading, end once mem_recv returns.
        s.fail(end_reason::none, code);
        return;
    }
    if (s.local_end) {
        return;
    }
    s.local_end = true;
    s.terminate_with(code);
    s.tell();
}

} // namespace onceproxy::h2
