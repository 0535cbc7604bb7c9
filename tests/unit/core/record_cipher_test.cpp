#include <onceproxy/core/record_cipher.hpp>
#include <onceproxy/core/response_record.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace core = onceproxy::core;
using core::record_cipher;
using core::record_key;
using core::record_open_failure;

namespace {

record_key key(const std::string& id, char fill) {
    return {id, std::string(32, fill)};
}

core::response_record sample() {
    return {200, {{"content-type", "text/plain"}, {"x-secret", "header-value"}}, "the body", true};
}

} // namespace

TEST_CASE("seal then open gives the encoded record back; the body is not in the sealed bytes") {
    const record_cipher c({key("k1", 'a')});
    const auto plain = core::encode_record(sample());
    const auto sealed = c.seal(plain, "scope:key-hash");
    CHECK(core::is_sealed(sealed));
    CHECK(sealed.size() == plain.size() + 2 + 2 + 12 + 16);
    CHECK(sealed.find("the body") == std::string::npos);
    CHECK(sealed.find("header-value") == std::string::npos);
    REQUIRE(core::sealed_key_id(sealed));
    CHECK(*core::sealed_key_id(sealed) == "k1");
    const auto opened = c.open(sealed, "scope:key-hash");
    REQUIRE(opened);
    CHECK(*opened == plain);
}

TEST_CASE("each seal uses a fresh nonce") {
    const record_cipher c({key("k1", 'a')});
    const auto a = c.seal("same bytes", "aad");
    const auto b = c.seal("same bytes", "aad");
    CHECK(a != b);
    CHECK(c.open(a, "aad") == c.open(b, "aad"));
}

TEST_CASE("nonces stay distinct across many seals, and threads draw their own") {
    // Nonces come from a per-thread pool of random bytes, refilled every 341 nonces: well
    // past several refills, in two threads at once, no nonce repeats.
    const record_cipher c({key("k1", 'a')});
    const auto nonces = [&] {
        std::vector<std::string> out;
        for (int i = 0; i < 2'000; ++i) {
            const auto sealed = c.seal("same bytes", "aad");
            REQUIRE(c.open(sealed, "aad") == std::optional<std::string>("same bytes"));
            out.push_back(sealed.substr(4, 12)); // marker, id length, "k1", then the nonce
        }
        return out;
    };
    std::vector<std::string> other;
    std::thread t([&] { other = nonces(); });
    auto all = nonces();
    t.join();
    all.insert(all.end(), other.begin(), other.end());
    std::sort(all.begin(), all.end());
    CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
    CHECK(all.size() == 4'000);
}

TEST_CASE("ciphers used in turn on one thread each seal with their own key") {
    // Each thread keeps the keyed contexts of the cipher it used last: switching between two
    // (a reload that changes the keys) must never seal or open with the other's key.
    const record_cipher a({key("k1", 'a')});
    const record_cipher b({key("k1", 'b')}); // same id, another key
    for (int i = 0; i < 3; ++i) {
        const auto by_a = a.seal("from a", "aad");
        const auto by_b = b.seal("from b", "aad");
        CHECK(a.open(by_a, "aad") == std::optional<std::string>("from a"));
        CHECK(b.open(by_b, "aad") == std::optional<std::string>("from b"));
        record_open_failure why{};
        CHECK_FALSE(a.open(by_b, "aad", &why));
        CHECK(why == record_open_failure::authentication);
        CHECK_FALSE(b.open(by_a, "aad"));
    }
}

TEST_CASE("another store key (aad) does not open") {
    const record_cipher c({key("k1", 'a')});
    const auto sealed = c.seal("record", "key-a");
    record_open_failure why{};
    CHECK_FALSE(c.open(sealed, "key-b", &why));
    CHECK(why == record_open_failure::authentication);
    CHECK_FALSE(c.open(sealed, "", &why));
    CHECK(c.open(sealed, "key-a"));
}

TEST_CASE("any altered byte fails authentication or parsing") {
    const record_cipher c({key("k1", 'a')});
    const auto sealed = c.seal("a record of some length", "aad");
    for (std::size_t i = 0; i < sealed.size(); ++i) {
        auto bad = sealed;
        bad[i] = static_cast<char>(bad[i] ^ 0x01);
        CHECK_MESSAGE(!c.open(bad, "aad"), "flipped byte " << i);
    }
    for (std::size_t n = 0; n < sealed.size(); ++n) {
        CHECK_MESSAGE(!c.open(sealed.substr(0, n), "aad"), "truncated to " << n);
    }
    CHECK_FALSE(c.open(sealed + "x", "aad"));
}

TEST_CASE("an unknown key id and a same-id different key fail with their reasons") {
    const record_cipher one({key("k1", 'a')});
    const record_cipher other({key("k9", 'b')});
    const record_cipher same_id({key("k1", 'b')});
    const auto sealed = one.seal("record", "aad");
    record_open_failure why{};
    CHECK_FALSE(other.open(sealed, "aad", &why));
    CHECK(why == record_open_failure::unknown_key);
    CHECK_FALSE(same_id.open(sealed, "aad", &why));
    CHECK(why == record_open_failure::authentication);
}

TEST_CASE("plaintext is refused when encryption is on") {
    const record_cipher c({key("k1", 'a')});
    record_open_failure why{};
    CHECK_FALSE(c.open(core::encode_record(sample()), "aad", &why));
    CHECK(why == record_open_failure::plaintext);
    CHECK_FALSE(c.open("", "aad", &why));
    CHECK(why == record_open_failure::plaintext);
}

TEST_CASE("rotation: the first key seals, every key opens") {
    const record_cipher before({key("k1", 'a')});
    const record_cipher after({key("k2", 'b'), key("k1", 'a')});
    const auto old_record = before.seal("old", "aad");
    const auto new_record = after.seal("new", "aad");
    CHECK(after.primary_id() == "k2");
    CHECK(*core::sealed_key_id(new_record) == "k2");
    CHECK(after.open(old_record, "aad") == std::optional<std::string>("old"));
    CHECK(after.open(new_record, "aad") == std::optional<std::string>("new"));
    record_open_failure why{};
    CHECK_FALSE(before.open(new_record, "aad", &why)); // a replica not yet reloaded
    CHECK(why == record_open_failure::unknown_key);
}

TEST_CASE("invalid key sets are refused") {
    CHECK_THROWS_AS(record_cipher({}), std::invalid_argument);
    CHECK_THROWS_AS(record_cipher({{"k1", std::string(31, 'a')}}), std::invalid_argument);
    CHECK_THROWS_AS(record_cipher({{"", std::string(32, 'a')}}), std::invalid_argument);
    CHECK_THROWS_AS(record_cipher({key(std::string(65, 'i'), 'a')}), std::invalid_argument);
    CHECK_THROWS_AS(record_cipher({key("k1", 'a'), key("k1", 'b')}), std::invalid_argument);
}

TEST_CASE("stored records: encode and decode through the codec with and without a cipher") {
    const record_cipher c({key("k1", 'a')});
    const auto r = sample();
    const auto sealed = core::encode_stored_record(r, &c, {"sk"});
    const auto plain = core::encode_stored_record(r, nullptr, {"sk"});
    CHECK(plain == core::encode_record(r));
    CHECK(core::is_sealed(sealed));

    const auto back = core::decode_stored_record(sealed, &c, {"sk"});
    REQUIRE(back);
    CHECK(back->body == r.body);
    CHECK(back->headers == r.headers);
    CHECK(core::open_stored_record(sealed, &c, {"sk"}) == core::encode_record(r));

    record_open_failure why{};
    CHECK_FALSE(core::decode_stored_record(sealed, &c, {"other"}, &why));
    CHECK(why == record_open_failure::authentication);
    CHECK_FALSE(core::decode_stored_record(plain, &c, {"sk"}, &why));
    CHECK(why == record_open_failure::plaintext);
    CHECK_FALSE(core::decode_stored_record(sealed, nullptr, {"sk"}, &why));
    CHECK(why == record_open_failure::unknown_key);
    CHECK_FALSE(core::open_stored_record(sealed, nullptr, {"sk"}, &why));
    CHECK(core::decode_stored_record(plain, nullptr, {"sk"}));
    CHECK(core::open_stored_record(plain, nullptr, {"sk"}) == plain);
}

TEST_CASE("a sealed record is bound to the claim fields kept beside it") {
    const record_cipher c({key("k1", 'a')});
    const auto r = sample();
    const std::string fp(32, 'f');
    const core::record_binding bound{"sk", fp, 1'700'000'000'123};
    const auto sealed = core::encode_stored_record(r, &c, bound);
    CHECK(static_cast<unsigned char>(sealed[0]) == core::sealed_record_marker);
    CHECK_FALSE(core::is_sealed_v1(sealed));
    REQUIRE(core::decode_stored_record(sealed, &c, bound));

    // Each field altered alone: the record does not open (authentication).
    const std::string other_fp(32, 'g');
    for (const auto& altered :
         {core::record_binding{"sk", fp, 1'700'000'000'124},
          core::record_binding{"sk", other_fp, 1'700'000'000'123},
          core::record_binding{"sk2", fp, 1'700'000'000'123}, core::record_binding{"sk"}}) {
        record_open_failure why{};
        CHECK_FALSE(core::decode_stored_record(sealed, &c, altered, &why));
        CHECK(why == record_open_failure::authentication);
    }
    // The fields are length-prefixed: moving bytes from one to the next is no disguise.
    CHECK(core::record_binding_aad({"ab", "c"}) != core::record_binding_aad({"a", "bc"}));
}

TEST_CASE("a record sealed by the earlier format (0xE5, bound to the store key) still opens") {
    // Sealed as the previous version did: sample() under key k1 ('a' x 32), nonce 0..11, the
    // authenticated data its head and the store key "sk".
    const std::string v1("\xe5\x02\x6b\x31\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b"
                         "\xb6\x1b\xe4\x28\x50\x8f\x42\x97\xdf\xc9\x2f\x3b\xca\xf1\x28\x50"
                         "\xd3\x49\x8c\x11\xec\xeb\x2e\x38\x12\x30\xd3\x4f\xb3\x25\x77\x19"
                         "\x7a\x4a\x24\x5b\xc3\x47\x31\xaa\x53\x51\x42\x85\xdb\xcb\x46\x28"
                         "\x4a\x99\x92\x45\xd1\x65\xc8\xa3\xb8\x54\xf3\x85\x4d\xc9\xf0\x5c"
                         "\x3e\x03\xf6\xf2\xd5\xd1\x6f\x6c\x4e\x23\x9a\x1d\xd1\xb9\xf5\x2d"
                         "\x64\x90\xb2\xbe\xba\x6a\x81\xb2\x70\x7f\x95\x66\x9a\x59\xb2\x41"
                         "\xe0\xf7",
                         114);
    REQUIRE(core::is_sealed(v1));
    REQUIRE(core::is_sealed_v1(v1));
    CHECK(*core::sealed_key_id(v1) == "k1");
    const record_cipher c({key("k1", 'a')});
    // Whatever the claim fields say: that format did not bind them.
    const auto back = core::decode_stored_record(v1, &c, {"sk", "any fingerprint", 42});
    REQUIRE(back);
    CHECK(back->body == "the body");
    CHECK(back->headers == sample().headers);
    record_open_failure why{};
    CHECK_FALSE(core::decode_stored_record(v1, &c, {"other"}, &why));
    CHECK(why == record_open_failure::authentication);
    // Its marker is part of the authenticated head: it cannot pass for the current format.
    std::string relabelled = v1;
    relabelled[0] = static_cast<char>(core::sealed_record_marker);
    CHECK_FALSE(core::decode_stored_record(relabelled, &c, {"sk"}, &why));
    CHECK(why == record_open_failure::authentication);
}
