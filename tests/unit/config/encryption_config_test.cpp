// store.encryption: key files read at load (raw or hex), errors with file:line:column, and
// key changes allowed on reload.

#include "onceproxy/config/live_changes.hpp"
#include "onceproxy/config/load.hpp"

#include "support/config_errors.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace cfg = onceproxy::config;
using onceproxy::test::check_one_error;
using onceproxy::test::errors_of;
using onceproxy::test::temp_file;

namespace {

constexpr const char* base = onceproxy::test::minimal_config;

/// store.encryption with `lines` under it (indented by the caller); line 5 is its first.
std::string enc_yaml(const std::string& lines) {
    return std::string{base} + "store:\n  encryption:\n" + lines;
}

const std::string hex64 = "000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F";

std::string expected_bytes() {
    std::string b;
    for (int i = 0; i < 32; ++i) {
        b.push_back(static_cast<char>(i));
    }
    return b;
}

} // namespace

TEST_SUITE("store.encryption") {
    TEST_CASE("off by default") {
        CHECK(cfg::load_string(base, "t.yaml")->store.encryption.keys.empty());
    }

    TEST_CASE("keys in order; files as 32 raw bytes or 64 hex digits (line break allowed)") {
        const temp_file raw(expected_bytes());
        const temp_file hex(hex64 + "\n");
        const temp_file raw_with_newline_byte(std::string(31, 'x') + "\n"); // raw, not text
        const auto c = cfg::load_string(
            enc_yaml("    keys:\n      - { id: k2, file: " + hex.path +
                     " }\n      - { id: k1, file: " + raw.path +
                     " }\n      - { id: k0, file: " + raw_with_newline_byte.path + " }\n"),
            "t.yaml");
        const auto& keys = c->store.encryption.keys;
        REQUIRE(keys.size() == 3);
        CHECK(keys[0].id == "k2");
        CHECK(keys[0].file == hex.path);
        CHECK(keys[0].bytes == expected_bytes());
        CHECK(keys[1].id == "k1");
        CHECK(keys[1].bytes == expected_bytes());
        CHECK(keys[2].bytes == std::string(31, 'x') + "\n");
    }

    TEST_CASE("key errors carry line and column and never the key") {
        check_one_error(
            enc_yaml("    keys:\n      - { id: k1, file: /nonexistent/onceproxy/k1 }\n"), 6,
            "cannot read key file '/nonexistent/onceproxy/k1'");
        const temp_file short_key("0123456789abcdef\n");
        check_one_error(enc_yaml("    keys:\n      - { id: k1, file: " + short_key.path + " }\n"),
                        6, "holds 17 bytes; expected 32 raw bytes or 64 hexadecimal digits");
        const temp_file not_hex(std::string(63, 'a') + "g");
        const auto errors =
            errors_of(enc_yaml("    keys:\n      - { id: k1, file: " + not_hex.path + " }\n"));
        REQUIRE(errors.size() == 1);
        CHECK(errors[0].to_string().find("aaaa") == std::string::npos);
        const temp_file empty("");
        check_one_error(enc_yaml("    keys:\n      - { id: k1, file: " + empty.path + " }\n"), 6,
                        "holds 0 bytes");
        const temp_file good(hex64);
        check_one_error(enc_yaml("    keys:\n      - { id: k1, file: " + good.path +
                                 " }\n      - { id: k1, file: " + good.path + " }\n"),
                        7, "key id 'k1' is used twice");
        check_one_error(enc_yaml("    keys:\n      - { id: \"k 1\", file: " + good.path + " }\n"),
                        6, "invalid key id 'k 1'");
        check_one_error(enc_yaml("    keys: []\n"), 5, "expected at least one key");
        check_one_error(enc_yaml("    keys:\n      - { id: k1 }\n"), 6, "file");
        check_one_error(
            enc_yaml("    keys:\n      - { id: k1, file: " + good.path + ", cipher: x }\n"), 6,
            "unknown key 'cipher'");
        check_one_error(enc_yaml("    algorithm: aes\n    keys:\n      - { id: k1, file: " +
                                 good.path + " }\n"),
                        5, "unknown key 'algorithm'");
    }

    TEST_CASE("adding, rotating and removing keys needs no restart") {
        const temp_file k1(hex64);
        const temp_file k2(std::string(64, 'b'));
        const auto one = enc_yaml("    keys:\n      - { id: k1, file: " + k1.path + " }\n");
        const auto two = enc_yaml("    keys:\n      - { id: k2, file: " + k2.path +
                                  " }\n      - { id: k1, file: " + k1.path + " }\n");
        const auto running = cfg::load_string(one, "a.yaml");
        const auto next = cfg::load_string(two, "b.yaml");
        CHECK(cfg::changes_needing_restart(*running, *next).empty());
        CHECK(cfg::changes_needing_restart(*next, *running).empty());
        CHECK(cfg::changes_needing_restart(*cfg::load_string(base, "c.yaml"), *next).empty());
    }
}
