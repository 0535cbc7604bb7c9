#include "onceproxy/egress/uuidv7.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace onceproxy;

TEST_CASE("UUIDv7 layout: time first, version 7, variant 10") {
    const std::array<std::uint8_t, 10> ones{0xff, 0xff, 0xff, 0xff, 0xff,
                                            0xff, 0xff, 0xff, 0xff, 0xff};
    // RFC 9562 Appendix A.6's time: 0x017F22E279B0 (2022-02-22 19:22:22 UTC).
    CHECK(egress::uuidv7(0x017F22E279B0ULL, ones) == "017f22e2-79b0-7fff-bfff-ffffffffffff");
    const std::array<std::uint8_t, 10> zeros{};
    CHECK(egress::uuidv7(0, zeros) == "00000000-0000-7000-8000-000000000000");
}

TEST_CASE("generated keys are distinct and sort by time") {
    std::set<std::string> seen;
    std::string previous;
    for (int i = 0; i < 2000; ++i) {
        auto k = egress::new_uuidv7();
        REQUIRE(k.size() == 36);
        CHECK(k[14] == '7');
        CHECK((k[19] == '8' || k[19] == '9' || k[19] == 'a' || k[19] == 'b'));
        // The 48-bit millisecond prefix never goes back.
        CHECK(k.substr(0, 13) >= previous.substr(0, previous.empty() ? 0 : 13));
        previous = k;
        seen.insert(std::move(k));
    }
    CHECK(seen.size() == 2000);
}
