#include "onceproxy/redis/redis_cluster.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/redis/error.hpp"
#include "onceproxy/wire/coarse_clock.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <map>

// GCC 12 reports a false -Wmismatched-new-delete on Asio's awaitable frames once it inlines
// their recycling allocator (operator new and delete do match: thread_info_base).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace onceproxy::redis {

namespace net = boost::asio;
using clock = std::chrono::steady_clock;

struct redis_cluster::impl : std::enable_shared_from_this<redis_cluster::impl> {
    impl(net::any_io_executor executor, redis_cluster_options opts)
        : ex(std::move(executor)), options(std::move(opts)), wake(ex), pause(ex) {
        wake.expires_at(net::steady_timer::time_point::max());
    }

    // The connection of `a`, created and started on first use.
    std::shared_ptr<redis_client> node(const redis_node_address& a) {
        const std::string name = a.text();
        auto it = nodes.find(name);
        if (it != nodes.end()) {
            return it->second;
        }
        auto o = options.node;
        o.url.host = a.host;
        o.url.port = a.port;
        o.url.db = 0;
        auto c = std::make_shared<redis_client>(ex, std::move(o));
        if (!stopped) {
            c->start();
        }
        nodes.emplace(name, c);
        return c;
    }

    std::shared_ptr<redis_client> for_slot(std::uint16_t slot) {
        if (!have_map) {
            return nullptr;
        }
        const int o = map.owner[slot];
        if (o < 0) {
            return nullptr;
        }
        return by_master[static_cast<std::size_t>(o)];
    }

    void install(redis_slot_map m) {
        std::vector<std::shared_ptr<redis_client>> clients;
        clients.reserve(m.masters.size());
        for (const auto& a : m.masters) {
            clients.push_back(node(a));
        }
        map = std::move(m);
        by_master = std::move(clients);
        have_map = true;
        ++refreshes;
        // Connections to nodes that are neither masters nor seeds any more are let go: one no
        // operation uses closes now, one still in use (an ASK target that owns no slot yet)
        // closes once its last operation has its reply.
        for (auto it = nodes.begin(); it != nodes.end();) {
            const bool master =
                std::any_of(map.masters.begin(), map.masters.end(),
                            [&](const redis_node_address& a) { return a.text() == it->first; });
            const bool seed =
                std::any_of(options.seeds.begin(), options.seeds.end(),
                            [&](const redis_node_address& a) { return a.text() == it->first; });
            if (!master && !seed) {
                it = nodes.erase(it); // ~redis_client stops it with the last reference
            } else {
                ++it;
            }
        }
        notify();
    }

    // MOVED: the slot belongs to `a` now.
    std::shared_ptr<redis_client> move_slot(std::uint16_t slot, const redis_node_address& a) {
        auto c = node(a);
        if (have_map) {
            const int o = map.add_master(a);
            if (static_cast<std::size_t>(o) == by_master.size()) {
                by_master.push_back(c);
            }
            map.owner[slot] = o;
        }
        return c;
    }

    void notify() {
        for (auto& w : waiters) {
            if (auto t = w.lock()) {
                t->cancel();
            }
        }
        waiters.clear();
    }

    net::awaitable<void> wait_change(clock::time_point deadline) {
        auto timer = std::make_shared<net::steady_timer>(ex, deadline);
        waiters.push_back(timer);
        co_await timer->async_wait(use_tuple);
    }

    void request_refresh() {
        refresh_wanted = true;
        wake.cancel();
    }

    // Asks one node for the slot map: CLUSTER SHARDS, or CLUSTER SLOTS where unknown.
    net::awaitable<std::optional<redis_slot_map>> ask(std::shared_ptr<redis_client> c,
                                                      redis_node_address a) {
        auto r = co_await c->async_exec(command("CLUSTER", "SHARDS"));
        if (r.ec) {
            co_return std::nullopt;
        }
        if (!r.reply.is_error()) {
            co_return parse_cluster_shards(r.reply, a, options.node.url.tls);
        }
        r = co_await c->async_exec(command("CLUSTER", "SLOTS"));
        if (r.ec || r.reply.is_error()) {
            co_return std::nullopt;
        }
        co_return parse_cluster_slots(r.reply, a);
    }

    net::awaitable<bool> refresh_once() {
        auto self = shared_from_this();
        // The masters we know first (connected ones first), then the seeds.
        std::vector<redis_node_address> candidates = map.masters;
        std::stable_partition(candidates.begin(), candidates.end(),
                              [&](const redis_node_address& a) {
                                  auto it = nodes.find(a.text());
                                  return it != nodes.end() && it->second->ready();
                              });
        for (const auto& s : options.seeds) {
            if (std::find(candidates.begin(), candidates.end(), s) == candidates.end()) {
                candidates.push_back(s);
            }
        }
        for (const auto& a : candidates) {
            if (stopped) {
                co_return false;
            }
            auto c = node(a);
            if (!c->ready()) {
                const bool up = co_await c->async_wait_ready(options.node.connect_timeout);
                if (!up) {
                    continue;
                }
            }
            auto m = co_await ask(c, a);
            if (stopped) {
                co_return false;
            }
            if (m && m->covered() > 0) {
                if (m->covered() < redis_cluster_slots) {
                    log::warn("store", "redis cluster: slot map is incomplete",
                              {{"asked", a.text()},
                               {"covered_slots", static_cast<std::uint64_t>(m->covered())}});
                    if (have_map) {
                        m->keep_known(map); // the slots it left out keep the owner we knew
                    }
                }
                install(std::move(*m));
                co_return true;
            }
        }
        co_return false;
    }

    net::awaitable<void> run() {
        auto self = shared_from_this();
        auto backoff = options.node.reconnect_min;
        bool logged_failure = false;
        while (!stopped) {
            refresh_wanted = false;
            const bool ok = co_await refresh_once();
            if (stopped) {
                co_return;
            }
            if (ok) {
                if (logged_failure || refreshes == 1) {
                    log::info("store", "redis cluster: slot map loaded",
                              {{"masters", static_cast<std::uint64_t>(map.masters.size())}});
                }
                logged_failure = false;
                backoff = options.node.reconnect_min;
            } else {
                if (!logged_failure) {
                    log::warn("store", "redis cluster: no node answered with a slot map; "
                                       "retrying");
                    logged_failure = true;
                }
                notify(); // waiters give up on their own deadline
            }
            // Never two refreshes closer than refresh_min_interval, however many operations ask
            // (a resharding answers many of them with MOVED at once).
            pause.expires_after(options.refresh_min_interval);
            co_await pause.async_wait(use_tuple);
            if (refresh_wanted || stopped) {
                continue;
            }
            // Then on request, or after a failure with backoff, else every
            // health_check_interval (a topology change that no operation has run into yet).
            const auto period = options.node.health_check_interval.count() > 0
                                    ? options.node.health_check_interval
                                    : std::chrono::milliseconds(5'000);
            wake.expires_after(ok ? period : backoff);
            co_await wake.async_wait(use_tuple);
            if (!ok) {
                backoff = std::min(backoff * 2, options.node.reconnect_max);
            }
        }
    }

    void stop() {
        stopped = true;
        wake.cancel();
        pause.cancel();
        for (auto& [name, c] : nodes) {
            c->stop();
        }
        notify();
    }

    net::any_io_executor ex;
    redis_cluster_options options;
    net::steady_timer wake;  // cut short by request_refresh()
    net::steady_timer pause; // refresh_min_interval, not cut short
    std::map<std::string, std::shared_ptr<redis_client>> nodes; // by "host:port"
    redis_slot_map map;
    std::vector<std::shared_ptr<redis_client>> by_master; // aligned with map.masters
    bool have_map = false;
    bool refresh_wanted = false;
    bool started = false;
    bool stopped = false;
    std::uint64_t refreshes = 0;
    std::vector<std::weak_ptr<net::steady_timer>> waiters;
};

redis_cluster::redis_cluster(executor_type ex, redis_cluster_options options)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(options))) {}

redis_cluster::~redis_cluster() {
    impl_->stop();
}

const redis_cluster::executor_type& redis_cluster::get_executor() const noexcept {
    return impl_->ex;
}

void redis_cluster::start() {
    if (impl_->started) {
        return;
    }
    impl_->started = true;
    for (const auto& s : impl_->options.seeds) {
        impl_->node(s);
    }
    net::co_spawn(impl_->ex, impl_->run(), net::detached);
}

void redis_cluster::stop() {
    impl_->stop();
}

void redis_cluster::set_password(std::string password) {
    for (auto& [name, c] : impl_->nodes) {
        c->set_password(password);
    }
    impl_->options.node.url.password = std::move(password);
}

void redis_cluster::request_refresh() {
    impl_->request_refresh();
}

bool redis_cluster::ready() const noexcept {
    return impl_->have_map && impl_->map.covered() == redis_cluster_slots;
}

std::uint64_t redis_cluster::refresh_count() const noexcept {
    return impl_->refreshes;
}

redis_client* redis_cluster::client_for(std::string_view key) noexcept {
    return impl_->for_slot(redis_key_slot(key)).get();
}

namespace {

/// The connection a command ran on: its node, and that node's connect_count() when it was
/// sent.
struct ran_on {
    std::shared_ptr<redis_client> client;
    std::uint64_t connection = 0;
};

/// redis_cluster::async_exec; `at` (if given) learns where the command ran when it got a
/// reply that is not a redirect.
net::awaitable<redis_exec_result> exec_routed(std::shared_ptr<redis_cluster::impl> self,
                                              std::string_view key, redis_args args, ran_on* at) {
    const auto slot = redis_key_slot(key);
    // Waiting for a map or a connection is bounded by one command_timeout in all (from the
    // coarse clock, never earlier: the checks against it stay precise).
    const auto deadline = wire::coarse_now() + self->options.node.command_timeout;
    redis_exec_result r;
    r.ec = errc::unavailable;
    std::shared_ptr<redis_client> target;
    bool asking = false;
    for (int hop = 0; hop <= self->options.max_redirects && !self->stopped; ++hop) {
        if (!target) {
            target = self->for_slot(slot);
            while (!target && !self->stopped && clock::now() < deadline) {
                self->request_refresh();
                co_await self->wait_change(deadline);
                target = self->for_slot(slot);
            }
            if (!target) {
                redis_exec_result none;
                none.ec = errc::unavailable;
                co_return none;
            }
        }
        if (!target->ready()) {
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
            bool up = false;
            if (left.count() > 0) {
                up = co_await target->async_wait_ready(left);
            }
            if (!up) {
                // Not connected: nothing was sent. The master may have failed over.
                self->request_refresh();
                redis_exec_result none;
                none.ec = errc::unavailable;
                co_return none;
            }
        }
        const auto connection = target->connect_count();
        if (asking) {
            r = co_await target->async_exec_asking(args);
        } else {
            r = co_await target->async_exec(args);
        }
        if (r.ec) {
            self->request_refresh();
            if (!r.written && r.ec == errc::unavailable && clock::now() < deadline) {
                // Certainly not executed (it never left): safe to send again on a new map.
                target.reset();
                asking = false;
                continue;
            }
            co_return r;
        }
        if (auto redirect = parse_redirect(r.reply)) {
            // MOVED and ASK both mean the command did not run: following them is safe.
            if (redirect->type == redis_redirect::kind::moved) {
                target = self->move_slot(redirect->slot, redirect->target);
                asking = false;
                self->request_refresh();
            } else {
                target = self->node(redirect->target);
                asking = true;
            }
            continue;
        }
        if (r.reply.is_error("CLUSTERDOWN") || r.reply.is_error("TRYAGAIN")) {
            self->request_refresh();
        }
        if (at != nullptr) {
            at->client = target;
            at->connection = connection;
        }
        co_return r;
    }
    co_return r;
}

} // namespace

net::awaitable<redis_exec_result> redis_cluster::async_exec(std::string_view key, redis_args args) {
    return exec_routed(impl_, key, args, nullptr); // no coroutine frame of its own
}

net::awaitable<std::pair<redis_exec_result, redis_exec_result>>
redis_cluster::async_exec_replicated(std::string_view key, redis_args args, redis_args wait) {
    ran_on at;
    std::pair<redis_exec_result, redis_exec_result> out;
    out.first = co_await exec_routed(impl_, key, args, &at);
    out.second.ec = errc::unavailable;
    if (out.first.ec || out.first.reply.is_error() || !at.client) {
        co_return out;
    }
    // On the node that ran `args` (after a MOVED or ASK too), not the slot's owner by the map:
    // a map refreshed meanwhile, or an ASK, would send the WAIT to another master.
    out.second = co_await at.client->async_wait_replicas(wait);
    if (at.client->connect_count() != at.connection) {
        // The connection was replaced between the two: the WAIT did not follow `args` on it.
        out.second = {};
        out.second.ec = errc::unavailable;
        out.second.written = true;
    }
    co_return out;
}

net::awaitable<bool> redis_cluster::async_wait_ready(std::string_view key,
                                                     std::chrono::milliseconds timeout) {
    auto self = impl_;
    const auto deadline = clock::now() + timeout;
    const auto slot = redis_key_slot(key);
    while (!self->stopped) {
        auto c = self->for_slot(slot);
        if (c && c->ready()) {
            co_return true;
        }
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
        if (left.count() <= 0) {
            co_return false;
        }
        if (c) {
            const bool up = co_await c->async_wait_ready(left);
            if (up) {
                co_return true;
            }
        } else {
            co_await self->wait_change(deadline);
        }
    }
    co_return false;
}

net::awaitable<redis_exec_result> redis_route::async_exec(redis_args args) {
    // No coroutine frame of its own: the awaitable of the node or the cluster.
    if (cluster_ != nullptr) {
        return cluster_->async_exec(key_, args);
    }
    return client_->async_exec(args);
}

net::awaitable<std::pair<redis_exec_result, redis_exec_result>>
redis_route::async_exec_replicated(redis_args args, redis_args wait) {
    // No coroutine frame of its own: the awaitable of the node or the cluster.
    if (cluster_ != nullptr) {
        return cluster_->async_exec_replicated(key_, args, wait);
    }
    return client_->async_exec_replicated(args, wait);
}

net::awaitable<bool> redis_route::async_wait_ready(std::chrono::milliseconds timeout) {
    if (cluster_ != nullptr) {
        co_return co_await cluster_->async_wait_ready(key_, timeout);
    }
    co_return co_await client_->async_wait_ready(timeout);
}

} // namespace onceproxy::redis
