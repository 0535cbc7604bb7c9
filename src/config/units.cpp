// parse_duration / parse_size: the two unit grammars of the YAML file (SPEC §4).
// Both are strict: an integer written in ASCII digits, then a unit from a fixed list, nothing
// else (no sign, no spaces, no fractions), and a value that does not fit is rejected rather
// than wrapped.

#include "onceproxy/config/load.hpp"

#include <array>
#include <charconv>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

namespace onceproxy::config {
namespace {

/// Splits "123unit" into its digits and the rest; false when there are no leading digits or
/// the number does not fit in 64 bits.
bool split_number(std::string_view text, std::uint64_t& number, std::string_view& unit) {
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
        ++digits;
    }
    if (digits == 0) {
        return false;
    }
    const auto* first = text.data();
    const auto [ptr, ec] = std::from_chars(first, first + digits, number);
    if (ec != std::errc{} || ptr != first + digits) {
        return false;
    }
    unit = text.substr(digits);
    return true;
}

struct unit_factor {
    std::string_view unit;
    std::uint64_t factor;
};

/// `text` as a number and one of `units`, scaled by its factor; nullopt when it is malformed,
/// has another unit, or the value exceeds `limit`.
std::optional<std::uint64_t> parse_scaled(std::string_view text, std::span<const unit_factor> units,
                                          std::uint64_t limit) {
    std::uint64_t number = 0;
    std::string_view unit;
    if (!split_number(text, number, unit)) {
        return std::nullopt;
    }
    for (const auto& u : units) {
        if (u.unit == unit) {
            if (u.factor != 0 && number > limit / u.factor) {
                return std::nullopt;
            }
            return number * u.factor;
        }
    }
    return std::nullopt;
}

} // namespace

std::optional<duration> parse_duration(std::string_view text) {
    // A unit is mandatory: "30" could mean seconds or milliseconds, and guessing wrong turns a
    // 30 s lease into 30 ms.
    static constexpr std::array<unit_factor, 5> units{{
        {"ms", 1},
        {"s", 1000},
        {"m", 60ULL * 1000},
        {"h", 3600ULL * 1000},
        {"d", 24ULL * 3600 * 1000},
    }};
    const auto ms = parse_scaled(
        text, units, static_cast<std::uint64_t>(std::numeric_limits<duration::rep>::max()));
    if (!ms) {
        return std::nullopt;
    }
    return duration{static_cast<duration::rep>(*ms)};
}

std::optional<std::size_t> parse_size(std::string_view text) {
    // IEC units are powers of 1024, SI units powers of 1000, as their names say; a bare number
    // (or B) is bytes.
    static constexpr std::array<unit_factor, 10> units{{
        {"", 1},
        {"B", 1},
        {"KiB", 1ULL << 10},
        {"MiB", 1ULL << 20},
        {"GiB", 1ULL << 30},
        {"TiB", 1ULL << 40},
        {"KB", 1000ULL},
        {"MB", 1000ULL * 1000},
        {"GB", 1000ULL * 1000 * 1000},
        {"TB", 1000ULL * 1000 * 1000 * 1000},
    }};
    const auto bytes = parse_scaled(text, units, std::numeric_limits<std::size_t>::max());
    if (!bytes) {
        return std::nullopt;
    }
    return static_cast<std::size_t>(*bytes);
}

} // namespace onceproxy::config
