#pragma once
// Redis Cluster routing for the Redis store (SPEC §5): the slot map, one pipelined
// redis_client per master, and the routing of each command by the hash slot of its key.
//
// - Slot map: from `CLUSTER SHARDS` (Redis 7), or `CLUSTER SLOTS` where SHARDS is unknown,
//   asked of any connected node (the seed nodes of the config first, at start). It is refreshed
//   after a -MOVED reply, after a command failed for a lost or timed-out connection, and every
//   health_check_interval (a topology change that produced no error yet).
// - Routing: slot = CRC16(key) mod 16384, over the hash tag only when the key holds one
//   (`{...}`, non-empty, the first `{` and the first `}` after it), as Redis does.
// - `-MOVED slot host:port`: the command did not run; the slot now belongs to that node. The
//   entry is updated at once, a full refresh is scheduled, and the command is sent there.
// - `-ASK slot host:port`: the command did not run; the slot is being migrated and this key
//   is already on the target. The command is sent there once, preceded by ASKING on the same
//   connection with nothing between them; the map is not changed.
// - A command that failed after it may have reached Redis (timeout, connection lost after the
//   write) is never sent again: the failure is returned to the caller. One that certainly did
//   not leave (connection not ready) is sent again after a refresh, within the redirect budget.
//
// Threading: like redis_client, one redis_cluster belongs to ONE executor, and every member
// function is called on that executor's thread.

#include "onceproxy/redis/redis_client.hpp"
#include "onceproxy/redis/redis_reply.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onceproxy::redis {

inline constexpr std::size_t redis_cluster_slots = 16384;

/// The hash slot of `key` (CRC16-XMODEM mod 16384, over the hash tag when there is one).
std::uint16_t redis_key_slot(std::string_view key) noexcept;

/// A node address as Redis reports it ("host:port").
struct redis_node_address {
    std::string host;
    std::uint16_t port = 0;
    std::string text() const { return host + ":" + std::to_string(port); }
    friend bool operator==(const redis_node_address&, const redis_node_address&) = default;
};

/// A parsed -MOVED or -ASK reply.
struct redis_redirect {
    enum class kind {
        moved, ///< the slot belongs to `target` now
        ask,   ///< the slot is migrating: ASKING + the command on `target`, once
    };
    kind type = kind::moved;
    std::uint16_t slot = 0;
    redis_node_address target;
};

/// The redirect carried by `reply`, or nothing if it is not a well-formed MOVED or ASK error.
std::optional<redis_redirect> parse_redirect(const redis_reply& reply);

/// Which master serves each slot: an index into `masters`, or -1 (no node serves it).
struct redis_slot_map {
    std::vector<redis_node_address> masters;
    std::array<int, redis_cluster_slots> owner{};
    redis_slot_map() { owner.fill(-1); }
    /// The index of `a` in `masters`, appended if new.
    int add_master(const redis_node_address& a);
    /// Slots with an owner.
    std::size_t covered() const noexcept;
    /// The slots this map leaves without an owner keep their owner in `before`: a node that
    /// answers with a partial map (a shard listed without its slots, as some Redis 7.2 builds
    /// do after a failover) does not make the router forget what it knew, from a MOVED too.
    void keep_known(const redis_slot_map& before);
};

/// The slot map out of a `CLUSTER SHARDS` reply; `asked` stands in for a node whose address is
/// unknown (empty or "?"); `tls` takes the `tls-port` of each node. Nothing if malformed.
std::optional<redis_slot_map> parse_cluster_shards(const redis_reply& reply,
                                                   const redis_node_address& asked, bool tls);
/// The same out of a `CLUSTER SLOTS` reply.
std::optional<redis_slot_map> parse_cluster_slots(const redis_reply& reply,
                                                  const redis_node_address& asked);

struct redis_cluster_options {
    /// The settings of every node connection (credentials, TLS, timeouts, scripts); url.host and
    /// url.port are replaced per node; url.db must be 0 (a Cluster has one database).
    redis_client_options node;
    /// Where to ask for the slot map at start (and again when no known node answers).
    std::vector<redis_node_address> seeds;
    /// At most this many redirects (MOVED, ASK) or re-sends per command.
    int max_redirects = 5;
    /// Shortest pause between two slot-map refreshes.
    std::chrono::milliseconds refresh_min_interval{100};
};

class redis_cluster {
public:
    using executor_type = boost::asio::any_io_executor;

    redis_cluster(executor_type ex, redis_cluster_options options);
    /// Calls stop().
    ~redis_cluster();
    redis_cluster(const redis_cluster&) = delete;
    redis_cluster& operator=(const redis_cluster&) = delete;

    const executor_type& get_executor() const noexcept;

    /// Connects to the seeds and spawns the refresh loop. Call once.
    void start();
    /// Closes every connection (pending commands fail with errc::unavailable), ends the loop.
    void stop();
    /// The password of the next connections (AUTH) of every node.
    void set_password(std::string password);

    /// Sends `args` to the master of `key`'s slot, following MOVED and ASK (see above). The
    /// result is as redis_client::async_exec's; a redirect still unresolved after
    /// max_redirects comes back as its error reply. errc::unavailable when no slot map is
    /// known within command_timeout. `key` and `args` are read until the awaitable completes:
    /// keep them alive while awaiting it (as a co_await of the call does).
    boost::asio::awaitable<redis_exec_result> async_exec(std::string_view key, redis_args args);

    /// async_exec of `args`, then a WAIT (`wait`) on the very connection that ran it (after
    /// any MOVED or ASK), shared as redis_client::async_wait_replicas shares it: durability
    /// replicated, where a WAIT counts only what its own connection wrote. No WAIT is joined
    /// when `args` failed or came back an error reply (its result is then errc::unavailable),
    /// and its result is errc::unavailable, written, when that connection was replaced in
    /// between. Keep `key`, `args` and `wait` alive while awaiting.
    boost::asio::awaitable<std::pair<redis_exec_result, redis_exec_result>>
    async_exec_replicated(std::string_view key, redis_args args, redis_args wait);

    /// Waits until a slot map is known and the master of `key`'s slot is connected, or
    /// `timeout` passes; true when ready.
    boost::asio::awaitable<bool> async_wait_ready(std::string_view key,
                                                  std::chrono::milliseconds timeout);

    /// True when a slot map covering every slot is known.
    bool ready() const noexcept;

    /// Asks for a slot-map refresh soon (at most one per refresh_min_interval).
    void request_refresh();

    /// Completed slot-map refreshes so far.
    std::uint64_t refresh_count() const noexcept;
    /// The connection of `key`'s master in the current map (nullptr if none); diagnostics.
    redis_client* client_for(std::string_view key) noexcept;

    struct impl;

private:
    std::shared_ptr<impl> impl_;
};

/// Where one store operation goes: a single-node connection, or the cluster with the key that
/// picks the node. Cheap to copy; the key is viewed, not owned (keep it alive while in use).
class redis_route {
public:
    redis_route() = default;
    explicit redis_route(redis_client* c) : client_(c) {}
    redis_route(redis_cluster* c, std::string_view key) : cluster_(c), key_(key) {}

    explicit operator bool() const noexcept { return client_ != nullptr || cluster_ != nullptr; }

    /// As redis_client::async_exec or redis_cluster::async_exec (keep `args` alive while
    /// awaiting).
    boost::asio::awaitable<redis_exec_result> async_exec(redis_args args);
    /// `args`, then a shared WAIT (`wait`) behind it on the same connection:
    /// redis_client::async_exec_replicated on a single node, or
    /// redis_cluster::async_exec_replicated.
    boost::asio::awaitable<std::pair<redis_exec_result, redis_exec_result>>
    async_exec_replicated(redis_args args, redis_args wait);
    boost::asio::awaitable<bool> async_wait_ready(std::chrono::milliseconds timeout);

private:
    redis_client* client_ = nullptr;
    redis_cluster* cluster_ = nullptr;
    std::string_view key_;
};

} // namespace onceproxy::redis
