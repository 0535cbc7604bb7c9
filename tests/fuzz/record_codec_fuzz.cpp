// The stored record format: arbitrary bytes never crash the decoder nor the opener of sealed
// records, whatever decodes encodes back to a record that decodes to the same thing (round
// trip), and a sealed record opens to exactly what was sealed.
#include "onceproxy/core/record_cipher.hpp"
#include "onceproxy/core/response_record.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace onceproxy::core;
    static const record_cipher cipher({{"k1", std::string(32, 'k')}});
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    // Arbitrary bytes presented as a sealed record never open (a forged tag would be a break).
    if (cipher.open(in, "store-key") || decode_stored_record(in, &cipher, {"store-key"})) {
        std::abort();
    }
    const auto rec = decode_record(in);
    if (!rec) {
        return 0;
    }
    const auto again = decode_record(encode_record(*rec));
    if (!again || again->status != rec->status || again->headers != rec->headers ||
        again->body != rec->body || again->replayable != rec->replayable) {
        std::abort();
    }
    const auto sealed = encode_stored_record(*rec, &cipher, {"store-key"});
    const auto opened = decode_stored_record(sealed, &cipher, {"store-key"});
    if (!opened || opened->body != rec->body || opened->headers != rec->headers ||
        decode_stored_record(sealed, &cipher, {"other-key"})) {
        std::abort();
    }
    return 0;
}
