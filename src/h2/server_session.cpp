#include "onceproxy/h2/server_session.hpp"

#include "h2/session_core.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

namespace onceproxy::h2 {

namespace {

bool is_defence(end_reason r) {
    return r == end_reason::rapid_reset || r == end_reason::control_flood ||
           r == end_reason::header_flood;
}

} // namespace

struct server_stream : detail::stream_core {
    request_head head;
    std::vector<field> trailers;

    // The request's body goes to the caller: its head did.
    bool body_to_caller() const { return head_done; }
};

struct server_session::impl
    : detail::session_core<impl, std::unordered_map<std::int32_t, server_stream>> {
    events& ev;
    limits lim;
    std::vector<std::pair<std::int32_t, error_code>> closed; // not told to the caller yet

    impl(events& e, const limits& l, clock::time_point now)
        : session_core({now, l.max_resets_per_second, l.max_control_frames_per_second}), ev(e),
          lim(l) {}

    // A defence's verdict (frame_budget), from a receive callback.
    int check(end_reason r) {
        return r == end_reason::none ? 0 : fail(r, error_code::enhance_your_calm);
    }

    // The events nghttp2 left for after its return: streams closed, room to send.
    void tell() {
        auto gone = std::move(closed);
        closed.clear();
        for (const auto& [id, code] : gone) {
            ev.on_stream_close(id, code);
        }
        tell_room();
    }

    bool reading() const {
        return !recv_broken && !is_defence(reason) && reason != end_reason::protocol_error;
    }

    // ---- nghttp2 callbacks (receive side: may fail; send side: never throw, never call out)

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
                if (const int rv = s.check_padding(*frame); rv != 0) {
                    return rv;
                }
                auto* st = s.find(id);
                if (end_stream && st != nullptr && st->body_to_caller()) {
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
        self(user).note_sent(*frame);
        return 0;
    }
};

server_session::server_session(events& ev, const limits& l, clock::time_point now)
    : impl_(std::make_unique<impl>(ev, l, now)) {
    impl_->open(&nghttp2_session_server_new2, l,
                {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, l.max_concurrent_streams},
                [&l](nghttp2_session_callbacks*, nghttp2_option* opt) {
                    // Our own counts decide (header_flood, rapid_reset); nghttp2's stay as a
                    // backstop that a peer within our budgets never reaches.
                    const std::uint64_t resets =
                        std::max<std::uint64_t>(l.max_resets_per_second, 1);
                    nghttp2_option_set_stream_reset_rate_limit(opt, 4 * resets, 2 * resets);
                });
}

server_session::~server_session() = default;

bool server_session::receive(std::span<const char> bytes, clock::time_point now) {
    return impl_->receive(bytes, now);
}

std::span<const char> server_session::take_output() {
    return impl_->take_output();
}

bool server_session::wants_read() const {
    return impl_->wants_read();
}

bool server_session::wants_write() const {
    return impl_->wants_write();
}

end_reason server_session::ended() const noexcept {
    return impl_->ended();
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
    impl_->push_body(stream, bytes);
}

void server_session::end_body(std::int32_t stream, const std::vector<field>& trailers) {
    impl_->end_body(stream, trailers);
}

std::size_t server_session::queued(std::int32_t stream) const {
    return impl_->queued(stream);
}

void server_session::reset(std::int32_t stream, error_code code) {
    nghttp2_submit_rst_stream(impl_->session, NGHTTP2_FLAG_NONE, stream,
                              static_cast<std::uint32_t>(code));
}

void server_session::consume(std::int32_t stream, std::size_t n) {
    impl_->consume(stream, n);
}

void server_session::shutdown() {
    auto& s = *impl_;
    nghttp2_submit_goaway(s.session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(s.session), NGHTTP2_NO_ERROR,
                          nullptr, 0);
}

void server_session::terminate(error_code code) {
    auto& s = *impl_;
    if (s.stop_in_recv(code)) {
        return;
    }
    s.local_end = true;
    s.terminate_with(code);
}

std::size_t server_session::open_streams() const {
    return impl_->streams.size();
}

} // namespace onceproxy::h2
