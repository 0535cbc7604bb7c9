// A client's HTTP/2 bytes as the server session takes them: the connection preface, then the
// input's frames (after its first byte) in pieces whose size the first byte sets, the clock
// moving 100 ms a piece. The caller answers every request with a small body (trailers on odd
// streams), resets every fourth stream once its body starts, consumes request bodies as they
// come, and writes all output after each read, as the connection shell does.
#include "onceproxy/h2/server_session.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

namespace h2 = onceproxy::h2;

struct answering : h2::events {
    h2::server_session* session = nullptr;

    void on_request(std::int32_t stream, h2::request_head&& head, bool) override {
        session->submit_response(stream, head.too_large ? 431 : 200,
                                 {{"content-type", "text/plain"}, {"x-path", head.path}}, false);
        session->push_body(stream, "hello");
        if (stream % 8 == 7) {
            session->reset(stream, h2::error_code::cancel);
            return;
        }
        if (stream % 4 == 1) {
            session->end_body(stream, {{"x-trailer", head.method}});
        } else {
            session->end_body(stream);
        }
    }
    void on_data(std::int32_t stream, std::span<const char> bytes) override {
        session->consume(stream, bytes.size());
    }
    void on_request_end(std::int32_t, std::vector<h2::field>&&) override {}
    void on_stream_close(std::int32_t, h2::error_code) override {}
    void on_send_room(std::int32_t stream) override { (void)session->queued(stream); }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    const std::size_t piece = 1 + data[0] % 128;
    h2::limits lim;
    lim.max_header_bytes = 4096;
    lim.max_concurrent_streams = 16;
    lim.stream_window = 65535;
    lim.max_resets_per_second = 50;
    lim.max_control_frames_per_second = 200;
    answering ev;
    h2::clock::time_point now{};
    h2::server_session session(ev, lim, now);
    ev.session = &session;

    const auto drain = [&] {
        for (int i = 0; i < 1000 && !session.take_output().empty(); ++i) {
        }
    };
    constexpr std::string_view preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    bool open = session.receive({preface.data(), preface.size()}, now);
    drain();
    for (std::size_t at = 1; open && at < size; at += piece) {
        now += std::chrono::milliseconds(100);
        const auto n = std::min(piece, size - at);
        open = session.receive({reinterpret_cast<const char*>(data + at), n}, now);
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
