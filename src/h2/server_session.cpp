#include "onceproxy/h2/server_session.hpp"

#include "h2/frame_budget.hpp"
#include "h2/nv.hpp"
#include "h2/session_io.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <unordered_map>
#include <utility>

namespace onceproxy::h2 {

namespace {

/// SETTINGS ACK and PING ACK frames nghttp2 may hold unsent before it calls it a flood.
constexpr std::size_t max_outbound_ack = 256;
/// Entries one SETTINGS frame may carry.
constexpr std::size_t max_settings_entries = 32;

constexpr std::uint32_t max_window = (1U << 31) - 1;

bool is_defence(end_reason r) {
    return r == end_reason::rapid_reset || r == end_reason::control_flood ||
           r == end_reason::header_flood;
}

} // namespace

struct server_session::impl {
    struct stream_state {
        request_head head;
        bool head_done = false;   // on_request was called
        bool in_trailers = false; // a second header block is being read
        std::vector<field> trailers;
        std::size_t block_bytes = 0; // of the header block being read
        std::size_t unconsumed = 0;  // request body bytes given to on_data, not consumed yet
        // Response body.
        std::string body;
        std::size_t body_at = 0; // framed up to here
        bool body_ended = false;
        bool deferred = false; // the data provider returned NGHTTP2_ERR_DEFERRED
        std::vector<field> body_trailers;
    };

    events& ev;
    limits lim;
    nghttp2_session* session = nullptr;
    std::unordered_map<std::int32_t, stream_state> streams;

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
    bool local_end = false; // terminate() was called: its GOAWAY is not the peer's fault

    frame_budget budget;

    std::size_t connection_debt = 0; // body bytes dropped or left unconsumed: give them back
    std::vector<std::int32_t> room;  // streams whose queue the data provider took bytes from
    std::vector<std::pair<std::int32_t, error_code>> closed; // not told to the caller yet

    impl(events& e, const limits& l, clock::time_point now)
        : ev(e), lim(l), budget(now, l.max_resets_per_second, l.max_control_frames_per_second) {}

    ~impl() { nghttp2_session_del(session); }

    stream_state* find(std::int32_t id) {
        const auto it = streams.find(id);
        return it == streams.end() ? nullptr : &it->second;
    }

    // Ends the connection with GOAWAY `code` (once).
    void terminate_with(error_code code) {
        nghttp2_session_terminate_session(session, static_cast<std::uint32_t>(code));
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

    // A defence's verdict (frame_budget), from a receive callback.
    int check(end_reason r) {
        return r == end_reason::none ? 0 : fail(r, error_code::enhance_your_calm);
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

    // The events nghttp2 left for after its return: streams closed, room to send.
    void tell() {
        auto gone = std::move(closed);
        closed.clear();
        for (const auto& [id, code] : gone) {
            ev.on_stream_close(id, code);
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

    bool wants_read() const {
        return !recv_broken && !is_defence(reason) && reason != end_reason::protocol_error &&
               nghttp2_session_want_read(session) != 0;
    }

    bool wants_write() const {
        return !pending.empty() || (!send_broken && nghttp2_session_want_write(session) != 0);
    }

    // ---- nghttp2 callbacks (receive side: may fail; send side: never throw, never call out)

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
        try {
            const auto id = frame->hd.stream_id;
            if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
                s.streams.try_emplace(id);
            } else if (auto* st = s.find(id); st != nullptr && st->head_done) {
                st->in_trailers = true;
                st->block_bytes = 0;
            }
            return 0;
        } catch (...) {
            return s.fail(std::current_exception());
        }
    }

    static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name,
                         std::size_t namelen, const std::uint8_t* value, std::size_t valuelen,
                         std::uint8_t, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        auto* st = s.find(frame->hd.stream_id);
        if (st == nullptr) {
            return 0;
        }
        st->block_bytes += namelen + valuelen + 32;
        if (st->block_bytes > 4 * s.lim.max_header_bytes) {
            return s.fail(end_reason::header_flood, error_code::enhance_your_calm);
        }
        if (st->block_bytes > s.lim.max_header_bytes) {
            if (!st->in_trailers) {
                st->head.too_large = true;
            }
            return 0; // dropped
        }
        try {
            const std::string_view n(reinterpret_cast<const char*>(name), namelen);
            std::string v(reinterpret_cast<const char*>(value), valuelen);
            if (st->in_trailers) {
                st->trailers.push_back({std::string(n), std::move(v)});
                return 0;
            }
            auto& h = st->head;
            if (n == ":method") {
                h.method = std::move(v);
            } else if (n == ":scheme") {
                h.scheme = std::move(v);
            } else if (n == ":authority") {
                h.authority = std::move(v);
            } else if (n == ":path") {
                h.path = std::move(v);
            } else if (n == ":protocol") {
                h.protocol = std::move(v);
            } else {
                h.fields.push_back({std::string(n), std::move(v)});
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
            if (frame->hd.type == NGHTTP2_DATA) {
                // Padding only, no END_STREAM: as empty as a DATA frame of length 0.
                if (frame->hd.length > 0 && frame->hd.length <= frame->data.padlen && !end_stream) {
                    if (const int rv = s.check(s.budget.count_control()); rv != 0) {
                        return rv;
                    }
                }
                auto* st = s.find(id);
                if (end_stream && st != nullptr && st->head_done) {
                    s.ev.on_request_end(id, {});
                }
                return 0;
            }
            if (frame->hd.type != NGHTTP2_HEADERS) {
                return 0;
            }
            auto* st = s.find(id);
            if (st == nullptr) {
                return 0;
            }
            if (!st->head_done) {
                st->head_done = true;
                s.ev.on_request(id, std::move(st->head), end_stream);
            } else if (st->in_trailers && end_stream) {
                st->in_trailers = false;
                s.ev.on_request_end(id, std::move(st->trailers));
            }
            return 0;
        } catch (...) {
            return s.fail(std::current_exception());
        }
    }

    static int on_data_chunk_recv(nghttp2_session*, std::uint8_t, std::int32_t id,
                                  const std::uint8_t* data, std::size_t len, void* user) {
        auto& s = self(user);
        if (s.stop) {
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        auto* st = s.find(id);
        if (st == nullptr || !st->head_done) {
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

    // Also called while framing output (a stream closes once its END_STREAM is sent): the
    // caller is told once nghttp2 has returned (tell_closed).
    static int on_stream_close(nghttp2_session*, std::int32_t id, std::uint32_t code, void* user) {
        auto& s = self(user);
        const auto it = s.streams.find(id);
        if (it == s.streams.end()) {
            return 0;
        }
        s.connection_debt += it->second.unconsumed;
        const bool told = it->second.head_done;
        s.streams.erase(it);
        if (told) {
            try {
                s.closed.emplace_back(id, static_cast<error_code>(code));
            } catch (...) {
                return NGHTTP2_ERR_CALLBACK_FAILURE;
            }
        }
        return 0;
    }

    static int on_frame_send(nghttp2_session*, const nghttp2_frame* frame, void* user) {
        auto& s = self(user);
        if (frame->hd.type == NGHTTP2_DATA) {
            s.budget.earn(updates_per_data_frame); // the client's window updates that follow
        }
        // A GOAWAY with an error that we did not decide on: nghttp2 found the peer broke the
        // protocol.
        if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code != NGHTTP2_NO_ERROR &&
            s.reason == end_reason::none && !s.local_end) {
            s.reason = end_reason::protocol_error;
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
};

server_session::server_session(events& ev, const limits& l, clock::time_point now)
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

    nghttp2_option* opt = nullptr;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cbs);
        throw std::bad_alloc();
    }
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_max_outbound_ack(opt, max_outbound_ack);
    nghttp2_option_set_max_settings(opt, max_settings_entries);
    // Our own counts decide (header_flood, rapid_reset); nghttp2's stay as a backstop that a
    // peer within our budgets never reaches.
    nghttp2_option_set_max_continuations(opt, max_continuations);
    const std::uint64_t resets = std::max<std::uint64_t>(l.max_resets_per_second, 1);
    nghttp2_option_set_stream_reset_rate_limit(opt, 4 * resets, 2 * resets);

    const int rv = nghttp2_session_server_new2(&impl_->session, cbs, impl_.get(), opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) {
        throw std::bad_alloc();
    }

    const auto header_list = static_cast<std::uint32_t>(
        std::min<std::size_t>(l.max_header_bytes, std::numeric_limits<std::uint32_t>::max()));
    const std::array<nghttp2_settings_entry, 5> settings{{
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, l.max_concurrent_streams},
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

server_session::~server_session() = default;

bool server_session::receive(std::span<const char> bytes, clock::time_point now) {
    auto& s = *impl_;
    if (s.recv_broken || is_defence(s.reason) || s.reason == end_reason::protocol_error) {
        return false;
    }
    s.budget.roll(now);
    detail::feed(s, bytes);
    return ended() == end_reason::none;
}

std::span<const char> server_session::take_output() {
    return detail::hand_output(*impl_);
}

bool server_session::wants_read() const {
    return impl_->wants_read();
}

bool server_session::wants_write() const {
    return impl_->wants_write();
}

end_reason server_session::ended() const noexcept {
    const auto& s = *impl_;
    if (s.reason != end_reason::none) {
        return s.reason;
    }
    if (!s.wants_read() && !s.wants_write()) {
        return end_reason::peer_closed;
    }
    return end_reason::none;
}

void server_session::submit_response(std::int32_t stream, unsigned status,
                                     const std::vector<field>& fields, bool end_stream) {
    auto& s = *impl_;
    if (s.find(stream) == nullptr) {
        return;
    }
    std::vector<field> storage{{":status", std::to_string(std::min(status, 999U))}};
    const auto nva = make_nva(fields, storage);
    nghttp2_data_provider provider{};
    provider.read_callback = &impl::read_body;
    nghttp2_submit_response(s.session, stream, nva.data(), nva.size(),
                            end_stream ? nullptr : &provider);
}

void server_session::push_body(std::int32_t stream, std::string_view bytes) {
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
    if (st->deferred) {
        st->deferred = false;
        nghttp2_session_resume_data(s.session, stream);
    }
}

void server_session::end_body(std::int32_t stream, const std::vector<field>& trailers) {
    auto& s = *impl_;
    auto* st = s.find(stream);
    if (st == nullptr || st->body_ended) {
        return;
    }
    st->body_ended = true;
    st->body_trailers = trailers;
    if (st->deferred) {
        st->deferred = false;
        nghttp2_session_resume_data(s.session, stream);
    }
}

std::size_t server_session::queued(std::int32_t stream) const {
    const auto it = impl_->streams.find(stream);
    return it == impl_->streams.end() ? 0 : it->second.body.size() - it->second.body_at;
}

void server_session::reset(std::int32_t stream, error_code code) {
    nghttp2_submit_rst_stream(impl_->session, NGHTTP2_FLAG_NONE, stream,
                              static_cast<std::uint32_t>(code));
}

void server_session::consume(std::int32_t stream, std::size_t n) {
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

void server_session::shutdown() {
    auto& s = *impl_;
    nghttp2_submit_goaway(s.session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(s.session), NGHTTP2_NO_ERROR,
                          nullptr, 0);
}

void server_session::terminate(error_code code) {
    auto& s = *impl_;
    if (s.in_recv) {
        // Inside a receive callback: stop reading, end once mem_recv returns.
        s.fail(end_reason::none, code);
        return;
    }
    s.local_end = true;
    s.terminate_with(code);
}

std::size_t server_session::open_streams() const {
    return impl_->streams.size();
}

} // namespace onceproxy::h2
