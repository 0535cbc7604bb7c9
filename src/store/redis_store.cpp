#include "onceproxy/store/redis_store.hpp"

#include "onceproxy/core/fingerprint.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/redis/error.hpp"
#include "onceproxy/redis/redis_client.hpp"
#include "onceproxy/redis/redis_cluster.hpp"
#include "onceproxy/redis/redis_sentinel.hpp"
#include "onceproxy/store/error.hpp"
#include "store/redis_record.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <charconv>
#include <chrono>
#include <stdexcept>

namespace onceproxy::store {

namespace net = boost::asio;
using boost::system::error_code;
using redis::command;
using redis::describe_redis_url_error;
using redis::parse_redis_url;
using redis::redis_args;
using redis::redis_client;
using redis::redis_client_options;
using redis::redis_cluster;
using redis::redis_cluster_options;
using redis::redis_exec_result;
using redis::redis_node_address;
using redis::redis_reply;
using redis::redis_route;
using redis::redis_sentinel;
using redis::redis_sentinel_options;
using redis::redis_url;

namespace {

// A claim is one native command, SET key value NX PX lease GET (redis_record.hpp gives the
// value's layout); the scripts below are the fenced writes and the key administration. Each
// matches a lease by the prefix `2f<owner length>:<owner>` of the value (complete first compares
// the whole lease, when its caller gives the claim's fields).

// complete. ARGV[1] the lease as its owner's claim wrote it (rebuilt from the claimed_lease
// given), or when that is unknown only its start `2f<owner length>:<owner>`; ARGV[2]
// redis_record::completed_value(ARGV[1], payload); ARGV[3] ttl (ms). Returns 1 ok, 0 not owner.
// The common case is the first branch: the lease compared whole and the record written as sent,
// no string built in Lua (which hashes every byte of every string it makes). The rest matches
// the owner's prefix and builds the record from the value found, as `2c` .. its rest .. the
// payload.
constexpr const char* complete_lua = R"lua(
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if not v then
  return 0
end
local n = string.match(ARGV[1], '^2f(%d+):')
local o = string.sub(ARGV[1], 3, 3 + #n + n)
local head = string.sub(v, 1, #o + 2)
if head == '2f' .. o then
  local payload = string.sub(ARGV[2], #ARGV[1] + 1)
  redis.call('SET', KEYS[1], '2c' .. string.sub(v, 3) .. payload, 'PX', ARGV[3])
  return 1
end
if head == '2c' .. o then
  -- Completed by this owner already (a retry whose first reply was lost). The expiry is set
  -- again unchanged: a write, so that a WAIT behind this call covers the record.
  local t = redis.call('PTTL', KEYS[1])
  if t > 0 then
    redis.call('PEXPIRE', KEYS[1], t)
  end
  return 1
end
return 0
)lua";

// release. ARGV[1] owner. Returns 1 deleted, 0 not owner (or not a lease).
constexpr const char* release_lua = R"lua(
local v = redis.call('GET', KEYS[1])
local p = '2f' .. #ARGV[1] .. ':' .. ARGV[1]
if v and string.sub(v, 1, #p) == p then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
)lua";

// extend. ARGV[1] owner, ARGV[2] lease (ms). Returns 1 extended, 0 not owner.
constexpr const char* extend_lua = R"lua(
local v = redis.call('GET', KEYS[1])
local p = '2f' .. #ARGV[1] .. ':' .. ARGV[1]
if v and string.sub(v, 1, #p) == p then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
)lua";

// A record of layout version 1 (a hash: v, st, ow, fp, ct, pl), written by an earlier version
// and met by a claim (WRONGTYPE): read, never written. ARGV[1] fingerprint. Returns {1, pttl} in
// flight, {2, payload} completed, {3} mismatch, {4} gone meanwhile (claim again).
constexpr const char* claim_v1_lua = R"lua(
local r = redis.call('HMGET', KEYS[1], 'v', 'st', 'fp', 'pl')
if not r[1] then
  return {4}
end
if r[1] ~= '1' then
  return redis.error_reply('ONCEPROXY unknown record version')
end
if r[3] ~= ARGV[1] then
  return {3}
end
if r[2] == 'c' then
  return {2, r[4] or ''}
end
return {1, redis.call('PTTL', KEYS[1])}
)lua";

// inspect (key administration). Returns {0} absent, {4, pttl, value} a record of this layout;
// for a version 1 hash {1, pttl, owner age ms or -1} in flight, {2, pttl, payload} completed.
// Changes nothing.
constexpr const char* inspect_lua = R"lua(
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then
  return {0}
end
local ttl = redis.call('PTTL', KEYS[1])
if t == 'string' then
  return {4, ttl, redis.call('GET', KEYS[1])}
end
local r = redis.call('HMGET', KEYS[1], 'v', 'st', 'pl', 'ct')
if r[1] ~= '1' then
  return redis.error_reply('ONCEPROXY unknown record version')
end
if r[2] == 'c' then
  return {2, ttl, r[3] or ''}
end
local age = -1
if r[4] then
  local now = redis.call('TIME')
  age = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(r[4])
end
return {1, ttl, age}
)lua";

// purge (key administration). ARGV[1] "1" to delete a held lease too. Returns 0 absent,
// 1 record deleted, 2 refused (in flight, not forced), 3 lease deleted (forced). Deleting the lease
// deletes its owner token, so the owner's later complete/extend/release find nothing and answer 0
// (fenced).
constexpr const char* purge_lua = R"lua(
local t = redis.call('TYPE', KEYS[1]).ok
local st
if t == 'string' then
  local v = redis.call('GET', KEYS[1])
  if string.sub(v, 1, 1) ~= '2' then
    return redis.error_reply('ONCEPROXY unknown record version')
  end
  st = string.sub(v, 2, 2)
elseif t == 'hash' then
  st = redis.call('HGET', KEYS[1], 'st')
end
if not st then
  return 0
end
if st == 'f' and ARGV[1] ~= '1' then
  return 2
end
redis.call('DEL', KEYS[1])
if st == 'f' then
  return 3
end
return 1
)lua";

struct script {
    std::string body;
    std::string sha; // lowercase hex SHA-1, as EVALSHA wants it
};

script make_script(const char* body) {
    script s{body, {}};
    unsigned char digest[SHA_DIGEST_LENGTH];
    SHA1(reinterpret_cast<const unsigned char*>(s.body.data()), s.body.size(), digest);
    s.sha = core::to_hex({reinterpret_cast<const char*>(digest), sizeof digest});
    return s;
}

// A number as the decimal text of a command argument, kept on the caller's frame.
class decimal {
public:
    explicit decimal(long long n) noexcept
        : size_(static_cast<std::size_t>(std::to_chars(digits_, digits_ + sizeof digits_, n).ptr -
                                         digits_)) {}
    operator std::string_view() const noexcept { return {digits_, size_}; }

private:
    char digits_[24];
    std::size_t size_;
};

decimal millis(duration d) {
    return decimal(std::max<long long>(d.count(), 1));
}

// The driver's failures as the store's (same names), so routes, metrics and logs see one
// category; codes of other categories pass through.
error_code store_error(error_code ec) {
    if (ec.category() != redis::redis_category()) {
        return ec;
    }
    switch (static_cast<redis::errc>(ec.value())) {
    case redis::errc::unavailable:
        return errc::unavailable;
    case redis::errc::timeout:
        return errc::timeout;
    case redis::errc::protocol:
        return errc::protocol;
    case redis::errc::auth_failed:
        return errc::auth_failed;
    case redis::errc::tls_failed:
        return errc::tls_failed;
    }
    return errc::protocol;
}

error_code reply_error() {
    return errc::protocol;
}

result<fence_status> to_fence(const redis_exec_result& r) {
    if (r.ec) {
        return r.ec;
    }
    if (r.reply.type != redis_reply::kind::integer) {
        return reply_error();
    }
    return r.reply.integer == 1 ? fence_status::ok : fence_status::not_owner;
}

} // namespace

struct redis_store::impl {
    struct worker {
        net::execution_context* context = nullptr;
        std::vector<redis_client> clients;
        /// Cluster mode (store.redis.cluster): the routers, one per connection slot, instead
        /// of `clients`.
        std::vector<std::unique_ptr<redis_cluster>> clusters;
        std::size_t next = 0; // touched only by the worker's own thread
    };

    config::redis_config cfg;
    std::string wait_replicas; // durability replicated: WAIT's arguments
    std::string wait_timeout;
    redis_client_options options;
    script claim_v1 = make_script(claim_v1_lua);
    script complete = make_script(complete_lua);
    script release = make_script(release_lua);
    script extend = make_script(extend_lua);
    script inspect = make_script(inspect_lua);
    script purge = make_script(purge_lua);
    std::vector<worker> workers;
    net::any_io_executor first_executor;
    redis_cluster_options cluster_options;    // seeds set: Cluster mode
    std::shared_ptr<redis_sentinel> sentinel; // Sentinel mode: discovery and the watch

    std::atomic<bool> closed{false};
    /// A check that refuses the store (allkeys-* with refuse) failed after a degraded start.
    std::atomic<bool> refused{false};

    bool clustered() const noexcept { return !cluster_options.seeds.empty(); }

    worker* local(const net::any_io_executor& ex) noexcept {
        auto* ctx = &net::query(ex, net::execution::context);
        for (auto& w : workers) {
            if (w.context == ctx) {
                return &w;
            }
        }
        return nullptr;
    }

    redis_client* pick(const net::any_io_executor& ex) noexcept {
        if (refused.load(std::memory_order_relaxed)) {
            return nullptr;
        }
        worker* w = local(ex);
        if (w == nullptr || w->clients.empty()) {
            return nullptr;
        }
        return &w->clients[w->next++ % w->clients.size()];
    }

    // Where an operation on Redis key `key` goes from `ex`: a connection of the worker, or in
    // Cluster mode the worker's router, which picks the master of the key's hash slot. `key`
    // must outlive the route.
    redis_route route(const net::any_io_executor& ex, std::string_view key) noexcept {
        if (!clustered()) {
            redis_client* c = pick(ex);
            return c != nullptr ? redis_route(c) : redis_route();
        }
        if (refused.load(std::memory_order_relaxed)) {
            return {};
        }
        worker* w = local(ex);
        if (w == nullptr || w->clusters.empty()) {
            return {};
        }
        return {w->clusters[w->next++ % w->clusters.size()].get(), key};
    }

    // durability replicated: `cmd` and a WAIT behind it on the same connection (a WAIT counts
    // only what its own connection wrote). On one node both go in the same pipeline write; in
    // Cluster mode the WAIT follows the command's reply, on the connection of the master that
    // ran it after any MOVED or ASK. Fewer acknowledgements than `replicas` → not_replicated.
    net::awaitable<redis_exec_result> exec_replicated(redis_route& c, redis_args cmd) {
        auto both =
            co_await c.async_exec_replicated(cmd, command("WAIT", wait_replicas, wait_timeout));
        redis_exec_result& r = both.first;
        const redis_exec_result& w = both.second;
        if (r.ec || r.reply.is_error()) {
            co_return r;
        }
        if (w.ec) {
            r.ec = w.ec;
        } else if (w.reply.type != redis_reply::kind::integer) {
            r.ec = reply_error();
        } else if (w.reply.integer < static_cast<long long>(cfg.replicas)) {
            r.ec = errc::not_replicated;
        }
        if (r.ec) {
            r.written = true;
            log::debug("store", "write not acknowledged by enough replicas",
                       {{"required", static_cast<std::int64_t>(cfg.replicas)},
                        {"acknowledged", static_cast<std::int64_t>(w.ec ? -1 : w.reply.integer)}});
        }
        co_return r;
    }

    // `cmd`, followed by WAIT when `durable` and durability is replicated. No coroutine frame
    // of its own: the result's `ec` may be the driver's (pass it through store_error). Keep
    // `cmd` alive while awaiting.
    net::awaitable<redis_exec_result> exec(redis_route& c, redis_args cmd, bool durable) {
        if (durable && cfg.durability == config::redis_durability::replicated) {
            return exec_replicated(c, cmd);
        }
        return c.async_exec(cmd);
    }

    // EVALSHA of `s` on `key` with `args` (at most three); on NOSCRIPT (nothing ran), one EVAL
    // of the same script, which also reloads it. `durable`: followed by WAIT when durability is
    // replicated (claim and complete). Keep `key` and `args` alive while awaiting.
    net::awaitable<redis_exec_result> eval(redis_route& c, const script& s, std::string_view key,
                                           redis_args args, bool durable = false) {
        std::array<std::string_view, 7> cmd{"EVALSHA", s.sha, "1", key};
        assert(args.size() <= cmd.size() - 4);
        const auto n = 4 + std::min(args.size(), cmd.size() - 4);
        std::copy(args.begin(), args.begin() + (n - 4), cmd.begin() + 4);
        const std::span<const std::string_view> all(cmd.data(), n);
        auto r = co_await exec(c, all, durable);
        r.ec = store_error(r.ec);
        if (!r.ec && r.reply.is_error("NOSCRIPT")) {
            cmd[0] = "EVAL";
            cmd[1] = s.body;
            r = co_await exec(c, all, durable);
            r.ec = store_error(r.ec);
            if (!r.ec && r.reply.is_error("NOSCRIPT")) {
                r.ec = errc::script_missing;
            }
        }
        if (!r.ec && r.reply.is_error()) {
            r.ec = reply_error();
        }
        co_return r;
    }
};
redis_store::redis_store(const config::redis_config& cfg,
                         std::vector<net::any_io_executor> executors)
    : impl_(std::make_unique<impl>()) {
    // Cluster mode: the seed nodes; the first one stands in for `url` (credentials, TLS, the
    // start-up check).
    std::vector<redis_node_address> seeds;
    for (const auto& node : cfg.cluster.nodes) {
        const std::string text = (cfg.cluster.tls ? "rediss://" : "redis://") + node;
        auto seed = parse_redis_url(text);
        if (!seed) {
            throw std::invalid_argument("store.redis.cluster.nodes: '" + node +
                                        "': " + describe_redis_url_error(text));
        }
        seeds.push_back({seed->host, seed->port});
    }
    const std::string url_text =
        seeds.empty() ? cfg.url
                      : (cfg.cluster.tls ? "rediss://" : "redis://") + cfg.cluster.nodes.front();
    // With Sentinel the data nodes' address comes from the sentinels (url is not used).
    auto url =
        cfg.sentinel ? boost::system::result<redis_url>(redis_url{}) : parse_redis_url(url_text);
    if (!url) {
        throw std::invalid_argument("store.redis.url: " + describe_redis_url_error(cfg.url));
    }
    if (executors.empty()) {
        throw std::invalid_argument("redis_store needs at least one worker executor");
    }
    impl_->cfg = cfg;
    impl_->wait_replicas = std::to_string(cfg.replicas);
    impl_->wait_timeout = std::to_string(cfg.wait_timeout.count());
    auto& o = impl_->options;
    o.url = *url;
    // The fields of their own win over the URL (the config refuses both at once).
    if (!cfg.username.empty()) {
        o.url.user = cfg.username;
    }
    if (!cfg.password.empty()) {
        o.url.password = cfg.password;
    }
    o.tls_ca_file = cfg.tls_ca_file;
    o.connect_timeout = cfg.connect_timeout;
    o.command_timeout = cfg.command_timeout;
    o.health_check_interval = cfg.health_check_interval;
    if (cfg.sentinel) {
        redis_sentinel_options so;
        so.master_name = cfg.sentinel->master;
        for (const auto& n : cfg.sentinel->nodes) {
            so.nodes.push_back({n.host, n.port});
        }
        so.username = cfg.sentinel->username;
        so.password = cfg.sentinel->password;
        so.tls = cfg.sentinel->tls;
        so.tls_ca_file = cfg.tls_ca_file;
        so.connect_timeout = cfg.connect_timeout;
        so.command_timeout = cfg.command_timeout;
        so.health_check_interval = cfg.health_check_interval;
        impl_->sentinel = std::make_shared<redis_sentinel>(std::move(so));
        o.address_source = redis_sentinel::address_source(impl_->sentinel);
        o.on_connected = redis_sentinel::connected_sink(impl_->sentinel);
    }
    o.scripts = {impl_->complete.body, impl_->release.body, impl_->extend.body,
                 impl_->inspect.body,  impl_->purge.body,   impl_->claim_v1.body};
    const std::size_t per_worker = std::max<std::size_t>(cfg.connections_per_worker, 1);
    impl_->first_executor = executors.front();
    impl_->cluster_options.node = o;
    impl_->cluster_options.seeds = std::move(seeds);
    for (auto& ex : executors) {
        impl::worker w;
        w.context = &net::query(ex, net::execution::context);
        for (std::size_t i = 0; i < per_worker; ++i) {
            if (impl_->clustered()) {
                w.clusters.push_back(std::make_unique<redis_cluster>(ex, impl_->cluster_options));
            } else {
                w.clients.emplace_back(ex, o);
            }
        }
        impl_->workers.push_back(std::move(w));
    }
}

redis_store::~redis_store() = default;

void redis_store::start() {
    for (auto& w : impl_->workers) {
        for (auto& c : w.clients) {
            net::post(c.get_executor(), [&c] { c.start(); });
        }
        for (auto& c : w.clusters) {
            net::post(c->get_executor(), [p = c.get()] { p->start(); });
        }
    }
    if (impl_->sentinel) {
        // +switch-master: every connection not at the new master drops and reconnects there.
        impl_->sentinel->start_watch(
            impl_->first_executor, [m = impl_.get()](const std::string& host, std::uint16_t port) {
                for (auto& w : m->workers) {
                    for (auto& c : w.clients) {
                        net::post(c.get_executor(),
                                  [&c, host, port] { c.drop_connection_unless_at(host, port); });
                    }
                }
            });
    }
}

bool redis_store::follows_master() const noexcept {
    return impl_->sentinel != nullptr;
}

void redis_store::set_master_switch_observer(std::function<void(master_switch_cause)> observer) {
    if (impl_->sentinel) {
        impl_->sentinel->set_switch_observer(std::move(observer));
    }
}

net::awaitable<open_report> redis_store::async_open() {
    auto checked = co_await async_check_startup();
    open_report report;
    report.warnings = std::move(checked.warnings);
    if (checked.ec == errc::unavailable || checked.ec == errc::timeout) {
        // Unreachable is not a reason to exit: a crash loop would take the plain routes down
        // with it (issue 9). The connections keep trying with backoff; until one answers,
        // operations fail with errc::unavailable and routes follow on_store_error. The
        // maxmemory-policy check runs once Redis answers.
        report.degraded = true;
        report.message = std::move(checked.message);
        if (report.message.empty()) {
            report.message = checked.ec.message();
        }
        start();
        net::co_spawn(impl_->first_executor, deferred_check(), net::detached);
        co_return report;
    }
    if (checked.ec) {
        report.ec = checked.ec;
        report.message = std::move(checked.message);
        co_return report;
    }
    start();
    co_return report;
}

void redis_store::close() {
    stop();
}

void redis_store::set_password(std::string password) {
    // Each copy is touched only on its own executor: the clients' options on theirs, the
    // store's (read by async_check_startup, which runs on the first worker) on the first's.
    for (auto& w : impl_->workers) {
        for (auto& c : w.clients) {
            net::post(c.get_executor(), [&c, password] { c.set_password(password); });
        }
        for (auto& c : w.clusters) {
            net::post(c->get_executor(), [p = c.get(), password] { p->set_password(password); });
        }
    }
    net::post(impl_->first_executor, [m = impl_.get(), password = std::move(password)]() mutable {
        m->options.url.password = std::move(password);
    });
}

net::awaitable<void> redis_store::deferred_check() {
    // Runs on the first worker until Redis has answered the start-up check once, or close().
    auto first = impl_->route(impl_->first_executor, {});
    while (!impl_->closed) {
        const bool up = co_await first.async_wait_ready(std::chrono::seconds(1));
        if (!up) {
            continue;
        }
        auto checked = co_await async_check_startup();
        if (checked.ec == errc::unavailable || checked.ec == errc::timeout) {
            continue; // lost again at once: wait for the next connection
        }
        for (const auto& w : checked.warnings) {
            log::warn("store", w);
        }
        if (checked.ec == boost::system::errc::operation_not_permitted) {
            // An evicting Redis with maxmemory_policy refuse: too late to refuse to start, so
            // the store refuses to be used; guarded routes follow on_store_error, /readyz with
            // require_store reports it.
            impl_->refused = true;
            log::error("store", checked.message + " (found after a degraded start: the store is "
                                                  "not used)");
        } else if (checked.ec) {
            // The connections report and retry such failures (AUTH, SELECT) themselves.
            log::error("store", checked.message);
        } else {
            log::info("store", "redis answering; the store is in service");
        }
        co_return;
    }
}

void redis_store::stop() {
    impl_->closed = true;
    if (impl_->sentinel) {
        impl_->sentinel->stop_watch();
    }
    for (auto& w : impl_->workers) {
        for (auto& c : w.clients) {
            net::post(c.get_executor(), [&c] { c.stop(); });
        }
        for (auto& c : w.clusters) {
            net::post(c->get_executor(), [p = c.get()] { p->stop(); });
        }
    }
}

std::string redis_store::redis_key(std::string_view key) const {
    std::string out = impl_->cfg.key_prefix;
    out.append(key);
    return out;
}

redis_sentinel* redis_store::sentinel() noexcept {
    return impl_->sentinel.get();
}

redis_client* redis_store::client_for(const net::any_io_executor& ex) noexcept {
    return impl_->pick(ex);
}

net::awaitable<redis_startup_report> redis_store::async_check_startup() {
    redis_startup_report report;
    auto ex = co_await net::this_coro::executor;
    auto opts = impl_->options;
    opts.health_check_interval = duration{0};
    redis_client probe(ex, opts);
    auto connected = co_await probe.async_connect_once();
    connected.ec = store_error(connected.ec);
    // Cluster mode: the first seed node that answers (each has the same settings to check).
    for (std::size_t i = 1; i < impl_->cluster_options.seeds.size() &&
                            (connected.ec == errc::unavailable || connected.ec == errc::timeout);
         ++i) {
        opts.url.host = impl_->cluster_options.seeds[i].host;
        opts.url.port = impl_->cluster_options.seeds[i].port;
        probe = redis_client(ex, opts);
        connected = co_await probe.async_connect_once();
        connected.ec = store_error(connected.ec);
    }
    if (connected.ec) {
        report.ec = connected.ec;
        report.message = connected.message;
        co_return report;
    }
    const std::string where = impl_->cfg.sentinel
                                  ? "the master of '" + impl_->cfg.sentinel->master + "'"
                                  : opts.url.host + ":" + std::to_string(opts.url.port);
    // A claim is SET ... NX ... GET (redis_record.hpp): Redis 7.0 or newer.
    auto version = co_await probe.async_exec(command("INFO", "server"));
    if (!version.ec && version.reply.type == redis_reply::kind::string) {
        const auto v = redis_record::redis_version(version.reply.str);
        const auto major = redis_record::major_version(v);
        if (major && *major < redis_record::minimum_redis_major) {
            report.ec =
                boost::system::errc::make_error_code(boost::system::errc::operation_not_permitted);
            report.message = "Redis at " + where + " is version " + std::string(v) +
                             "; onceproxy needs Redis 7.0 or newer (a claim is SET ... NX ... "
                             "GET)";
            probe.stop();
            co_return report;
        }
        if (!major) {
            report.warnings.push_back("cannot read the version of Redis at " + where +
                                      ": make sure it is 7.0 or newer");
        }
    } else {
        report.warnings.push_back("cannot read the version of Redis at " + where +
                                  " (INFO server): make sure it is 7.0 or newer");
    }
    auto r = co_await probe.async_exec(command("CONFIG", "GET", "maxmemory-policy"));
    r.ec = store_error(r.ec);
    if (r.ec) {
        report.ec = r.ec;
        report.message =
            "CONFIG GET maxmemory-policy on Redis at " + where + " failed: " + r.ec.message();
    } else if (r.reply.is_error()) {
        // Managed Redis often forbids CONFIG: we cannot check, so we say what to check.
        report.warnings.push_back("cannot read maxmemory-policy of Redis at " + where + " (" +
                                  r.reply.str +
                                  "): make sure it is not allkeys-*, which could evict live "
                                  "idempotency records");
    } else if (r.reply.type == redis_reply::kind::array && r.reply.elements.size() == 2) {
        const std::string& policy = r.reply.elements[1].str;
        if (policy.rfind("allkeys-", 0) == 0) {
            std::string text = "Redis at " + where + " has maxmemory-policy " + policy +
                               ", which can evict live idempotency records (use noeviction or "
                               "volatile-*)";
            if (impl_->cfg.maxmemory_policy == config::maxmemory_check::refuse) {
                report.ec = boost::system::errc::make_error_code(
                    boost::system::errc::operation_not_permitted);
                report.message = text + "; refusing to start (store.redis.maxmemory_policy: "
                                        "refuse)";
            } else {
                report.warnings.push_back(std::move(text));
            }
        }
    } else {
        report.ec = errc::protocol;
        report.message = "unexpected reply to CONFIG GET maxmemory-policy from Redis at " + where;
    }
    probe.stop();
    co_return report;
}

namespace {

std::int64_t unix_millis() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// SET key value NX PX lease GET: takes the lease if the key is free, else returns what is there.
// Holds the arguments it builds; `key` is viewed.
class claim_command {
public:
    claim_command(std::string_view key, const claim_request& req)
        : key_(key),
          value_(redis_record::claim_value(req.owner, req.fingerprint,
                                           req.created_ms != 0 ? req.created_ms : unix_millis())),
          lease_(millis(req.lease)) {}
    std::array<std::string_view, 7> args() const noexcept {
        return {"SET", key_, value_, "NX", "PX", lease_, "GET"};
    }

private:
    std::string_view key_;
    std::string value_;
    decimal lease_;
};

// What a claim found in an existing value of layout 2. `value` is the reply's string: a
// completed record's payload is cut out of it in place.
result<claim_result> found(std::string& value, const claim_request& req) {
    const auto v = redis_record::parse(value);
    if (!v) {
        return reply_error();
    }
    claim_result out;
    if (v->fingerprint != req.fingerprint) {
        out.status = claim_status::mismatch;
    } else if (v->state == redis_record::completed) {
        out.status = claim_status::completed;
        out.created_ms = v->created_ms;
        value.erase(0, v->payload_offset);
        out.record = std::move(value);
    } else {
        out.status = claim_status::in_flight;
    }
    return out;
}

} // namespace

net::awaitable<result<claim_result>> redis_store::async_claim(claim_request req) {
    auto ex = co_await net::this_coro::executor;
    std::string key = redis_key(req.key);
    auto c = impl_->route(ex, key);
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    const claim_command claim(key, req);
    auto r = co_await impl_->exec(c, claim.args(), true);
    r.ec = store_error(r.ec);
    if (r.ec) {
        if (r.written && (r.ec == errc::timeout || r.ec == errc::unavailable)) {
            co_return co_await recover_lost_claim(c, key, req, r.ec, 1);
        }
        co_return r.ec;
    }
    claim_result out;
    switch (r.reply.type) {
    case redis_reply::kind::nil:
        out.status = claim_status::acquired; // the key was free: our value is set
        co_return out;
    case redis_reply::kind::string: {
        auto f = found(r.reply.str, req);
        if (!f || f->status != claim_status::in_flight) {
            co_return f;
        }
        out = std::move(*f);
        break;
    }
    case redis_reply::kind::error:
        if (r.reply.is_error("WRONGTYPE")) {
            co_return co_await claim_v1(c, key, req);
        }
        co_return reply_error();
    default:
        co_return reply_error();
    }
    // In flight: how long the other lease has left (a second round trip, on this path only;
    // -2 when it lapsed meanwhile, which reads as no time left; if it cannot be read, a whole
    // lease).
    out.round_trips = 2;
    auto left = co_await c.async_exec(command("PTTL", key));
    out.remaining_lease = req.lease; // unread: the longest it can be, so waiters back off
    if (!left.ec && left.reply.type == redis_reply::kind::integer) {
        out.remaining_lease = duration{std::max<long long>(left.reply.integer, 0)};
    }
    co_return out;
}

net::awaitable<result<claim_result>>
redis_store::recover_lost_claim(redis_route& c, const std::string& key, const claim_request& req,
                                error_code ec, unsigned round_trips) {
    if (!co_await c.async_wait_ready(impl_->cfg.connect_timeout)) {
        co_return ec;
    }
    claim_result out;
    out.status = claim_status::acquired;
    if (impl_->cfg.durability == config::redis_durability::replicated) {
        // Ours only if the replicas hold it too. The claim's own WAIT went with its reply, and a
        // WAIT counts what its own connection wrote (Redis 7.0 answers one sent before any
        // other command of its connection at once). So the lease is asserted again with the
        // fenced extend, a write that replicates after the claim, and the WAIT goes behind it.
        auto held = co_await impl_->eval(c, impl_->extend, key,
                                         command(req.owner, millis(req.lease)), true);
        out.round_trips = round_trips + 1;
        if (held.ec == errc::not_replicated) {
            co_return held.ec;
        }
        if (!held.ec && held.reply.type == redis_reply::kind::integer && held.reply.integer == 1) {
            co_return out;
        }
        co_return ec;
    }
    auto held = co_await c.async_exec(command("GET", key));
    out.round_trips = round_trips + 1;
    if (!held.ec && held.reply.type == redis_reply::kind::string) {
        const auto v = redis_record::parse(held.reply.str);
        if (v && v->state == redis_record::in_flight && v->owner == req.owner) {
            co_return out;
        }
    }
    co_return ec;
}

net::awaitable<result<claim_result>> redis_store::claim_v1(redis_route& c, const std::string& key,
                                                           const claim_request& req) {
    auto r = co_await impl_->eval(c, impl_->claim_v1, key, command(req.fingerprint));
    if (r.ec) {
        co_return r.ec;
    }
    const auto& rep = r.reply;
    if (rep.type != redis_reply::kind::array || rep.elements.empty() ||
        rep.elements[0].type != redis_reply::kind::integer) {
        co_return reply_error();
    }
    claim_result out;
    out.round_trips = 2;
    switch (rep.elements[0].integer) {
    case 1:
        out.status = claim_status::in_flight;
        if (rep.elements.size() > 1 && rep.elements[1].type == redis_reply::kind::integer) {
            out.remaining_lease = duration{std::max<long long>(rep.elements[1].integer, 0)};
        }
        break;
    case 2:
        if (rep.elements.size() < 2 || rep.elements[1].type != redis_reply::kind::string) {
            co_return reply_error();
        }
        out.status = claim_status::completed;
        out.record = std::move(r.reply.elements[1].str);
        break;
    case 3:
        out.status = claim_status::mismatch;
        break;
    case 4: {
        // The version 1 record lapsed between the two reads: claim it in this layout, once.
        const claim_command claim(key, req);
        auto again = co_await impl_->exec(c, claim.args(), true);
        again.ec = store_error(again.ec);
        if (again.ec) {
            if (again.written && (again.ec == errc::timeout || again.ec == errc::unavailable)) {
                co_return co_await recover_lost_claim(c, key, req, again.ec, 3);
            }
            co_return again.ec; // (not retried blindly: the caller's policy decides)
        }
        if (again.reply.type == redis_reply::kind::nil) {
            out.status = claim_status::acquired;
            out.round_trips = 3;
            co_return out;
        }
        if (again.reply.type != redis_reply::kind::string) {
            co_return reply_error();
        }
        auto f = found(again.reply.str, req);
        if (f) {
            f->round_trips = 3;
        }
        co_return f;
    }
    default:
        co_return reply_error();
    }
    co_return out;
}

net::awaitable<result<fence_status>>
redis_store::async_complete(std::string_view key, std::string_view owner, std::string_view payload,
                            duration ttl, record_kind kind, claimed_lease claimed) {
    // Redis keeps every record for its ttl whatever it holds: its own maxmemory bounds it.
    (void)kind;
    auto ex = co_await net::this_coro::executor;
    std::string rkey = redis_key(key);
    auto c = impl_->route(ex, rkey);
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    std::string lease =
        claimed.created_ms != 0
            ? redis_record::claim_value(owner, claimed.fingerprint, claimed.created_ms)
            : redis_record::lease_prefix(owner);
    const std::string record = redis_record::completed_value(lease, payload);
    auto r =
        co_await impl_->eval(c, impl_->complete, rkey, command(lease, record, millis(ttl)), true);
    co_return to_fence(r);
}

net::awaitable<result<fence_status>> redis_store::async_release(std::string_view key,
                                                                std::string_view owner) {
    auto ex = co_await net::this_coro::executor;
    std::string rkey = redis_key(key);
    auto c = impl_->route(ex, rkey);
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    auto r = co_await impl_->eval(c, impl_->release, rkey, command(owner));
    co_return to_fence(r);
}

net::awaitable<result<fence_status>>
redis_store::async_extend(std::string_view key, std::string_view owner, duration lease) {
    auto ex = co_await net::this_coro::executor;
    std::string rkey = redis_key(key);
    auto c = impl_->route(ex, rkey);
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    auto r = co_await impl_->eval(c, impl_->extend, rkey, command(owner, millis(lease)));
    co_return to_fence(r);
}

net::awaitable<result<key_info>> redis_store::async_inspect(std::string key) {
    auto ex = co_await net::this_coro::executor;
    std::string rkey = redis_key(key);
    auto c = impl_->route(ex, rkey);
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    auto r = co_await impl_->eval(c, impl_->inspect, rkey, redis_args());
    if (r.ec) {
        co_return r.ec;
    }
    auto& rep = r.reply;
    using kind = redis_reply::kind;
    if (rep.type != kind::array || rep.elements.empty() || rep.elements[0].type != kind::integer) {
        co_return reply_error();
    }
    key_info info;
    const auto state = rep.elements[0].integer;
    if (state == 0) {
        co_return info;
    }
    if (state == 4) {
        // Layout 2: {4, pttl, value}.
        if (rep.elements.size() != 3 || rep.elements[1].type != kind::integer ||
            rep.elements[2].type != kind::string) {
            co_return reply_error();
        }
        auto& value = rep.elements[2].str;
        const auto v = redis_record::parse(value);
        if (!v) {
            co_return reply_error();
        }
        info.remaining = duration{std::max<long long>(rep.elements[1].integer, 0)};
        if (v->state == redis_record::in_flight) {
            info.state = key_state::in_flight;
            info.owner_age = duration{std::max<std::int64_t>(unix_millis() - v->created_ms, 0)};
        } else {
            info.state = key_state::completed;
            info.fingerprint = std::string(v->fingerprint);
            info.created_ms = v->created_ms;
            value.erase(0, v->payload_offset);
            info.record = std::move(value);
        }
        co_return info;
    }
    if ((state != 1 && state != 2) || rep.elements.size() != 3 ||
        rep.elements[1].type != kind::integer) {
        co_return reply_error();
    }
    info.remaining = duration{std::max<long long>(rep.elements[1].integer, 0)};
    if (state == 1) {
        if (rep.elements[2].type != kind::integer) {
            co_return reply_error();
        }
        info.state = key_state::in_flight;
        info.owner_age = duration{rep.elements[2].integer < 0 ? -1 : rep.elements[2].integer};
    } else {
        if (rep.elements[2].type != kind::string) {
            co_return reply_error();
        }
        info.state = key_state::completed;
        info.record = std::move(rep.elements[2].str);
    }
    co_return info;
}

net::awaitable<result<purge_status>> redis_store::async_purge(std::string key, bool force) {
    auto ex = co_await net::this_coro::executor;
    std::string rkey = redis_key(key);
    auto c = impl_->route(ex, rkey);
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    auto r = co_await impl_->eval(c, impl_->purge, rkey, command(force ? "1" : "0"));
    if (r.ec) {
        co_return r.ec;
    }
    if (r.reply.type != redis_reply::kind::integer) {
        co_return reply_error();
    }
    switch (r.reply.integer) {
    case 0:
        co_return purge_status::absent;
    case 1:
        co_return purge_status::purged_record;
    case 2:
        co_return purge_status::in_flight;
    case 3:
        co_return purge_status::purged_lease;
    default:
        co_return reply_error();
    }
}

net::awaitable<result<void>> redis_store::async_ping() {
    auto ex = co_await net::this_coro::executor;
    // In Cluster mode: the master of slot 0's key ("").
    auto c = impl_->route(ex, {});
    if (!c) {
        co_return error_code(errc::unavailable);
    }
    auto r = co_await c.async_exec(command("PING"));
    if (r.ec) {
        co_return store_error(r.ec);
    }
    if (r.reply.is_error()) {
        co_return reply_error();
    }
    co_return result<void>{};
}

} // namespace onceproxy::store
