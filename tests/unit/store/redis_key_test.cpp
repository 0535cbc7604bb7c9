// The Redis key layout operators rely on (README "Keys in Redis"): key_prefix followed by the
// 64 hex digits of the scoped store key, and nothing of the raw idempotency key or credential.
// Constructing a redis_store opens no connection (that is start()'s job), so this needs no Redis.

#include "onceproxy/core/fingerprint.hpp"
#include "onceproxy/store/redis_store.hpp"

#include <boost/asio/io_context.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace core = onceproxy::core;
using onceproxy::config::redis_config;
using onceproxy::store::redis_store;

namespace {

std::string redis_key_with(const std::string& prefix, const std::string& store_key) {
    boost::asio::io_context ioc;
    redis_config cfg;
    cfg.url = "redis://127.0.0.1:1/0";
    cfg.key_prefix = prefix;
    redis_store s(cfg, {ioc.get_executor()});
    return s.redis_key(store_key);
}

} // namespace

TEST_CASE("redis key: key_prefix + the hex scoped store key, raw key and credential hidden") {
    const std::string idempotency_key = "order-4711";
    const std::string principal = core::principal_hash({});
    const auto scoped = core::store_key("", "pay", principal, idempotency_key);
    REQUIRE(scoped.size() == 64);
    CHECK(scoped.find_first_not_of("0123456789abcdef") == std::string::npos);

    const auto a = redis_key_with("svc-a:", scoped);
    const auto b = redis_key_with("svc-b:", scoped);
    CHECK(a == "svc-a:" + scoped);
    CHECK(b == "svc-b:" + scoped);
    CHECK(a.find(idempotency_key) == std::string::npos);
    // The default keeps the layout deployments had before key_prefix was validated.
    CHECK(redis_config{}.key_prefix == "onceproxy:");
    CHECK(redis_key_with(redis_config{}.key_prefix, scoped) == "onceproxy:" + scoped);
}

TEST_CASE("redis key: route and principal scope the hash") {
    const auto anonymous = core::principal_hash({});
    const auto key = core::store_key("", "pay", anonymous, "k");
    CHECK(core::store_key("", "refund", anonymous, "k") != key);
    CHECK(core::store_key("", "pay", anonymous, "k2") != key);
    const std::vector<core::header_view> alice{{"authorization", "Bearer alice"}};
    CHECK(core::store_key("", "pay", core::principal_hash(alice), "k") != key);
    CHECK(core::store_key("", "pay", anonymous, "k") == key); // stable: retries meet
}
