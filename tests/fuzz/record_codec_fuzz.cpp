// The stored record format: arbitrary bytes never crash the decoder, and whatever decodes
// encodes back to a record that decodes to the same thing (round trip).
#include "onceproxy/core/response_record.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace onceproxy::core;
    const auto rec = decode_record(std::string_view(reinterpret_cast<const char*>(data), size));
    if (!rec) {
        return 0;
    }
    const auto again = decode_record(encode_record(*rec));
    if (!again || again->status != rec->status || again->headers != rec->headers ||
        again->body != rec->body || again->replayable != rec->replayable) {
        std::abort();
    }
    return 0;
}
