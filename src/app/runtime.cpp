#include "app/runtime.hpp"

#include "app/admin.hpp"
#include "app/config_errors_log.hpp"
#include "app/store_factory.hpp"
#include "onceproxy/config/file_stamp.hpp"
#include "onceproxy/config/live_changes.hpp"
#include "onceproxy/config/load.hpp"
#include "onceproxy/config/upstream_tls.hpp"
#include "onceproxy/core/fingerprint.hpp"
#include "onceproxy/egress/upstream_guards.hpp"
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
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

namespace onceproxy::app {

namespace net = boost::asio;
using config::file_stamp;
using config::file_stamp_of;
using clock = std::chrono::steady_clock;

namespace {

/// An io_context whose pending work can be destroyed before the context itself (shutdown):
/// coroutine frames left on a stopped loop may hold the last reference to the store, whose
/// Redis connections use the worker loops' timers, so they must go while every loop exists.
struct event_loop : net::io_context {
    using net::io_context::io_context;
    using net::io_context::shutdown;
};

/// One event loop with everything a connection needs; a connection never leaves its worker.
struct worker {
    /// `index`: the worker's number (0, 1 ...), its label in the per-worker metrics.
    worker(std::size_t index, net::io_context& c, const std::shared_ptr<const config::config>& cfg,
           std::shared_ptr<store::store> st, metrics::registry& reg,
           std::shared_ptr<http::tls_source> tls, std::shared_ptr<egress::upstream_guards> g)
        : ioc(c), guard(net::make_work_guard(ioc)), watch(ioc.get_executor()),
          fwd(std::make_shared<upstream::forwarder>(ioc.get_executor(), cfg, watch)),
          srv(ioc, cfg, std::make_shared<http::handler>(cfg, fwd, st, reg, tracker), {reg, index},
              watch, tracker, std::move(tls)),
          guards(std::move(g)) {
        if (cfg->egress) {
            const auto view = config::egress_view(*cfg);
            egress_srv.emplace(
                ioc, view,
                std::make_shared<http::handler>(view, fwd, std::move(st), reg, tracker, guards),
                http::server::counted{reg, index}, watch, tracker, nullptr);
        }
    }

    /// A reload, run on this worker's loop: requests read from now on use `next`; those in
    /// flight keep the handler (config, forwarder) they started with until they end. (Egress on
    /// or off, and its address, need a restart: live_changes.)
    void install(const std::shared_ptr<const config::config>& next,
                 std::shared_ptr<store::store> st, metrics::registry& reg) {
        fwd = std::make_shared<upstream::forwarder>(ioc.get_executor(), next, watch, fwd.get());
        srv.set_handler(std::make_shared<http::handler>(next, fwd, st, reg, tracker));
        if (egress_srv && next->egress) {
            egress_srv->set_handler(std::make_shared<http::handler>(
                config::egress_view(*next), fwd, std::move(st), reg, tracker, guards));
        }
    }

    /// Every listener of this worker.
    template <class F>
    void each_server(F f) {
        f(srv);
        if (egress_srv) {
            f(*egress_srv);
        }
    }

    net::io_context& ioc;
    net::executor_work_guard<net::io_context::executor_type> guard;
    /// Sessions and background completions of this worker, joined by the drain.
    http::task_tracker tracker;
    wire::deadline_watch watch; ///< coarse I/O deadlines of every socket of this worker
    std::shared_ptr<upstream::forwarder> fwd; ///< the current config's upstream pools
    http::server srv;
    /// The egress routes' budgets and breakers (all workers').
    std::shared_ptr<egress::upstream_guards> guards;
    std::optional<http::server> egress_srv; ///< egress.listen, when configured
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

/// Runs on the worker: stop accepting, join the in-flight sessions and background completions
/// up to the deadline, cut off what is left, then let the loop run out of work so every
/// coroutine ends normally (a loop stopped with work pending would leave frames to be
/// destroyed after the objects they use).
net::awaitable<void> drain_worker(worker& w, clock::time_point deadline, drain_state& ds) {
    w.each_server([](http::server& s) { s.drain(); });
    w.fwd->close_idle();
    // Awaited into a variable: GCC 12 emitted an illegal instruction for this coroutine when
    // the co_await stood negated in the if condition (seen in the -O1 sanitizer build).
    const bool joined = co_await w.tracker.async_join(deadline);
    if (!joined) {
        // Past the deadline the clients are cut off, but an exchange whose upstream already
        // answered still records or releases its key (its route's policy) while the store is
        // open: a short grace before the store closes, rather than leaving keys held until
        // their lease lapses.
        log::warn("app", "drain deadline reached; closing the connections still open",
                  {{"open", w.tracker.active()}});
        w.each_server([](http::server& s) { s.cut_connections(); });
        co_await w.tracker.async_join(clock::now() + completion_grace);
    }
    w.fwd->close_idle();
    w.watch.stop();
    w.guard.reset();
    if (ds.remaining.fetch_sub(1) == 1 && ds.st != nullptr) {
        ds.st->close(); // posts to every worker loop, all still running
    }
}

/// Client connections allowed at once: limits.max_connections, lowered so that clients alone
/// can never use up the descriptors (each client connection may hold an upstream connection
/// too; a reserve stays for listeners, event loops, Redis and the admin listener's
/// admin.max_connections). The soft RLIMIT_NOFILE is raised to the hard one first, as most
/// servers do.
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
    // Redis Cluster: a connection per master (the seed list stands in for their count).
    const std::uint64_t redis_nodes =
        std::max<std::size_t>(1, cfg.store.redis.cluster.nodes.size());
    // The admin listener holds at most admin.max_connections (one more for a moment, to close
    // a connection above its cap).
    const std::uint64_t admin = cfg.admin.listen ? cfg.admin.max_connections + 1 : 0;
    const std::uint64_t store_connections =
        cfg.store.type == config::store_type::postgres
            ? cfg.store.postgres.pool
            : cfg.store.redis.connections_per_worker * redis_nodes;
    const std::uint64_t reserve = 32 + admin + workers * (8 + store_connections);
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

/// The first 16 hex digits of the SHA-256 of the config file's text (family::config_info):
/// enough to tell which file a replica serves.
std::string config_digest(const config::config& cfg) {
    return core::to_hex(core::sha256(cfg.source_text)).substr(0, 16);
}

/// The store's causes of a master switch are the `cause` values of the metric, in its order
/// (the enum's own to_string, found by argument-dependent lookup).
constexpr bool master_switch_causes_match() {
    const auto& values = metrics::info(metrics::family::store_master_switches).values;
    for (std::size_t i = 0; i < store::master_switch_cause_count; ++i) {
        if (values[i] != to_string(static_cast<store::master_switch_cause>(i))) {
            return false;
        }
    }
    return values.count == store::master_switch_cause_count;
}
static_assert(master_switch_causes_match());

std::int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// One run of the process, phase by phase: open the store, bind the listeners, start the
/// workers, serve (signals: reload, shutdown), drain, join. Members are declared in the order
/// they must outlive each other: the loops outlive the store, whose Redis connections live on
/// them, and the workers and admin listener, which use both.
class runtime {
public:
    runtime(std::shared_ptr<const config::config> cfg, run_options opts)
        : current_(std::move(cfg)), opts_(std::move(opts)), reg_(route_names(*current_)) {
        reg_.gauge(metrics::family::connection_limit).set(connection_limit(*current_));
        reg_.gauge(metrics::family::buffered_bytes_limit).set(current_->limits.max_buffered_bytes);
        reg_.set_config(config_digest(*current_), unix_seconds());
        const unsigned n = current_->workers == 0 ? 1 : current_->workers;
        // The event loops exist before anything that binds to them (the Redis store keeps one
        // connection per worker executor).
        reg_.set_workers(n);
        for (unsigned i = 0; i < n; ++i) {
            loops_.push_back(std::make_unique<event_loop>(1));
            executors_.push_back(loops_.back()->get_executor());
        }
    }

    /// Builds and opens the store on a one-shot loop: a wrong password or an eviction policy
    /// that could drop live records fails loudly here (SPEC §5); an unreachable store does not
    /// stop the start (issue 9): it reconnects in the background and routes follow
    /// on_store_error. False: do not start.
    bool open_store() {
        try {
            st_ = make_store(*current_, executors_);
        } catch (const std::exception& e) {
            log::error("store", e.what());
            return false;
        }
        if (st_->follows_master()) {
            reg_.store_follows_master = true;
            st_->set_master_switch_observer([&reg = reg_](store::master_switch_cause c) {
                reg.counter(metrics::family::store_master_switches, c).inc();
            });
        }
        net::io_context open_ioc(1);
        store::open_report report;
        net::co_spawn(
            open_ioc, [&]() -> net::awaitable<void> { report = co_await st_->async_open(); },
            net::detached);
        open_ioc.run();
        for (const auto& w : report.warnings) {
            log::warn("store", w);
        }
        if (report.ec) {
            log::error("store", report.message.empty() ? report.ec.message() : report.message);
            return false;
        }
        if (report.degraded) {
            log::warn("store", report.message + "; starting degraded (guarded routes follow "
                                                "on_store_error until it answers)");
        }
        return true;
    }

    /// Makes the workers and binds every listener (each worker its own socket on one port,
    /// SO_REUSEPORT; then the admin address). False: do not start.
    bool bind() {
        if (current_->tls) {
            try {
                tls_ = std::make_shared<http::tls_source>(*current_->tls);
            } catch (const std::exception& e) {
                log::error("tls", "cannot load the certificate", {{"error", e.what()}});
                return false;
            }
            tls_stamps_ = tls_stamps_of(*current_->tls);
            reg_.gauge(metrics::family::tls_certificate_expiry).set(tls_->not_after());
        }
        // Before the pools load them: a file rotated while they do is seen as a change.
        upstream_tls_seen_ = upstream_tls_stamps_of(*current_);
        try {
            for (auto& l : loops_) {
                workers_.push_back(std::make_unique<worker>(workers_.size(), *l, current_, st_,
                                                            reg_, tls_, egress_guards_));
                workers_.back()->srv.listen(port_, tls_port_);
                port_ = workers_.back()->srv.port();
                tls_port_ = workers_.back()->srv.tls_port();
                if (auto& e = workers_.back()->egress_srv) {
                    e->listen(egress_port_, 0);
                    egress_port_ = e->port();
                }
            }
        } catch (const std::exception& e) {
            log::error("app", "cannot listen",
                       {{"host", current_->listen.host},
                        {"port", current_->listen.port},
                        {"error", e.what()}});
            return false;
        }
        admin_ = std::make_unique<admin_server>(main_ioc_, executors_, current_, reg_, st_);
        try {
            admin_port_ = admin_->listen();
        } catch (const std::exception& e) {
            log::error("admin", "cannot listen on the admin address", {{"error", e.what()}});
            return false;
        }
        return true;
    }

    /// Starts accepting: one thread per worker loop, the admin listener, then the port file.
    void start_workers() {
        running_ = workers_.size();
        for (std::size_t i = 0; i < workers_.size(); ++i) {
            auto& w = workers_[i];
            w->watch.report_lag(
                [&reg = reg_, i](clock::time_point next_due, std::optional<clock::duration> worst) {
                    reg.set_event_loop_tick(
                        i, next_due,
                        worst ? std::optional(
                                    std::chrono::duration_cast<std::chrono::microseconds>(*worst))
                              : std::nullopt);
                });
            w->watch.start();
            w->each_server([](http::server& s) { s.start(); });
            w->thread = std::thread([&ioc = w->ioc, this] {
                http::run_guarded(ioc, "worker event loop",
                                  reg_.counter(metrics::family::internal_errors));
                net::post(join_ioc_, [this] { on_worker_ended(); });
            });
        }
        admin_->start();
        log::info("app", "listening",
                  {{"host", current_->listen.host},
                   {"port", port_},
                   {"admin_port", admin_port_},
                   {"tls_port", tls_port_},
                   {"egress_port", egress_port_},
                   {"workers", workers_.size()},
                   {"store", config::store_type_name(current_->store.type)}});
        if (!opts_.port_file.empty()) {
            const auto tmp = opts_.port_file + ".tmp";
            std::ofstream out(tmp);
            out << port_ << ' ' << admin_port_;
            if (tls_port_ != 0) {
                out << ' ' << tls_port_; // the TLS port (tls.listen, or listen itself)
            }
            out << '\n';
            if (egress_port_ != 0) {
                out << "egress " << egress_port_ << '\n';
            }
            out.close();
            std::rename(tmp.c_str(), opts_.port_file.c_str());
        }
    }

    /// Runs the main loop (admin listener, signals) until the drain has begun.
    void serve() {
        signals_.async_wait([this](const auto& ec, int sig) { on_shutdown_signal(ec, sig); });
        hup_.async_wait([this](const auto& ec, int) { on_hup(ec); });
        if (opts_.watch_interval.count() > 0) {
            watched_ = file_stamp_of(current_->source_file);
            watch_config();
        }
        if (tls_) {
            watch_tls();
        }
        watch_upstream_tls();
        http::run_guarded(main_ioc_, "admin event loop",
                          reg_.counter(metrics::family::internal_errors));
    }

    /// Waits for the workers to finish draining, bounded: background work (a completion
    /// retried until its lease ends) may outlast the drain; past the deadline plus a grace
    /// period a timer stops the loops. The worker threads report their ends to join_ioc_.
    void join() {
        overrun_.expires_after(current_->limits.drain_timeout + completion_grace +
                               std::chrono::seconds(3));
        overrun_.async_wait([this](const boost::system::error_code& ec) {
            if (ec) {
                return; // every worker loop ended in time
            }
            log::error("app", "shutdown overran the drain deadline; stopping the event loops");
            for (auto& l : loops_) {
                l->stop();
            }
        });
        if (running_ == 0) {
            overrun_.cancel();
        }
        join_ioc_.run();
        for (auto& w : workers_) {
            w->thread.join();
        }
        http::flush_access_log();
        // Frames still pending (the admin accept loop on the stopped main loop, anything the
        // overrun cut off) are destroyed now, with every loop still there for the store to
        // close its connections on, rather than one by one as the loops are destroyed.
        main_ioc_.shutdown();
        for (auto& l : loops_) {
            l->shutdown();
        }
        log::info("app", "drained, exiting");
    }

private:
    /// On join_ioc_: a worker thread's loop ran out of work (or was stopped).
    void on_worker_ended() {
        if (--running_ == 0) {
            overrun_.cancel();
        }
    }

    static std::vector<std::string> route_names(const config::config& cfg) {
        std::vector<std::string> out;
        for (const auto& r : cfg.routes) {
            out.push_back(r.name);
        }
        return out;
    }

    /// SIGTERM/SIGINT (SPEC §6): /readyz fails at once; the listeners go on accepting and
    /// serving for limits.shutdown_delay (endpoints take seconds to leave a Service), then the
    /// drain begins. A second signal skips the rest of the delay.
    void on_shutdown_signal(const boost::system::error_code& ec, int sig) {
        if (ec) {
            return;
        }
        if (signalled_) {
            log::info("app", "signal again: skipping the shutdown delay", {{"signal", sig}});
            drain();
            return;
        }
        signalled_ = true;
        admin_->set_draining();
        const auto d = current_->limits.shutdown_delay;
        if (d.count() <= 0) {
            log::info("app", "signal: not ready", {{"signal", sig}});
            drain();
            return;
        }
        log::info("app",
                  "signal: not ready; serving on until the shutdown delay ends (signal again to "
                  "close now)",
                  {{"signal", sig}, {"shutdown_delay_ms", static_cast<std::int64_t>(d.count())}});
        signals_.async_wait([this](const auto& e, int s) { on_shutdown_signal(e, s); });
        delay_.expires_after(d);
        delay_.async_wait([this](const boost::system::error_code&) { drain(); });
    }

    /// Closes the listeners and lets in-flight requests finish for up to limits.drain_timeout
    /// (drain_worker on every worker); stops the main loop, so serve() returns.
    void drain() {
        if (draining_) {
            return;
        }
        draining_ = true;
        log::info("app", "closing the listeners; draining",
                  {{"drain_timeout_ms",
                    static_cast<std::int64_t>(current_->limits.drain_timeout.count())}});
        admin_->stop();
        const auto deadline = clock::now() + current_->limits.drain_timeout;
        drain_.remaining = workers_.size();
        drain_.st = st_.get();
        for (auto& w : workers_) {
            net::co_spawn(w->ioc, drain_worker(*w, deadline, drain_), net::detached);
        }
        main_ioc_.stop();
    }

    void on_hup(const boost::system::error_code& ec) {
        if (ec) {
            return;
        }
        if (signalled_) {
            log::info("config", "SIGHUP ignored: shutting down");
        } else {
            reload("SIGHUP");
        }
        hup_.async_wait([this](const auto& e, int) { on_hup(e); });
    }

    /// --watch-config: every interval, the file's stamp; a change (not a file that is missing
    /// for a moment mid-swap) reloads as SIGHUP does. A file that fails to load is not retried
    /// until it changes again.
    void watch_config() {
        watch_timer_.expires_after(opts_.watch_interval);
        watch_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec || signalled_) {
                return;
            }
            const auto now = file_stamp_of(current_->source_file);
            if (now != file_stamp{} && now != watched_) {
                watched_ = now;
                reload("config file changed");
            }
            watch_config();
        });
    }

    /// The stamps of a tls block's files, in the order cert, key, client CA.
    static std::array<file_stamp, 3> tls_stamps_of(const config::tls_files& t) {
        return {file_stamp_of(t.cert_file), file_stamp_of(t.key_file),
                t.client_ca_file.empty() ? file_stamp{} : file_stamp_of(t.client_ca_file)};
    }

    /// Certificate rotation: every tls.reload_interval, the stamps of the cert, key and CA
    /// files (a Secret update swaps a symlink: a new inode); a change loads the pair for new
    /// connections (reload_tls).
    void watch_tls() {
        const auto every = current_->tls ? current_->tls->reload_interval : config::duration{};
        // 0: SIGHUP only; the timer still runs so that a reload may set an interval.
        tls_timer_.expires_after(every.count() > 0 ? every : std::chrono::seconds(5));
        tls_timer_.async_wait([this, every](const boost::system::error_code& ec) {
            if (ec || signalled_) {
                return;
            }
            if (every.count() > 0 && current_->tls) {
                const auto now = tls_stamps_of(*current_->tls);
                if (now != tls_stamps_ && now[0] != file_stamp{} && now[1] != file_stamp{}) {
                    reload_tls("certificate files changed");
                }
            }
            watch_tls();
        });
    }

    /// The stamps of every https:// upstream's TLS files, by upstream name.
    static std::map<std::string, std::array<file_stamp, 3>>
    upstream_tls_stamps_of(const config::config& c) {
        std::map<std::string, std::array<file_stamp, 3>> out;
        for (const auto& u : c.upstreams) {
            if (u.tls) {
                out.emplace(u.name, config::upstream_tls_stamps(u.tls_settings));
            }
        }
        return out;
    }

    /// Upstream certificate rotation: every tick (1 s, or the shortest upstream
    /// tls.reload_interval when shorter), the stamps of the CA, client certificate and key of
    /// each https:// upstream whose own reload_interval has passed since its last check. Files
    /// that changed and load make every worker rebuild its forwarder from the running config:
    /// the pools whose files changed get a new TLS context for their new connections, open
    /// connections keep theirs. Files that do not load are logged and counted, and the ones in
    /// use stay; the next change is tried again.
    void watch_upstream_tls() {
        config::duration tick = std::chrono::seconds(1);
        for (const auto& u : current_->upstreams) {
            const auto ri = u.tls_settings.reload_interval;
            if (u.tls && ri.count() > 0 && ri < tick) {
                tick = ri;
            }
        }
        upstream_tls_timer_.expires_after(tick);
        upstream_tls_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec || signalled_) {
                return;
            }
            check_upstream_tls();
            watch_upstream_tls();
        });
    }

    void check_upstream_tls() {
        const auto now = clock::now();
        bool rotated = false;
        for (const auto& u : current_->upstreams) {
            const auto every = u.tls_settings.reload_interval;
            if (!u.tls || every.count() <= 0) {
                continue;
            }
            auto& due = upstream_tls_due_[u.name];
            if (now < due) {
                continue;
            }
            due = now + every;
            const auto stamps = config::upstream_tls_stamps(u.tls_settings);
            auto& seen = upstream_tls_seen_[u.name];
            const auto& t = u.tls_settings;
            const bool mid_swap = (!t.ca_file.empty() && stamps[0].missing()) ||
                                  (!t.client_cert_file.empty() && stamps[1].missing()) ||
                                  (!t.client_key_file.empty() && stamps[2].missing());
            if (stamps == seen || mid_swap) {
                continue; // unchanged, or a file missing for a moment: the next tick looks again
            }
            seen = stamps;
            rotated = count_upstream_tls_rotation(u, "check") || rotated;
        }
        if (rotated) {
            for (const auto& w : workers_) {
                net::post(w->ioc, [&w = *w, cfg = current_, st = st_, &reg = reg_] {
                    w.install(cfg, st, reg);
                });
            }
        }
    }

    /// An upstream's TLS files changed: whether they load (counted and logged). The workers'
    /// pools load them again for their new connections; files that do not load leave the ones
    /// in use.
    bool count_upstream_tls_rotation(const config::upstream_config& u, const char* why) {
        if (const auto built = config::make_upstream_tls_context(u.tls_settings); !built.ctx) {
            reg_.counter(metrics::family::upstream_tls_reloads, metrics::file_reload::failure)
                .inc();
            log::error("upstream",
                       "upstream TLS files changed but do not load; the ones in use stay",
                       {{"upstream", u.name}, {"cause", why}, {"error", built.error}});
            return false;
        }
        reg_.counter(metrics::family::upstream_tls_reloads, metrics::file_reload::success).inc();
        log::info("upstream", "upstream TLS files reloaded; new connections use them",
                  {{"upstream", u.name}, {"cause", why}});
        return true;
    }

    /// SIGHUP: an upstream whose TLS files changed since they were last loaded, with the same
    /// settings, is a rotation and counted as the periodic check counts one. A new upstream or
    /// changed settings are a config change, not a rotation.
    void count_upstream_tls_rotations(const config::config& next, const char* why) {
        for (const auto& u : next.upstreams) {
            const auto seen = upstream_tls_seen_.find(u.name);
            if (!u.tls || seen == upstream_tls_seen_.end()) {
                continue;
            }
            const auto before =
                std::find_if(current_->upstreams.begin(), current_->upstreams.end(),
                             [&](const config::upstream_config& c) { return c.name == u.name; });
            if (before == current_->upstreams.end() || !before->tls ||
                !(before->tls_settings == u.tls_settings) ||
                config::upstream_tls_stamps(u.tls_settings) == seen->second) {
                continue;
            }
            count_upstream_tls_rotation(u, why);
        }
    }

    /// Loads the current config's TLS files for new connections; open connections keep theirs.
    /// A pair that does not load (a half-written file, a key that does not match) is logged
    /// and counted, and the pair in use stays; the next change of the files is tried again.
    void reload_tls(const char* why) {
        if (!tls_ || !current_->tls) {
            return;
        }
        const auto& t = *current_->tls;
        tls_stamps_ = tls_stamps_of(t);
        if (auto error = tls_->reload(t)) {
            reg_.counter(metrics::family::tls_certificate_reloads, metrics::file_reload::failure)
                .inc();
            log::error("tls", "certificate reload failed; the certificate in use stays",
                       {{"cause", why}, {"error", *error}});
            return;
        }
        reg_.counter(metrics::family::tls_certificate_reloads, metrics::file_reload::success).inc();
        reg_.gauge(metrics::family::tls_certificate_expiry).set(tls_->not_after());
        log::info("tls", "certificate reloaded; new connections use it",
                  {{"cause", why}, {"cert_file", t.cert_file}, {"not_after", tls_->not_after()}});
    }

    /// SIGHUP (issue 9 item 5), on the main loop: re-reads the file with the start-up loader. A
    /// file that does not load, or that changes settings bound at start, is refused as a whole
    /// and the running config stays. Otherwise every worker installs the new config on its own
    /// loop (requests in flight finish on the old one); the last to do so counts the reload.
    void reload(const char* why) {
        const auto& file = current_->source_file;
        log::info("config", "reloading the config", {{"file", file}, {"cause", why}});
        if (opts_.watch_interval.count() > 0) {
            watched_ = file_stamp_of(file); // this version is seen: the watch waits for the next
        }
        std::shared_ptr<const config::config> next;
        try {
            next = config::load_file(file);
        } catch (const config::config_errors& e) {
            log_config_errors(e, "reload rejected: the running config stays");
            reg_.counter(metrics::family::config_reloads, metrics::reload_result::error).inc();
            return;
        }
        if (const auto fields = config::changes_needing_restart(*current_, *next);
            !fields.empty()) {
            std::string list;
            for (const auto& f : fields) {
                list += (list.empty() ? "" : ", ") + f;
            }
            log::warn("config",
                      "the new config needs a restart to apply; reload refused, the running "
                      "config stays",
                      {{"file", file}, {"fields", list}});
            reg_.counter(metrics::family::config_reloads, metrics::reload_result::restart_required)
                .inc();
            return;
        }
        log::set_min_level(log_level_of(next->log.level));
        // A rotated Secret: changes_needing_restart lets only this credential change live.
        const auto [password, password_file, previous] =
            next->store.type == config::store_type::postgres
                ? std::tuple{next->store.postgres.password, next->store.postgres.password_file,
                             current_->store.postgres.password}
                : std::tuple{next->store.redis.password, next->store.redis.password_file,
                             current_->store.redis.password};
        if (next->store.type != config::store_type::memory && !password_file.empty() &&
            password != previous) {
            st_->set_password(password);
            log::info("store",
                      "store password changed in password_file; used from the next "
                      "connection",
                      {{"password_file", password_file}});
        }
        if (next->limits.max_connections != current_->limits.max_connections) {
            reg_.gauge(metrics::family::connection_limit).set(connection_limit(*next));
        }
        reg_.gauge(metrics::family::buffered_bytes_limit).set(next->limits.max_buffered_bytes);
        const bool tls_changed = next->tls && current_->tls && !(*next->tls == *current_->tls);
        const auto digest = config_digest(*next);
        count_upstream_tls_rotations(*next, why);
        // Before the workers load them: a file rotated meanwhile is seen as a change.
        upstream_tls_seen_ = upstream_tls_stamps_of(*next);
        upstream_tls_due_.clear(); // a changed reload_interval counts from now
        auto pending = std::make_shared<std::atomic<std::size_t>>(workers_.size());
        for (const auto& w : workers_) {
            net::post(w->ioc, [&w = *w, next, st = st_, &reg = reg_, pending, digest] {
                w.install(next, st, reg);
                if (pending->fetch_sub(1) == 1) {
                    reg.set_config(digest, unix_seconds());
                    reg.counter(metrics::family::config_reloads, metrics::reload_result::success)
                        .inc();
                    log::info("config", "config reloaded",
                              {{"file", next->source_file},
                               {"sha256", digest},
                               {"routes", next->routes.size()},
                               {"upstreams", next->upstreams.size()}});
                }
            });
        }
        admin_->set_config(next);
        current_ = std::move(next);
        if (tls_ && (tls_changed || tls_stamps_of(*current_->tls) != tls_stamps_)) {
            reload_tls(why);
        }
    }

    /// The config new requests get; a reload replaces it (main loop only). Shutdown reads its
    /// delays from it too.
    std::shared_ptr<const config::config> current_;
    run_options opts_;
    metrics::registry reg_;
    event_loop main_ioc_{1}; ///< admin listener, signals, reloads
    std::vector<std::unique_ptr<event_loop>> loops_;
    std::vector<net::any_io_executor> executors_;
    std::vector<std::unique_ptr<worker>> workers_;
    std::shared_ptr<store::store> st_;
    std::unique_ptr<admin_server> admin_;
    unsigned short port_ = 0;
    unsigned short tls_port_ = 0;
    unsigned short egress_port_ = 0; ///< 0: no egress listener
    std::shared_ptr<egress::upstream_guards> egress_guards_ =
        std::make_shared<egress::upstream_guards>();
    std::shared_ptr<http::tls_source> tls_;           ///< null: no TLS
    std::array<file_stamp, 3> tls_stamps_{};          ///< the TLS files as last loaded
    net::steady_timer tls_timer_{main_ioc_};          ///< certificate rotation polling
    net::steady_timer upstream_tls_timer_{main_ioc_}; ///< upstream certificate rotation polling
    /// By upstream name: its TLS files as last seen, and when they are next checked.
    std::map<std::string, std::array<file_stamp, 3>> upstream_tls_seen_;
    std::map<std::string, clock::time_point> upstream_tls_due_;
    unsigned short admin_port_ = 0;
    net::signal_set signals_{main_ioc_, SIGTERM, SIGINT};
    net::signal_set hup_{main_ioc_, SIGHUP};
    net::steady_timer watch_timer_{main_ioc_}; ///< --watch-config
    file_stamp watched_;                       ///< the config file as last loaded or seen
    net::steady_timer delay_{main_ioc_};       ///< the shutdown delay
    bool signalled_ = false;                   ///< SIGTERM/SIGINT received
    bool draining_ = false;                    ///< the listeners are closed
    drain_state drain_;
    /// join(): the shutdown's bound. Each worker thread reports the end of its loop here; the
    /// timer stops the loops still running when the bound passes. Declared after the loops:
    /// destroyed first, once every thread is joined.
    net::io_context join_ioc_{1};
    net::steady_timer overrun_{join_ioc_};
    std::size_t running_ = 0; ///< worker loops still running (join_ioc_ only, once started)
};

} // namespace

int run(std::shared_ptr<const config::config> cfg, const run_options& opts) {
    log::set_min_level(log_level_of(cfg->log.level));
    std::signal(SIGPIPE, SIG_IGN);
    // Until the reload handler is in place, a SIGHUP (a reloader sidecar, a config-map watcher)
    // must not end the process.
    std::signal(SIGHUP, SIG_IGN);
    runtime rt(std::move(cfg), opts);
    if (!rt.open_store() || !rt.bind()) {
        return 1;
    }
    rt.start_workers();
    rt.serve();
    rt.join();
    return 0;
}

} // namespace onceproxy::app
