// The YAML config reader: any text is either a config or a list of located errors, never a
// crash or another exception.
#include "onceproxy/config/load.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        (void)onceproxy::config::load_string(std::string(reinterpret_cast<const char*>(data), size),
                                             "fuzz.yaml");
    } catch (const onceproxy::config::config_errors& e) {
        if (e.errors().empty()) {
            __builtin_trap();
        }
    }
    return 0;
}
