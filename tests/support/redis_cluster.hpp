#pragma once
// A real Redis Cluster for integration tests: three masters with one replica each, six
// redis-server processes on free loopback ports (cluster-enabled, each in its own temporary
// directory), joined with `redis-cli --cluster create ... --cluster-replicas 1`. The
// constructor waits until every node reports cluster_state:ok and agrees on the slot map (at
// most 30 s, else it throws: a test FAILS, never skips); the destructor kills every node.

#include "support/redis_server.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace onceproxy::test {

class redis_cluster {
public:
    explicit redis_cluster(std::size_t masters = 3, std::size_t replicas_per_master = 1);
    ~redis_cluster();
    redis_cluster(const redis_cluster&) = delete;
    redis_cluster& operator=(const redis_cluster&) = delete;

    /// Every node, masters and replicas, in creation order.
    std::vector<redis_server*> nodes();
    /// "127.0.0.1:P" of every node (the seed list of a config).
    std::vector<std::string> addresses() const;
    /// The node listening on `port`.
    redis_server& node(std::uint16_t port);
    /// The ports of the current masters that serve slots.
    std::vector<std::uint16_t> master_ports();
    /// The port of the master serving `slot` now.
    std::uint16_t master_of_slot(std::uint16_t slot);
    /// The node id of the node on `port`.
    std::string node_id(std::uint16_t port);

    /// Runs redis-cli against the node on `port` with `args` (as redis_server::cli).
    std::string cli(std::uint16_t port, const std::vector<std::string>& args);

    /// Moving one slot by hand, in the steps `redis-cli --cluster reshard` takes: the target
    /// IMPORTING and the source MIGRATING (from here the source answers -ASK for keys it no
    /// longer holds), ...
    void begin_migration(std::uint16_t slot, std::uint16_t from_port, std::uint16_t to_port);
    /// ... MIGRATE of the given keys (all of the slot's keys when `keys` is empty), ...
    void migrate_keys(std::uint16_t slot, std::uint16_t from_port, std::uint16_t to_port,
                      std::vector<std::string> keys = {});
    /// ... and SETSLOT NODE on every master (from here the source answers -MOVED).
    void finish_migration(std::uint16_t slot, std::uint16_t to_port);

    /// Waits until every node reports cluster_state:ok and `redis-cli --cluster check` passes.
    void wait_until_stable(std::chrono::milliseconds bound = std::chrono::seconds(30));

private:
    std::vector<std::unique_ptr<redis_server>> nodes_;
};

} // namespace onceproxy::test
