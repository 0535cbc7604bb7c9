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
// Failovers are also followed as soon as Sentinel announces them, as redis-py, Jedis and
// go-redis do: the watch (start_watch) keeps one connection to one sentinel, subscribed to
// `+switch-master` (the sentinels in turn; another one, after a backoff, when it drops). On
// `<master> <old-ip> <old-port> <new-ip> <new-port>` for our master, the announcing sentinel is
// asked first from then on, and the store drops its data connections that are not at the new
// address (on_switch): their operations in flight fail into on_store_error (a claim whose reply
// is lost stays a store error; nothing is sent again) and the reconnect goes to the new master
// (ROLE checked as always). A demoted master that stays reachable would otherwise answer
// -READONLY only when written to, and a partitioned one leave operations waiting for a timeout.
// After each (re)subscription the master's address is asked once, so a failover announced
// while no subscription was up is caught too.
//
// Each question is a short-lived connection to one sentinel (plain or TLS, with the sentinels'
// own credentials), bounded by connect_timeout + command_timeout.
//
// Moves are counted by cause (master_switch_cause) and logged: switch_master (announced),
// readonly and connection_lost (a data connection reconnected to another master, see
// note_connected).
//
// Thread-safety: async_master_address and note_connected may be called from any executor,
// concurrently (an atomic index and a mutex guard the shared state); the watch runs on the
// executor given to start_watch.

#include "onceproxy/redis/master_switch_cause.hpp"
#include "onceproxy/redis/redis_client.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::redis {

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
    /// The watch's connection: a PING this often (0 = none) finds a sentinel that went silent.
    std::chrono::milliseconds health_check_interval{5'000};
    std::chrono::milliseconds reconnect_min{100};   ///< the watch's first backoff delay
    std::chrono::milliseconds reconnect_max{2'000}; ///< the watch's backoff cap
};

/// One `+switch-master` announcement.
struct switch_master_event {
    std::string master;
    std::string old_host;
    std::uint16_t old_port = 0;
    std::string new_host;
    std::uint16_t new_port = 0;
};

/// The payload of a `+switch-master` message, `<master-name> <old-ip> <old-port> <new-ip>
/// <new-port>` (single spaces); nullopt unless it is exactly five non-empty fields with ports
/// in 1-65535.
std::optional<switch_master_event> parse_switch_master(std::string_view payload);

class redis_sentinel : public std::enable_shared_from_this<redis_sentinel> {
public:
    /// Called on the watch's executor after each announced switch: drop the data connections
    /// that are not at host:port.
    using switch_handler = std::function<void(const std::string& host, std::uint16_t port)>;

    explicit redis_sentinel(redis_sentinel_options options);

    /// Asks the sentinels in turn for the master's address; the first answer wins. Runs on the
    /// calling coroutine's executor. Errors: errc::unavailable (no sentinel reachable, or none
    /// knows the master), errc::auth_failed (a sentinel refused the credentials, and no other
    /// answered), with a message naming each sentinel's failure. A switch announced while the
    /// question was under way wins over the answer (which may predate it).
    boost::asio::awaitable<redis_address> async_master_address();

    /// An address_source for redis_client_options that asks `sentinel`.
    static std::function<boost::asio::awaitable<redis_address>()>
    address_source(std::shared_ptr<redis_sentinel> sentinel);

    /// An on_connected hook for redis_client_options that tells `sentinel` (note_connected).
    static std::function<void(const redis_address&, bool)>
    connected_sink(std::shared_ptr<redis_sentinel> sentinel);

    /// A data connection is up at host:port. The first one sets the known master; one at
    /// another address is a move, counted as readonly (`after_readonly`: its connection before
    /// ended on -READONLY) or connection_lost. Any thread.
    void note_connected(const std::string& host, std::uint16_t port, bool after_readonly);

    /// `observer` is called on each move, under a lock (one call at a time, from any thread).
    /// Set it before start_watch and before the data connections start.
    void set_switch_observer(std::function<void(master_switch_cause)> observer);

    /// Starts the watch on `ex` (see the top of this file); `on_switch` is called on `ex` after
    /// each announced switch of our master. Call once; stop_watch() ends it.
    void start_watch(boost::asio::any_io_executor ex, switch_handler on_switch);

    /// Ends the watch: closes its connection, stops its backoff; no on_switch call after it.
    /// Thread-safe (posts to the watch's executor, which must still run for the watch to end).
    void stop_watch();

    /// A pub/sub message from sentinel `index` (of options().nodes): a `+switch-master` of our
    /// master is acted on (counted, logged, the announcing sentinel asked first from now on,
    /// and the watch's on_switch called); one of another master is skipped; anything else is
    /// logged and ignored. The watch calls it on its executor; without a watch (tests) any
    /// thread.
    void take_message(std::size_t index, const redis_reply& message);

    /// Moves counted so far by `cause`.
    std::uint64_t switches(master_switch_cause cause) const noexcept {
        return switches_[static_cast<std::size_t>(cause)].load(std::memory_order_relaxed);
    }

    const redis_sentinel_options& options() const noexcept { return options_; }

private:
    struct watch;

    struct answer {
        redis_address address; ///< ec empty: the master's address
        bool auth_refused = false;
    };
    boost::asio::awaitable<answer> ask(std::size_t index);
    boost::asio::awaitable<void> run_watch(std::shared_ptr<watch> w);
    boost::asio::awaitable<bool> follow(std::shared_ptr<watch> w, std::size_t index);
    /// A sentinel names host:port as the master (announced or asked after subscribing):
    /// records and counts the move, then lets the store drop what is elsewhere (`w` may be
    /// null: no watch).
    void announced(watch* w, const std::string& host, std::uint16_t port,
                   const std::string& sentinel, bool caught_up);
    /// Records a move to host:port (under mutex_); false when it is where we were.
    bool move_to(const std::string& host, std::uint16_t port, master_switch_cause cause,
                 const std::string& by);
    redis_client_options client_options(std::size_t index) const;

    redis_sentinel_options options_;
    std::atomic<std::size_t> first_{0};
    /// Switches announced so far: a question that saw it change yields the announced master.
    std::atomic<std::uint64_t> announcements_{0};
    std::array<std::atomic<std::uint64_t>, master_switch_cause_count> switches_{};
    mutable std::mutex mutex_; // guards the fields below
    std::string master_host_;  // the master the data connections were last known at
    std::uint16_t master_port_ = 0;
    std::function<void(master_switch_cause)> observer_;
    std::shared_ptr<watch> watch_;
    /// The last master named to a connection attempt, until a connection to it is verified
    /// (note_connected): while it is not, the next question starts at another sentinel, so a
    /// stale one that keeps naming a demoted node is not asked first forever.
    bool unconfirmed_ = false;
    std::string unconfirmed_host_;
    std::uint16_t unconfirmed_port_ = 0;
    std::size_t unconfirmed_by_ = 0;
};

} // namespace onceproxy::redis
