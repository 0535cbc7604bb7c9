#include <onceproxy/core/outcome.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>

namespace core = onceproxy::core;

TEST_CASE("outcome: every value has its own stable label (SPEC §6)") {
    constexpr const char* expected[] = {
        "stored",      "replayed",      "in_progress", "mismatch",        "missing_key",
        "invalid_key", "released",      "held",        "outcome_unknown", "not_replayable",
        "lease_lost",  "record_failed", "store_error", "passthrough",     "rejected",
    };
    REQUIRE(std::size(expected) == core::outcome_count);
    std::set<std::string> seen;
    for (std::size_t i = 0; i < core::outcome_count; ++i) {
        const auto name = core::to_string(static_cast<core::outcome>(i));
        CAPTURE(i);
        CHECK(name == expected[i]);
        seen.emplace(name);
    }
    CHECK(seen.size() == core::outcome_count);
    CHECK(core::to_string(static_cast<core::outcome>(core::outcome_count)) == "?");
}

TEST_CASE("outcome: every observation has its own stable `would` label (observe mode)") {
    constexpr const char* expected[] = {
        "replay", "conflict", "mismatch", "missing_key", "invalid_key", "not_replayable",
    };
    REQUIRE(std::size(expected) == core::observation_count);
    std::set<std::string> seen;
    for (std::size_t i = 0; i < core::observation_count; ++i) {
        const auto name = core::to_string(static_cast<core::observation>(i));
        CAPTURE(i);
        CHECK(name == expected[i]);
        seen.emplace(name);
    }
    CHECK(seen.size() == core::observation_count);
    CHECK(core::to_string(static_cast<core::observation>(core::observation_count)) == "?");
}

TEST_CASE("outcome: every late answer has its own stable `outcome` label (issue 26)") {
    constexpr const char* expected[] = {"recorded", "released", "unrecorded", "unanswered"};
    REQUIRE(std::size(expected) == core::late_answer_count);
    for (std::size_t i = 0; i < core::late_answer_count; ++i) {
        CAPTURE(i);
        CHECK(core::to_string(static_cast<core::late_answer>(i)) == expected[i]);
    }
    CHECK(core::to_string(static_cast<core::late_answer>(core::late_answer_count)) == "?");
}
