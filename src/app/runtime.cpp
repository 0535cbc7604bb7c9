#include "app/runtime.hpp"

#include "app/admin.hpp"
#include "app/store_factory.hpp"
#include "onceproxy/http/handler.hpp"
#include "onceproxy/http/loop_guard.hpp"
#include "onceproxy/http/server.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/upstream/forwarder.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

namespace onceproxy::app {

namespace net = boost::asio;
using clock = std::chrono::steady_clock;

namespace {

/// One event loop with everything a connection needs; a connection never leaves its worker.
struct worker {
    worker(net::io_context& c, std::shared_ptr<const config::config> cfg,
           std::shared_ptr<store::store> st, metrics::registry& reg)
        : ioc(c), guard(net::make_work_guard(ioc)), watch(ioc.get_executor()),
          fwd(ioc.get_executor(), cfg, watch), h(cfg, fwd, std::move(st), reg),
          srv(ioc, cfg, h, reg, watch) {}

    net::io_context& ioc;
    net::executor_work_guard<net::io_context::executor_type> guard;
    wire::deadline_watch watch; ///< coarse I/O deadlines of every socket of this worker
    upstream::forwarder fwd;
    http::handler h;
    http::server srv;
    std::thread thread;
};

/// After the drain deadline: how long exchanges still get to record or release their key
/// before the store closes.
constexpr auto completion_grace = std::chrono::seconds(2);

/// Shared by the draining workers: the last one to finish closes the store, whose connections
/// (Redis) live on every worker loop.
struct drain_state {
    std::atomic<std::size_t> remaining{0};
    store::store* st = nullptr;
};

/// Runs on the worker: stop accepting, wait for in-flight requests up to the deadline, close
/// what is left, then let the loop run out of work so every coroutine ends normally (a loop
/// stopped with work pending would leave frames to be destroyed after the objects they use).
net::awaitable<void> drain_worker(worker& w, clock::time_point deadline, drain_state& ds) {
    w.srv.drain();
    w.fwd.close_idle();
    net::steady_timer t(w.ioc);
    while ((w.srv.active_sessions() > 0 || http::background_exchanges() > 0) &&
           clock::now() < deadline) {
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(net::as_tuple(net::use_awaitable));
    }
    // Past the deadline the clients are cut off, but an exchange whose upstream already
    // answered still records or releases its key (its route's policy) while the store is
    // open: a short grace before the store closes, rather than leaving keys held until
    // their lease lapses.
    w.srv.close_all();
    const auto grace_end = clock::now() + completion_grace;
    while ((w.srv.active_sessions() > 0 || http::background_exchanges() > 0) &&
           clock::now() < grace_end) {
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(net::as_tuple(net::use_awaitable));
    }
    w.fwd.close_idle();
    w.watch.stop();
    w.guard.reset();
    if (ds.remaining.fetch_sub(1) == 1 && ds.st != nullptr) {
        ds.st->close(); // posts to every worker loop, all still running
    }
}

/// Client connections allowed at once: limits.max_connections, lowered so that clients alone
/// can never use up the descriptors (each client connection may hold an upstream connection
/// too; a reserve stays for listeners, event loops, Redis and the admin port). The soft
/// RLIMIT_NOFILE is raised to the hard one first, as most servers do.
std::uint64_t connection_limit(const config::config& cfg) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return cfg.limits.max_connections;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rlimit raised = rl;
        raised.rlim_cur = rl.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
            rl = raised;
        }
    }
    if (rl.rlim_cur == RLIM_INFINITY) {
        return cfg.limits.max_connections;
    }
    const std::uint64_t workers = cfg.workers == 0 ? 1 : cfg.workers;
    const std::uint64_t reserve = 32 + workers * (8 + cfg.store.redis.connections_per_worker);
    const std::uint64_t fit = rl.rlim_cur > reserve ? (rl.rlim_cur - reserve) / 2 : 1;
    const std::uint64_t limit =
        std::max<std::uint64_t>(1, std::min<std::uint64_t>(cfg.limits.max_connections, fit));
    if (limit < cfg.limits.max_connections) {
        log::warn("app", "limits.max_connections lowered to fit the descriptor limit",
                  {{"configured", cfg.limits.max_connections},
                   {"effective", limit},
                   {"rlimit_nofile", static_cast<std::uint64_t>(rl.rlim_cur)}});
    }
    return limit;
}

log::level log_level_of(config::log_level l) {
    switch (l) {
    case config::log_level::debug:
        return log::level::debug;
    case config::log_level::info:
        return log::level::info;
    case config::log_level::warn:
        return log::level::warn;
    case config::log_level::error:
        return log::level::error;
    }
    return log::level::info;
}

} // namespace

int run(std::shared_ptr<const config::config> cfg, const run_options& opts) {
    log::set_min_level(log_level_of(cfg->log.level));
    std::signal(SIGPIPE, SIG_IGN);
    // Reloading on SIGHUP is not in this version; ignore it rather than die undrained.
    std::signal(SIGHUP, SIG_IGN);
    // TLS termination and TLS to upstreams are parsed by the config but not served yet: refuse
    // to start rather than silently speak plain text where the operator asked for TLS.
    if (cfg->tls) {
        log::error("config", "inbound TLS (tls:) is not supported by this version; terminate "
                             "TLS in front of onceproxy");
        return 1;
    }
    for (const auto& u : cfg->upstreams) {
        if (u.tls) {
            log::error("config", "https:// upstreams are not supported by this version",
                       {{"upstream", u.name}});
            return 1;
        }
    }
    std::vector<std::string> route_names;
    for (const auto& r : cfg->routes) {
        route_names.push_back(r.name);
    }
    metrics::registry reg(route_names);
    reg.connection_limit = connection_limit(*cfg);

    net::io_context main_ioc(1);
    const unsigned n = cfg->workers == 0 ? 1 : cfg->workers;
    // The event loops exist before anything that binds to them (the Redis store keeps one
    // connection per worker executor).
    std::vector<std::unique_ptr<net::io_context>> loops;
    std::vector<net::any_io_executor> executors;
    for (unsigned i = 0; i < n; ++i) {
        loops.push_back(std::make_unique<net::io_context>(1));
        executors.push_back(loops.back()->get_executor());
    }
    std::vector<std::unique_ptr<worker>> workers;

    std::shared_ptr<store::store> st;
    try {
        st = make_store(*cfg, executors);
    } catch (const std::exception& e) {
        log::error("store", e.what());
        return 1;
    }
    {
        // Open on a one-shot loop: a wrong password or an eviction policy that could drop live
        // records fails loudly here (SPEC §5); an unreachable store does not stop the start
        // (issue 9): it reconnects in the background and routes follow on_store_error.
        net::io_context open_ioc(1);
        store::open_report report;
        net::co_spawn(
            open_ioc, [&]() -> net::awaitable<void> { report = co_await st->async_open(); },
            net::detached);
        open_ioc.run();
        for (const auto& w : report.warnings) {
            log::warn("store", w);
        }
        if (report.ec) {
            log::error("store", report.message.empty() ? report.ec.message() : report.message);
            return 1;
        }
        if (report.degraded) {
            log::warn("store", report.message + "; starting degraded (guarded routes follow "
                                                "on_store_error until it answers)");
        }
    }

    unsigned short port = 0;
    try {
        for (unsigned i = 0; i < n; ++i) {
            workers.push_back(std::make_unique<worker>(*loops[i], cfg, st, reg));
            workers.back()->srv.listen(port);
            port = workers.back()->srv.port();
        }
    } catch (const std::exception& e) {
        log::error("app", "cannot listen",
                   {{"host", cfg->listen.host}, {"port", cfg->listen.port}, {"error", e.what()}});
        return 1;
    }

    admin_server admin(main_ioc, executors, cfg, reg, st);
    unsigned short admin_port = 0;
    try {
        admin_port = admin.listen();
    } catch (const std::exception& e) {
        log::error("admin", "cannot listen on the admin address", {{"error", e.what()}});
        return 1;
    }

    for (auto& w : workers) {
        w->watch.start();
        w->srv.start();
        w->thread = std::thread([&ioc = w->ioc, &reg] {
            http::run_guarded(ioc, "worker event loop", reg.internal_errors);
        });
    }
    admin.start();

    log::info("app", "listening",
              {{"host", cfg->listen.host},
               {"port", port},
               {"admin_port", admin_port},
               {"workers", n},
               {"store", cfg->store.type == config::store_type::memory ? "memory" : "redis"}});
    if (!opts.port_file.empty()) {
        const auto tmp = opts.port_file + ".tmp";
        std::ofstream(tmp) << port << ' ' << admin_port << '\n';
        std::rename(tmp.c_str(), opts.port_file.c_str());
    }

    // SIGTERM/SIGINT (SPEC §6): /readyz fails at once; the listeners go on accepting and serving
    // for limits.shutdown_delay (endpoints take seconds to leave a Service), then close and
    // in-flight requests drain for up to limits.drain_timeout. A second signal skips the rest
    // of the delay.
    drain_state drain;
    net::signal_set signals(main_ioc, SIGTERM, SIGINT);
    net::steady_timer delay(main_ioc);
    bool signalled = false;
    bool closing = false;
    const auto close_listeners = [&] {
        if (closing) {
            return;
        }
        closing = true;
        log::info(
            "app", "closing the listeners; draining",
            {{"drain_timeout_ms", static_cast<std::int64_t>(cfg->limits.drain_timeout.count())}});
        admin.stop();
        const auto deadline = clock::now() + cfg->limits.drain_timeout;
        drain.remaining = workers.size();
        drain.st = st.get();
        for (auto& w : workers) {
            net::co_spawn(w->ioc, drain_worker(*w, deadline, drain), net::detached);
        }
        main_ioc.stop();
    };
    std::function<void(const boost::system::error_code&, int)> on_signal =
        [&](const boost::system::error_code& ec, int sig) {
            if (ec) {
                return;
            }
            if (signalled) {
                log::info("app", "signal again: skipping the shutdown delay", {{"signal", sig}});
                close_listeners();
                return;
            }
            signalled = true;
            admin.set_draining();
            const auto d = cfg->limits.shutdown_delay;
            if (d.count() <= 0) {
                log::info("app", "signal: not ready", {{"signal", sig}});
                close_listeners();
                return;
            }
            log::info(
                "app",
                "signal: not ready; serving on until the shutdown delay ends (signal again "
                "to close now)",
                {{"signal", sig}, {"shutdown_delay_ms", static_cast<std::int64_t>(d.count())}});
            signals.async_wait(on_signal);
            delay.expires_after(d);
            delay.async_wait([&](const boost::system::error_code&) { close_listeners(); });
        };
    signals.async_wait(on_signal);
    http::run_guarded(main_ioc, "admin event loop", reg.internal_errors);

    // Bound the whole shutdown: background work (a completion retried until its lease ends)
    // may outlast the drain; past the deadline plus a grace period the loops are stopped.
    std::mutex m;
    std::condition_variable cv;
    bool joined = false;
    std::thread watchdog([&] {
        std::unique_lock lk(m);
        if (!cv.wait_for(lk, cfg->limits.drain_timeout + completion_grace + std::chrono::seconds(3),
                         [&] { return joined; })) {
            log::error("app", "shutdown overran the drain deadline; stopping the event loops");
            for (auto& l : loops) {
                l->stop();
            }
        }
    });
    for (auto& w : workers) {
        w->thread.join();
    }
    {
        std::lock_guard lk(m);
        joined = true;
    }
    cv.notify_one();
    watchdog.join();
    http::flush_access_log();
    log::info("app", "drained, exiting");
    return 0;
}

} // namespace onceproxy::app
