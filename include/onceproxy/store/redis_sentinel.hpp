#pragma once
// Master discovery through Redis Sentinel (SPEC §5, `store.redis.sentinel`).
//
// The data connections (redis_client) ask a redis_sentinel for the master's address at every
// connection attempt (redis_client_options::address_source): each sentinel is asked in turn,
// `SENTINEL GET-MASTER-ADDR-BY-NAME <master>`, until one answers with an address; the one that
// answered is asked first next time. The data connection then checks `ROLE` (a sentinel may
// still name a demoted master for a moment), and closes on a -READONLY reply or on loss, so a
// failover is followed by reconnecting: operations in flight at that moment fail with
// errc::unavailable (or timeout) into the route's on_store_error policy, never hang.
//
// Each question is a short-lived connection to one sentinel (plain or TLS, with the sentinels'
// own credentials), bounded by connect_timeout + command_timeout.
//
// Thread-safety: async_master_address may be called from any executor, concurrently; the only
// shared state is the index of the sentinel to ask first (atomic).

#include "onceproxy/store/redis_client.hpp"

#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace onceproxy::store {

struct redis_sentinel_options {
    std::string master_name; ///< the name the sentinels monitor the master under
    struct node {
        std::string host;
        std::uint16_t port = 26379;
    };
    std::vector<node> nodes; ///< the sentinels, asked in turn
    std::string username;    ///< the sentinels' ACL user; empty: none
    std::string password;    ///< the sentinels' password; empty: no AUTH
    bool tls = false;        ///< TLS to the sentinels
    std::string tls_ca_file; ///< TLS: CA bundle; empty = system default paths
    std::chrono::milliseconds connect_timeout{500}; ///< per sentinel
    std::chrono::milliseconds command_timeout{250}; ///< per sentinel
};

class redis_sentinel {
public:
    explicit redis_sentinel(redis_sentinel_options options);

    /// Asks the sentinels in turn for the master's address; the first answer wins. Runs on the
    /// calling coroutine's executor. Errors: errc::unavailable (no sentinel reachable, or none
    /// knows the master), errc::auth_failed (a sentinel refused the credentials, and no other
    /// answered), with a message naming each sentinel's failure.
    boost::asio::awaitable<redis_address> async_master_address();

    /// An address_source for redis_client_options that asks `sentinel`.
    static std::function<boost::asio::awaitable<redis_address>()>
    address_source(std::shared_ptr<redis_sentinel> sentinel);

    const redis_sentinel_options& options() const noexcept { return options_; }

private:
    redis_sentinel_options options_;
    std::atomic<std::size_t> first_{0};
};

} // namespace onceproxy::store
