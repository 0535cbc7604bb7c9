// The Idempotency-Key parser (RFC 9651 sf-string and lenient forms): the input is split into
// header lines at '\n'. A key that parses must be printable ASCII within the length limit.
#include "onceproxy/core/idempotency_key.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view input(reinterpret_cast<const char*>(data), size);
    std::vector<std::string_view> lines;
    while (!input.empty()) {
        const auto nl = input.find('\n');
        lines.push_back(input.substr(0, nl));
        input = nl == std::string_view::npos ? std::string_view{} : input.substr(nl + 1);
    }
    for (auto syntax :
         {onceproxy::config::key_syntax::strict, onceproxy::config::key_syntax::lenient}) {
        const auto r = onceproxy::core::parse_idempotency_key(lines, syntax, 64);
        if (r.ok() == r.error.has_value()) {
            std::abort(); // exactly one of key and error
        }
        if (r.key) {
            if (r.key->empty() || r.key->size() > 64) {
                std::abort();
            }
            for (const char c : *r.key) {
                if (c < 0x20 || c > 0x7e) {
                    std::abort();
                }
            }
        }
    }
    return 0;
}
