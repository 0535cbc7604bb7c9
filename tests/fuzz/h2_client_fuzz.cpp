// An upstream's HTTP/2 bytes as the client session takes them: three requests are submitted
// first (one without a body, one with a body and trailers, one with a body), then the input's
// frames (after its first byte) in pieces whose size the first byte sets, the clock moving
// 100 ms a piece. The caller consumes response bodies as they come, resets every third
// stream once its body starts, opens a new request whenever one closes and the session lets
// it (at most 64 in all), pings now and then, and takes all output after each read, as the
// upstream pool does.
#include "onceproxy/h2/client_session.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

namespace h2 = onceproxy::h2;

struct upstream_side : h2::client_events {
    h2::client_session* session = nullptr;
    int opened = 0;
    int closed = 0;

    void open(bool body) {
        if (opened >= 64 || !session->can_open_stream()) {
            return;
        }
        const auto id =
            session->submit_request("POST", "http", "app", "/pay",
                                    {{"content-type", "application/grpc"}, {"x-n", "1"}}, !body);
        if (!id) {
            return;
        }
        ++opened;
        if (body) {
            session->push_body(*id, std::string_view("\0\0\0\0\x05"
                                                     "hello",
                                                     10));
            session->end_body(*id, opened % 2 == 0 ? std::vector<h2::field>{{"x-t", "1"}}
                                                   : std::vector<h2::field>{});
        }
    }

    void on_response(std::int32_t, unsigned, std::vector<h2::field>&&, bool) override {}
    void on_data(std::int32_t stream, std::span<const char> bytes) override {
        session->consume(stream, bytes.size());
        if (stream % 3 == 0) {
            session->reset(stream, h2::error_code::cancel);
        }
    }
    void on_response_end(std::int32_t, std::vector<h2::field>&&) override {}
    void on_stream_close(std::int32_t, h2::error_code, bool) override {
        ++closed;
        open(closed % 2 == 0);
    }
    void on_send_room(std::int32_t stream) override { (void)session->queued(stream); }
    void on_goaway(std::int32_t, h2::error_code) override {}
    void on_ping_ack() override {}
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    const std::size_t piece = 1 + data[0] % 128;
    h2::client_limits lim;
    lim.max_header_bytes = 4096;
    lim.stream_window = 65535;
    lim.connection_window = 65535;
    lim.max_control_frames_per_second = 200;
    upstream_side ev;
    h2::clock::time_point now{};
    h2::client_session session(ev, lim, now);
    ev.session = &session;
    const auto drain = [&] {
        for (int i = 0; i < 1000 && !session.take_output().empty(); ++i) {
        }
    };
    ev.open(false);
    ev.open(true);
    ev.open(true);
    drain();
    bool open = true;
    int pieces = 0;
    for (std::size_t at = 1; open && at < size; at += piece) {
        now += std::chrono::milliseconds(100);
        const auto n = std::min(piece, size - at);
        open = session.receive({reinterpret_cast<const char*>(data + at), n}, now);
        if (open && ++pieces % 16 == 0) {
            session.ping(now);
        }
        drain();
    }
    if (open) {
        session.shutdown();
        drain();
    }
    (void)session.wants_read();
    (void)session.wants_write();
    (void)session.ended();
    (void)session.open_streams();
    return 0;
}
