// RFC 8785 canonical JSON and JSON Pointer extraction. Properties: canonicalising a canonical
// form gives it back unchanged (in both number forms), and a valid document's canonical form
// is valid JSON again.
#include "onceproxy/core/canonical_json.hpp"
#include "onceproxy/core/idempotency_key.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using onceproxy::core::canonicalize_json;
    using onceproxy::core::number_form;
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    for (auto form : {number_form::rfc8785, number_form::distinct}) {
        const auto once = canonicalize_json(input, form);
        if (!once) {
            continue;
        }
        const auto twice = canonicalize_json(*once, form);
        if (!twice || *twice != *once) {
            std::abort();
        }
    }
    (void)onceproxy::core::extract_json_pointer(input, "/id");
    (void)onceproxy::core::extract_json_pointer(input, "/data/object/id");
    return 0;
}
