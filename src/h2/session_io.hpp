#pragma once
// The receive and output steps both sessions take the same way, over their own state: the
// client's and the server's impl name these members alike (session, budget, in_recv,
// recv_broken, stop, stop_code, stop_reason, reason, local_end, pending, handed, error,
// frame_into, terminate_with, tell).

#include "onceproxy/h2/common.hpp"

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <utility>

namespace onceproxy::h2::detail {

/// receive() frames output up to this much on its own (to see a GOAWAY nghttp2 decided on);
/// take_output() frames up to this much per call.
inline constexpr std::size_t output_batch = 64 * 1024;

/// Feeds `bytes` to nghttp2. A failure ends the session: a stop a callback asked for with its
/// code and reason, a flood (too many queued ACKs, too many CONTINUATION frames) with
/// ENHANCE_YOUR_CALM, anything else with PROTOCOL_ERROR. Then frames what is due and tells the
/// caller what happened; an exception a callback caught is rethrown here.
template <class Impl>
void feed(Impl& s, std::span<const char> bytes) {
    s.in_recv = true;
    const auto rv = nghttp2_session_mem_recv(
        s.session, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    s.in_recv = false;
    if (rv < 0 || s.stop) {
        s.recv_broken = rv < 0;
        error_code code = error_code::protocol_error;
        end_reason why = end_reason::protocol_error;
        if (s.stop) {
            code = s.stop_code;
            why = s.stop_reason;
        } else if (rv == NGHTTP2_ERR_FLOODED) {
            code = error_code::enhance_your_calm;
            why = end_reason::control_flood;
        } else if (rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS) {
            code = error_code::enhance_your_calm;
            why = end_reason::header_flood;
        }
        if (why != end_reason::none) {
            if (s.reason == end_reason::none) {
                s.reason = why;
            }
        } else {
            s.local_end = true;
        }
        s.stop = false;
        s.terminate_with(code);
    }
    s.frame_into(s.pending, output_batch);
    if (s.error) {
        std::rethrow_exception(std::exchange(s.error, nullptr));
    }
    s.tell();
}

/// The bytes to write next: what receive() framed, then up to output_batch more.
template <class Impl>
std::span<const char> hand_output(Impl& s) {
    s.handed.clear();
    s.handed.swap(s.pending);
    s.frame_into(s.handed, output_batch);
    if (s.error) {
        std::rethrow_exception(std::exchange(s.error, nullptr));
    }
    s.tell();
    return {s.handed.data(), s.handed.size()};
}

} // namespace onceproxy::h2::detail
