#include <onceproxy/core/outcome.hpp>

#include <array>

namespace onceproxy::core {

namespace {

// In enum order; outcome_test.cpp checks every value has its own name.
constexpr std::array<std::string_view, outcome_count> names{
    "stored",      "replayed",      "in_progress", "mismatch",        "missing_key",
    "invalid_key", "released",      "held",        "outcome_unknown", "not_replayable",
    "lease_lost",  "record_failed", "store_error", "passthrough",     "rejected",
};

constexpr std::array<std::string_view, observation_count> observation_names{
    "replay", "conflict", "mismatch", "missing_key", "invalid_key", "not_replayable",
};

constexpr std::array<std::string_view, late_answer_count> late_answer_names{
    "recorded",
    "released",
    "unrecorded",
    "unanswered",
};

} // namespace

std::string_view to_string(outcome o) noexcept {
    const auto i = static_cast<std::size_t>(o);
    return i < names.size() ? names[i] : std::string_view("?");
}

std::string_view to_string(observation o) noexcept {
    const auto i = static_cast<std::size_t>(o);
    return i < observation_names.size() ? observation_names[i] : std::string_view("?");
}

std::string_view to_string(late_answer a) noexcept {
    const auto i = static_cast<std::size_t>(a);
    return i < late_answer_names.size() ? late_answer_names[i] : std::string_view("?");
}

} // namespace onceproxy::core
