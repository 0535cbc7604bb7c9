#pragma once
// A real Sentinel deployment for integration tests, on free loopback ports: one master, two
// replicas and three sentinels (quorum 2) with short timings (down after 1 s, failover timeout
// 4 s), each in its own temporary directory. The constructor waits (bounded) until the
// replicas are in sync and every sentinel knows the others; everything is killed in the
// destructor. A missing or failing redis-server throws: a test FAILS, never skips.

#include "support/process.hpp"
#include "support/redis_server.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace onceproxy::test {

struct redis_sentinel_set_options {
    std::string sentinel_password; ///< requirepass of the sentinels; empty: none
};

class redis_sentinel_set {
public:
    explicit redis_sentinel_set(redis_sentinel_set_options options = {});
    ~redis_sentinel_set();
    redis_sentinel_set(const redis_sentinel_set&) = delete;
    redis_sentinel_set& operator=(const redis_sentinel_set&) = delete;

    /// The name the sentinels monitor the master under.
    const std::string& master_name() const noexcept { return name_; }
    /// "127.0.0.1:P" of each sentinel.
    std::vector<std::string> sentinel_nodes() const;
    /// The port of the master as the first answering sentinel names it (0 if none answers).
    std::uint16_t master_port() const;
    /// The ports of the three data nodes.
    std::vector<std::uint16_t> node_ports() const;
    /// The data node on `port` (master or replica); throws if there is none.
    redis_server& node(std::uint16_t port);
    /// The data node the sentinels name as master.
    redis_server& master() { return node(master_port()); }

    /// SIGKILLs the current master and waits (at most `bound`) until the sentinels name another
    /// node that says ROLE master; returns its port (throws on timeout). The killed node is
    /// started again afterwards (the sentinels turn it into a replica of the new master).
    std::uint16_t fail_over(std::chrono::milliseconds bound = std::chrono::seconds(30));

    /// Asks sentinel `via` for a failover (`SENTINEL FAILOVER`, again while it answers
    /// -NOGOODSLAVE or -INPROGRESS) with the master up, and waits (at most `bound`) until the
    /// sentinels name another node that says ROLE master, and then until the set has settled
    /// again (the old master a replica of it). Returns the port the sentinels name by then
    /// (throws on timeout).
    std::uint16_t switch_over(std::size_t via,
                              std::chrono::milliseconds bound = std::chrono::seconds(45));

    /// The index of the sentinel listening on "127.0.0.1:P" (as sentinel_nodes() names it).
    std::size_t sentinel_index(const std::string& node) const;
    /// SIGKILLs sentinel `index`; the set goes on with the others (waits and checks skip it).
    void kill_sentinel(std::size_t index);

    /// Runs redis-cli against sentinel `index` (password added) and returns its stdout.
    std::string sentinel_cli(std::size_t index, const std::vector<std::string>& args) const;

private:
    struct sentinel {
        std::uint16_t port = 0;
        std::unique_ptr<temp_dir> dir;
        process proc;
        bool alive = true;
    };

    bool settled(std::uint16_t master, std::size_t replicas) const;
    /// Waits up to `bound` until the sentinels name a master other than `old` that says ROLE
    /// master; its port, or 0.
    std::uint16_t new_master_after(std::uint16_t old, std::chrono::milliseconds bound);

    redis_sentinel_set_options options_;
    std::string name_ = "onceproxy-test";
    std::vector<std::unique_ptr<redis_server>> nodes_;
    std::vector<sentinel> sentinels_;
};

} // namespace onceproxy::test
