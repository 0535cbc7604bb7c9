#pragma once
// Per-connection, per-second counts of the frames a hostile peer floods with (SECURITY.md),
// for both sides of a connection: RST_STREAM frames (rapid reset, CVE-2023-44487), control
// frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY) and empty DATA frames, and the CONTINUATION
// frames of one header block (CVE-2024-27316).

#include "onceproxy/h2/common.hpp"

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>

namespace onceproxy::h2 {

/// CONTINUATION frames one header block may take before the connection ends (header_flood).
constexpr std::size_t max_continuations = 128;

/// WINDOW_UPDATE frames a DATA frame we send may earn the peer (its stream's and the
/// connection's) on top of the control frame budget: a fast transfer is no flood.
constexpr std::uint32_t updates_per_data_frame = 2;

class frame_budget {
public:
    frame_budget(clock::time_point now, std::uint32_t max_resets, std::uint32_t max_control)
        : window_start_(now), max_resets_(max_resets), max_control_(max_control) {}

    /// A new second starts the counts again.
    void roll(clock::time_point now) {
        if (now - window_start_ >= std::chrono::seconds(1) || now < window_start_) {
            window_start_ = now;
            resets_ = 0;
            control_frames_ = 0;
            earned_ = 0;
        }
    }

    /// `n` more control frames are fine this second: the peer answers what we sent (the
    /// WINDOW_UPDATE frames a fast upload earns).
    void earn(std::uint32_t n) { earned_ += n; }

    /// A frame header was read: end_reason::none while within the budgets, else why the
    /// connection ends.
    end_reason count(const nghttp2_frame_hd& hd) {
        switch (hd.type) {
        case NGHTTP2_HEADERS:
            continuations_ = 0;
            return end_reason::none;
        case NGHTTP2_CONTINUATION:
            return ++continuations_ > max_continuations ? end_reason::header_flood
                                                        : end_reason::none;
        case NGHTTP2_RST_STREAM:
            return ++resets_ > max_resets_ ? end_reason::rapid_reset : end_reason::none;
        case NGHTTP2_SETTINGS:
        case NGHTTP2_PING:
        case NGHTTP2_WINDOW_UPDATE:
        case NGHTTP2_PRIORITY:
            return count_control();
        case NGHTTP2_DATA:
            if (hd.length == 0 && (hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
                return count_control();
            }
            return end_reason::none;
        default:
            return end_reason::none;
        }
    }

    /// A frame as empty as an empty DATA frame (padding only, no END_STREAM).
    end_reason count_control() {
        return ++control_frames_ > max_control_ + earned_ ? end_reason::control_flood
                                                          : end_reason::none;
    }

private:
    clock::time_point window_start_;
    std::uint32_t max_resets_;
    std::uint32_t max_control_;
    std::uint32_t resets_ = 0;
    std::uint32_t control_frames_ = 0;
    std::uint64_t earned_ = 0;
    std::size_t continuations_ = 0; // of the header block being read
};

} // namespace onceproxy::h2
