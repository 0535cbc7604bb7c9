#include "onceproxy/store/postgres_store.hpp"

#include "onceproxy/log/log.hpp"
#include "onceproxy/pg/pg_connection.hpp"
#include "onceproxy/store/error.hpp"
#include "store/postgres_sql.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>

namespace onceproxy::store {

namespace net = boost::asio;
namespace sql = postgres_sql;
using boost::system::error_code;
using pg::pg_param;
using pg::pg_result;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

/// The prepared statements, by name.
namespace stmt {
constexpr const char* claim = "onceproxy_claim";
constexpr const char* lookup = "onceproxy_lookup";
constexpr const char* complete = "onceproxy_complete";
constexpr const char* release = "onceproxy_release";
constexpr const char* extend = "onceproxy_extend";
constexpr const char* inspect = "onceproxy_inspect";
constexpr const char* purge = "onceproxy_purge";
constexpr const char* sweep = "onceproxy_sweep";
constexpr const char* ping = "onceproxy_ping";
} // namespace stmt

constexpr milliseconds min_backoff{100};
constexpr milliseconds max_backoff{5'000};
constexpr int max_sweep_batches = 100;
constexpr int max_attempts = 4;

std::string quote_ident(std::string_view part) {
    std::string out = "\"";
    for (char c : part) {
        out += c;
        if (c == '"') {
            out += '"';
        }
    }
    return out + "\"";
}

std::string quote_literal(std::string_view text) {
    std::string out = "'";
    for (char c : text) {
        out += c;
        if (c == '\'') {
            out += '\'';
        }
    }
    return out + "'";
}

/// The SQL texts with the table's names substituted (postgres_sql.hpp, TEMPLATES).
struct rendered_names {
    std::string table, schema_table, expiry_index, table_literal;
};

rendered_names names_of(const std::string& table) {
    if (table.find('\0') != std::string::npos || table.find("$migrate$") != std::string::npos) {
        throw std::invalid_argument("store.postgres.table '" + table +
                                    "' contains a NUL or the text $migrate$");
    }
    const auto dot = table.find('.');
    if (dot != std::string::npos && table.find('.', dot + 1) != std::string::npos) {
        throw std::invalid_argument("store.postgres.table '" + table +
                                    "' has more than one dot: write [schema.]table");
    }
    const std::string schema = dot == std::string::npos ? "" : table.substr(0, dot);
    const std::string name = dot == std::string::npos ? table : table.substr(dot + 1);
    if (name.empty() || name.size() > 63 || (dot != std::string::npos && schema.empty()) ||
        schema.size() > 63) {
        throw std::invalid_argument("store.postgres.table '" + table +
                                    "': each part must be 1 to 63 bytes");
    }
    const std::string prefix = schema.empty() ? "" : quote_ident(schema) + ".";
    return {prefix + quote_ident(name), prefix + quote_ident("onceproxy_schema"),
            quote_ident(name + std::string(sql::expiry_index_suffix)), quote_literal(table)};
}

std::string render(std::string_view text, const rendered_names& n) {
    std::string out;
    out.reserve(text.size() + 64);
    while (!text.empty()) {
        const auto open = text.find('{');
        if (open == std::string_view::npos) {
            out += text;
            break;
        }
        out += text.substr(0, open);
        text.remove_prefix(open);
        const auto close = text.find('}');
        const auto name = text.substr(1, close - 1);
        if (name == "table") {
            out += n.table;
        } else if (name == "schema_table") {
            out += n.schema_table;
        } else if (name == "expiry_index") {
            out += n.expiry_index;
        } else if (name == "table_literal") {
            out += n.table_literal;
        } else {
            out += text.substr(0, close + 1); // not a placeholder
        }
        text.remove_prefix(close + 1);
    }
    return out;
}

// Values of a binary-format result (pg_format::binary): big-endian integers, one byte booleans.
std::optional<std::int64_t> int_of(const std::optional<std::string>& v) {
    if (!v || (v->size() != 2 && v->size() != 4 && v->size() != 8)) {
        return std::nullopt;
    }
    std::uint64_t x = 0;
    for (unsigned char c : *v) {
        x = (x << 8) | c;
    }
    const unsigned bits = static_cast<unsigned>(v->size()) * 8;
    if (bits < 64 && (x >> (bits - 1)) != 0) {
        x |= ~std::uint64_t{0} << bits; // sign-extend
    }
    return static_cast<std::int64_t>(x);
}

std::optional<bool> bool_of(const std::optional<std::string>& v) {
    if (!v || v->size() != 1) {
        return std::nullopt;
    }
    return (*v)[0] != 0;
}

pg_param text_param(std::int64_t v) {
    return pg_param::text(std::to_string(v));
}

/// A server error or a failed connection that a retry cannot mend: the settings are wrong
/// (password, role, database, pg_hba.conf) rather than the server away. libpq gives only the
/// server's message for a failed connection attempt, so this reads it (in English, the
/// server's default lc_messages).
bool is_setting_failure(const std::string& message) {
    for (const char* what :
         {"password authentication failed", "no password supplied", "does not exist", "pg_hba.conf",
          "permission denied", "authentication failed", "certificate", "does not support SSL"}) {
        if (message.find(what) != std::string::npos) {
            return true;
        }
    }
    return false;
}

error_code store_error_of(const pg_result& r) {
    switch (static_cast<pg::errc>(r.ec.value())) {
    case pg::errc::not_connected:
    case pg::errc::connection_lost:
    case pg::errc::connect_failed:
    case pg::errc::send_failed:
        return errc::unavailable;
    case pg::errc::timeout:
    case pg::errc::query_canceled:
        return errc::timeout;
    default:
        return errc::protocol;
    }
}

pg_result not_connected() {
    pg_result r;
    r.ec = pg::errc::not_connected;
    r.message = "no PostgreSQL connection on this worker";
    return r;
}

/// Warns at most once per 10 s (per call site): a server that refuses every statement must not
/// flood the log.
void warn_limited(std::atomic<std::int64_t>& last, std::string_view msg, log::fields f) {
    const auto now =
        std::chrono::duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
    auto prev = last.load(std::memory_order_relaxed);
    if (now - prev >= 10'000 && last.compare_exchange_strong(prev, now)) {
        log::warn("store", msg, f);
    }
}

milliseconds jittered(milliseconds d) {
    thread_local std::minstd_rand rng{std::random_device{}()};
    std::uniform_int_distribution<std::int64_t> half(0, d.count() / 2);
    return d / 2 + milliseconds(half(rng)) + d / 4;
}

/// The outcome of the start-up check.
struct checked {
    enum class verdict { ok, unreachable, refused } v = verdict::ok;
    std::string message;
    std::vector<std::string> warnings;
};

} // namespace

struct postgres_store::impl : std::enable_shared_from_this<impl> {
    struct slot {
        explicit slot(const net::any_io_executor& ex) : wake(ex) {}
        std::shared_ptr<pg::pg_connection> conn;
        net::steady_timer wake;
        bool idle = false;    // the keeper waits in `wake` and may be woken to reconnect now
        bool counted = false; // counted in `connected_slots`
    };
    struct worker {
        explicit worker(net::any_io_executor e)
            : ex(std::move(e)), context(&net::query(ex, net::execution::context)) {}
        net::any_io_executor ex;
        net::execution_context* context;
        std::vector<std::unique_ptr<slot>> slots;
        std::size_t next = 0; // touched only by the worker's own thread
        std::atomic<std::uint64_t> connects{0};
    };

    impl(const config::postgres_config& c, std::vector<net::any_io_executor> executors)
        : cfg(c), names(names_of(c.table)), password(c.password) {
        if (executors.empty()) {
            throw std::invalid_argument("postgres_store needs at least one worker executor");
        }
        for (auto [name, text] : {std::pair{stmt::claim, sql::claim_sql},
                                  {stmt::lookup, sql::lookup_sql},
                                  {stmt::complete, sql::complete_sql},
                                  {stmt::release, sql::release_sql},
                                  {stmt::extend, sql::extend_sql},
                                  {stmt::inspect, sql::inspect_sql},
                                  {stmt::purge, sql::purge_sql},
                                  {stmt::sweep, sql::sweep_sql},
                                  {stmt::ping, sql::ping_sql}}) {
            statements.push_back({name, render(text, names)});
        }
        for (auto& ex : executors) {
            auto w = std::make_unique<worker>(std::move(ex));
            for (std::size_t i = 0; i < std::max<std::size_t>(cfg.pool, 1); ++i) {
                w->slots.push_back(std::make_unique<slot>(w->ex));
            }
            workers.push_back(std::move(w));
        }
        sweep_timer.emplace(workers.front()->ex);
        late_timer.emplace(workers.front()->ex);
    }

    config::postgres_config cfg;
    rendered_names names;
    std::vector<pg::pg_statement> statements;
    std::vector<std::unique_ptr<worker>> workers;
    std::optional<net::steady_timer> sweep_timer; // first worker's
    std::optional<net::steady_timer> late_timer;  // first worker's: the degraded start's retries
    std::mutex password_mutex;
    std::string password;
    std::atomic<bool> started{false};
    std::atomic<bool> closed{false};
    /// Open connections over all workers, as their keepers last saw them: a worker without one
    /// while another has one knows the server answers, so it reconnects now and waits for it.
    std::atomic<int> connected_slots{0};
    std::atomic<std::int64_t> last_server_warning{-1'000'000};
    std::atomic<std::int64_t> last_sweep_warning{-1'000'000};

    /// Connection options; `prepared`: with the runtime statements (the pools' connections).
    pg::pg_connection_options options(bool prepared) {
        pg::pg_connection_options o;
        o.conninfo = cfg.url;
        o.connect_timeout = cfg.connect_timeout;
        o.command_timeout = cfg.statement_timeout + milliseconds(1'000);
        {
            std::lock_guard lock(password_mutex);
            if (!password.empty()) {
                o.settings.emplace_back("password", password);
            }
        }
        if (!cfg.sslmode.empty()) {
            o.settings.emplace_back("sslmode", cfg.sslmode);
        }
        if (!cfg.ssl_root_cert.empty()) {
            o.settings.emplace_back("sslrootcert", cfg.ssl_root_cert);
        }
        o.settings.emplace_back("fallback_application_name", "onceproxy");
        o.settings.emplace_back(
            "options", "-c statement_timeout=" + std::to_string(cfg.statement_timeout.count()) +
                           " -c default_transaction_isolation=read\\ committed");
        if (prepared) {
            o.statements = statements;
        }
        return o;
    }

    worker* worker_of(const net::any_io_executor& ex) noexcept {
        auto* ctx = &net::query(ex, net::execution::context);
        for (auto& w : workers) {
            if (w->context == ctx) {
                return w.get();
            }
        }
        return nullptr;
    }

    /// Wakes the keepers of `w` that wait idle, so a lost connection is re-opened now.
    static void poke(worker& w) {
        for (auto& s : w.slots) {
            if (s->idle) {
                s->wake.cancel();
            }
        }
    }

    /// Wakes every keeper of `w`, also one waiting out its backoff: reconnect now.
    static void wake_all(worker& w) {
        for (auto& s : w.slots) {
            s->wake.cancel();
        }
    }

    /// A ready connection of `w`, round robin; nullptr when none is ready.
    static std::shared_ptr<pg::pg_connection> pick(worker& w) {
        const auto n = w.slots.size();
        for (std::size_t i = 0; i < n; ++i) {
            auto& s = *w.slots[(w.next + i) % n];
            if (s.conn && s.conn->ready()) {
                w.next = (w.next + i + 1) % n;
                return s.conn;
            }
        }
        poke(w);
        return nullptr;
    }

    /// Runs prepared statement `name` on a connection of the calling worker (module comment:
    /// what is sent again, and when).
    net::awaitable<pg_result> exec(const char* name, std::vector<pg_param> params,
                                   bool idempotent) {
        auto ex = co_await net::this_coro::executor;
        worker* w = worker_of(ex);
        if (w == nullptr || !started || closed) {
            co_return not_connected();
        }
        std::optional<steady_clock::time_point> give_up;
        bool others_connected = false; // waiting because another worker has a connection
        pg_result last = not_connected();
        for (int attempt = 0; attempt < max_attempts; ++attempt) {
            auto c = pick(*w);
            if (!c && !give_up && connected_slots.load(std::memory_order_relaxed) > 0) {
                // This worker's connections are down (its keepers in backoff) but another
                // worker's are open: the server answers, so reconnect now rather than fail.
                give_up = steady_clock::now() + cfg.connect_timeout;
                others_connected = true;
            }
            if (!c && give_up) {
                // Wait for a connection to come back, within the bound. The keepers are woken
                // every 200 ms, also out of their backoff, so a server back (or a primary
                // promoted) meanwhile is found within the bound rather than at their next step.
                net::steady_timer pause(ex);
                for (int waited = 0; !c && !closed && steady_clock::now() < *give_up; ++waited) {
                    if (others_connected && connected_slots.load(std::memory_order_relaxed) == 0) {
                        break; // they lost theirs too: the server is down, fail now
                    }
                    if (waited % 10 == 0) {
                        wake_all(*w);
                    }
                    pause.expires_after(milliseconds(20));
                    co_await pause.async_wait(use_tuple);
                    c = pick(*w);
                }
            }
            if (!c) {
                co_return last;
            }
            auto r = co_await c->async_exec(name, params, pg::pg_format::binary);
            if (!r.ec) {
                co_return r;
            }
            const auto e = static_cast<pg::errc>(r.ec.value());
            const bool read_only = r.sqlstate == "25006"; // a standby, or a demoted primary
            if (read_only) {
                c->close(); // target_session_attrs=read-write finds the primary on reconnect
                poke(*w);
            }
            const bool no_effect = !r.sent || read_only || e == pg::errc::serialization_failure ||
                                   e == pg::errc::deadlock_detected;
            const bool lost = e == pg::errc::connection_lost && idempotent;
            if (!no_effect && !lost) {
                if (r.ec.category() == pg::pg_category() && !r.sqlstate.empty()) {
                    warn_limited(
                        last_server_warning, "postgres statement failed",
                        {{"statement", name}, {"sqlstate", r.sqlstate}, {"message", r.message}});
                }
                co_return r;
            }
            last = std::move(r);
            if (!give_up) {
                give_up = steady_clock::now() + cfg.connect_timeout;
            }
        }
        co_return last;
    }

    /// The start-up check on a one-shot connection of the calling executor: connect, read the
    /// schema version, migrate when asked and needed, and probe the table with the role's rights.
    net::awaitable<checked> check() {
        auto ex = co_await net::this_coro::executor;
        pg::pg_connection c(ex, options(false));
        checked out;
        const auto connected = co_await c.async_connect();
        if (connected.ec) {
            out.message = "postgres at " + redacted_url() + ": " + connected.message;
            out.v = is_setting_failure(connected.message) ? checked::verdict::refused
                                                          : checked::verdict::unreachable;
            co_return out;
        }
        auto failed = [&](const pg_result& r, std::string what) {
            out.message = what + " (" + redacted_url() +
                          "): " + (r.message.empty() ? r.ec.message() : r.message);
            out.v = r.sqlstate.empty() ? checked::verdict::unreachable : checked::verdict::refused;
            return out;
        };
        auto version = co_await read_version(c);
        if (!version) {
            co_return failed(version.error(), "cannot read the schema version of " + cfg.table);
        }
        if (*version < sql::schema_version && cfg.migrate == config::postgres_migrate::automatic) {
            const auto migrated = co_await c.async_query(render(sql::migrate_v1_sql, names));
            if (migrated.ec) {
                co_return failed(migrated, "migration of " + cfg.table + " to schema version " +
                                               std::to_string(sql::schema_version) + " failed");
            }
            log::info("store", "postgres schema migrated",
                      {{"table", cfg.table}, {"from", *version}, {"to", sql::schema_version}});
            version = co_await read_version(c);
            if (!version) {
                co_return failed(version.error(), "cannot read the schema version of " + cfg.table);
            }
        }
        if (*version < sql::schema_version) {
            out.v = checked::verdict::refused;
            out.message = "schema version " + std::to_string(sql::schema_version) + " of " +
                          cfg.table + " is missing (found " + std::to_string(*version) +
                          "): run the migration (docs/stores.md), or set migrate: auto";
            co_return out;
        }
        if (*version > sql::schema_version) {
            out.warnings.push_back("schema version " + std::to_string(*version) + " of " +
                                   cfg.table + " is newer than this build's (" +
                                   std::to_string(sql::schema_version) +
                                   "); migrations are additive, so it is used as is");
        }
        const auto probed = co_await c.async_query(render(sql::ping_sql, names));
        if (probed.ec) {
            co_return failed(probed, "the records table " + cfg.table + " cannot be read");
        }
        co_return out;
    }

    /// The recorded schema version: 0 when none (the version table missing: 42P01).
    net::awaitable<boost::system::result<int, pg_result>> read_version(pg::pg_connection& c) {
        auto r = co_await c.async_query(render(sql::schema_version_sql, names));
        if (r.ec) {
            if (r.sqlstate == "42P01") {
                co_return 0;
            }
            co_return r;
        }
        if (r.rows.size() != 1 || r.rows[0].empty() || !r.rows[0][0]) {
            r.ec = pg::errc::protocol;
            r.message = "unexpected answer to the schema version query";
            co_return r;
        }
        co_return std::stoi(*r.rows[0][0]);
    }

    /// The URL without a password, for messages.
    std::string redacted_url() const {
        std::string u = cfg.url;
        const auto scheme = u.find("://");
        const auto at = u.find('@');
        if (scheme != std::string::npos && at != std::string::npos && at > scheme) {
            const auto colon = u.find(':', scheme + 3);
            if (colon != std::string::npos && colon < at) {
                u.replace(colon + 1, at - colon - 1, "***");
            }
        }
        return u;
    }

    /// Starts the pools and the sweep (after a passed check).
    void start() {
        if (started.exchange(true)) {
            return;
        }
        auto self = shared_from_this();
        for (auto& w : workers) {
            for (auto& s : w->slots) {
                net::co_spawn(w->ex, keep(self, w.get(), s.get()), net::detached);
            }
        }
        net::co_spawn(workers.front()->ex, sweep_loop(self), net::detached);
    }

    /// Keeps one slot's connection open: connects, and re-connects with backoff once it is lost.
    static net::awaitable<void> keep(std::shared_ptr<impl> self, worker* w, slot* s) {
        auto backoff = min_backoff;
        bool failing = false;
        while (!self->closed) {
            if (!s->conn || !s->conn->ready()) {
                if (s->counted) {
                    s->counted = false;
                    self->connected_slots.fetch_sub(1, std::memory_order_relaxed);
                }
                auto c = std::make_shared<pg::pg_connection>(w->ex, self->options(true));
                s->conn = c;
                const auto report = co_await c->async_connect();
                if (self->closed) {
                    c->close();
                    break;
                }
                if (report.ec) {
                    if (!failing) {
                        log::warn("store", "postgres connection failed; retrying with backoff",
                                  {{"url", self->redacted_url()}, {"reason", report.message}});
                    }
                    failing = true;
                    s->wake.expires_after(jittered(backoff));
                    co_await s->wake.async_wait(use_tuple);
                    backoff = std::min(backoff * 2, max_backoff);
                    continue;
                }
                if (failing) {
                    log::info("store", "postgres connection re-established",
                              {{"url", self->redacted_url()}});
                }
                failing = false;
                backoff = min_backoff;
                w->connects.fetch_add(1, std::memory_order_relaxed);
                s->counted = true;
                self->connected_slots.fetch_add(1, std::memory_order_relaxed);
            }
            s->idle = true;
            s->wake.expires_after(milliseconds(1'000));
            co_await s->wake.async_wait(use_tuple);
            s->idle = false;
        }
    }

    static net::awaitable<void> sweep_loop(std::shared_ptr<impl> self) {
        while (!self->closed) {
            self->sweep_timer->expires_after(jittered(self->cfg.sweep_interval));
            co_await self->sweep_timer->async_wait(use_tuple);
            if (self->closed) {
                break;
            }
            auto swept = co_await self->sweep();
            if (!swept) {
                warn_limited(self->last_sweep_warning, "postgres expiry sweep failed",
                             {{"reason", swept.error().message()}});
            } else if (*swept > 0) {
                log::debug("store", "postgres expiry sweep", {{"deleted", *swept}});
            }
        }
    }

    net::awaitable<result<std::uint64_t>> sweep() {
        std::uint64_t deleted = 0;
        for (int batch = 0; batch < max_sweep_batches && !closed; ++batch) {
            std::vector<pg_param> params{text_param(sql::sweep_batch)};
            auto r = co_await exec(stmt::sweep, std::move(params), true);
            if (r.ec) {
                co_return store_error_of(r);
            }
            deleted += r.affected;
            if (r.affected < static_cast<std::uint64_t>(sql::sweep_batch)) {
                break;
            }
        }
        co_return deleted;
    }

    /// After a degraded start: the check again with backoff until it passes (then the pools
    /// start) or refuses (then the store stays out of service, logged).
    static net::awaitable<void> late_open(std::shared_ptr<impl> self) {
        auto backoff = milliseconds(500);
        while (!self->closed) {
            self->late_timer->expires_after(jittered(backoff));
            co_await self->late_timer->async_wait(use_tuple);
            if (self->closed) {
                break;
            }
            auto c = co_await self->check();
            if (c.v == checked::verdict::unreachable) {
                backoff = std::min(backoff * 2, max_backoff);
                continue;
            }
            for (const auto& w : c.warnings) {
                log::warn("store", w);
            }
            if (c.v == checked::verdict::refused) {
                log::error("store", c.message + " (found after a degraded start: the store is "
                                                "not used)");
                co_return;
            }
            log::info("store", "postgres answering; the store is in service",
                      {{"table", self->cfg.table}});
            self->start();
            co_return;
        }
    }

    void close() {
        closed = true;
        for (auto& w : workers) {
            net::post(w->ex, [self = shared_from_this(), w = w.get()] {
                for (auto& s : w->slots) {
                    s->wake.cancel();
                    if (s->conn) {
                        s->conn->close();
                    }
                }
            });
        }
        net::post(workers.front()->ex, [self = shared_from_this()] {
            self->sweep_timer->cancel();
            self->late_timer->cancel();
        });
    }
};

postgres_store::postgres_store(const config::postgres_config& cfg,
                               std::vector<net::any_io_executor> workers)
    : impl_(std::make_shared<impl>(cfg, std::move(workers))) {}

postgres_store::~postgres_store() = default;

net::awaitable<open_report> postgres_store::async_open() {
    auto c = co_await impl_->check();
    open_report report;
    report.warnings = std::move(c.warnings);
    switch (c.v) {
    case checked::verdict::ok:
        impl_->start();
        break;
    case checked::verdict::unreachable:
        // As with Redis (issue 9): not a reason to exit. Routes follow on_store_error until the
        // check passes in the background.
        report.degraded = true;
        report.message = std::move(c.message);
        net::co_spawn(impl_->workers.front()->ex, impl::late_open(impl_), net::detached);
        break;
    case checked::verdict::refused:
        report.ec = errc::unavailable;
        report.message = std::move(c.message);
        break;
    }
    co_return report;
}

void postgres_store::close() {
    impl_->close();
}

void postgres_store::set_password(std::string password) {
    std::lock_guard lock(impl_->password_mutex);
    impl_->password = std::move(password);
}

std::string postgres_store::row_key(std::string_view key) const {
    std::string out = impl_->cfg.key_prefix;
    out += key;
    return out;
}

std::uint64_t postgres_store::connects(const net::any_io_executor& ex) const noexcept {
    auto* w = impl_->worker_of(ex);
    return w != nullptr ? w->connects.load(std::memory_order_relaxed) : 0;
}

net::awaitable<result<claim_result>> postgres_store::async_claim(claim_request req) {
    auto key = row_key(req.key);
    unsigned trips = 0;
    auto answer = [&](const pg_result& r) -> result<claim_result> {
        const auto& row = r.rows.front();
        const auto status = int_of(row.size() >= 4 ? row[0] : std::nullopt);
        const auto remaining = int_of(row.size() >= 4 ? row[1] : std::nullopt);
        const auto created = int_of(row.size() >= 4 ? row[3] : std::nullopt);
        if (!status || !remaining || !created || *status < sql::status_acquired ||
            *status > sql::status_mismatch) {
            return errc::protocol;
        }
        claim_result out;
        out.status = static_cast<claim_status>(*status);
        out.round_trips = trips;
        if (out.status == claim_status::in_flight) {
            out.remaining_lease = duration(std::max<std::int64_t>(*remaining, 1));
        } else if (out.status == claim_status::completed) {
            if (!row[2]) {
                return errc::protocol;
            }
            out.record = *row[2];
            out.created_ms = *created;
        }
        return out;
    };
    if (impl_->cfg.lookup_before_claim) {
        ++trips;
        std::vector<pg_param> params{pg_param::text(key),
                                     pg_param::binary(std::string(req.fingerprint)),
                                     pg_param::binary(std::string(req.owner))};
        auto r = co_await impl_->exec(stmt::lookup, std::move(params), true);
        if (r.ec) {
            co_return store_error_of(r);
        }
        if (!r.rows.empty()) {
            co_return answer(r);
        }
    }
    ++trips;
    std::vector<pg_param> params{pg_param::text(std::move(key)),
                                 pg_param::binary(std::string(req.fingerprint)),
                                 pg_param::binary(std::string(req.owner)),
                                 text_param(req.lease.count()), text_param(req.created_ms)};
    auto r = co_await impl_->exec(stmt::claim, std::move(params), true);
    if (r.ec) {
        co_return store_error_of(r);
    }
    if (r.rows.size() != 1) {
        co_return errc::protocol;
    }
    co_return answer(r);
}

namespace {
result<fence_status> fenced(const pg_result& r) {
    if (r.ec) {
        return store_error_of(r);
    }
    return r.rows.empty() ? fence_status::not_owner : fence_status::ok;
}
} // namespace

net::awaitable<result<fence_status>>
postgres_store::async_complete(std::string_view key, std::string_view owner,
                               std::string_view payload, duration ttl, record_kind kind,
                               claimed_lease /*claimed: the owner fences alone*/) {
    std::vector<pg_param> params{pg_param::text(row_key(key)), pg_param::binary(std::string(owner)),
                                 pg_param::binary(std::string(payload)), text_param(ttl.count()),
                                 text_param(kind == record_kind::evictable ? 1 : 0)};
    const auto r = co_await impl_->exec(stmt::complete, std::move(params), true);
    co_return fenced(r);
}

net::awaitable<result<fence_status>> postgres_store::async_release(std::string_view key,
                                                                   std::string_view owner) {
    std::vector<pg_param> params{pg_param::text(row_key(key)),
                                 pg_param::binary(std::string(owner))};
    const auto r = co_await impl_->exec(stmt::release, std::move(params), false);
    co_return fenced(r);
}

net::awaitable<result<fence_status>>
postgres_store::async_extend(std::string_view key, std::string_view owner, duration lease) {
    std::vector<pg_param> params{pg_param::text(row_key(key)), pg_param::binary(std::string(owner)),
                                 text_param(lease.count())};
    const auto r = co_await impl_->exec(stmt::extend, std::move(params), true);
    co_return fenced(r);
}

net::awaitable<result<key_info>> postgres_store::async_inspect(std::string key) {
    std::vector<pg_param> params{pg_param::text(row_key(key))};
    auto r = co_await impl_->exec(stmt::inspect, std::move(params), true);
    if (r.ec) {
        co_return store_error_of(r);
    }
    key_info info;
    if (r.rows.empty()) {
        co_return info;
    }
    const auto& row = r.rows.front();
    if (row.size() != 6) {
        co_return errc::protocol;
    }
    const auto completed = bool_of(row[0]);
    const auto remaining = int_of(row[1]);
    const auto age = int_of(row[2]);
    const auto created = int_of(row[5]);
    if (!completed || !remaining || !age || !created) {
        co_return errc::protocol;
    }
    info.remaining = duration(std::max<std::int64_t>(*remaining, 0));
    if (*completed) {
        info.state = key_state::completed;
        info.record = row[3].value_or("");
        info.fingerprint = row[4].value_or("");
        info.created_ms = *created;
    } else {
        info.state = key_state::in_flight;
        info.owner_age = duration(std::max<std::int64_t>(*age, 0));
    }
    co_return info;
}

net::awaitable<result<purge_status>> postgres_store::async_purge(std::string key, bool force) {
    std::vector<pg_param> params{pg_param::text(row_key(key)), pg_param::text(force ? "t" : "f")};
    auto r = co_await impl_->exec(stmt::purge, std::move(params), false);
    if (r.ec) {
        co_return store_error_of(r);
    }
    const auto outcome =
        r.rows.size() == 1 && !r.rows[0].empty() ? int_of(r.rows[0][0]) : std::nullopt;
    if (!outcome || *outcome < sql::purge_absent || *outcome > sql::purge_in_flight) {
        co_return errc::protocol;
    }
    co_return static_cast<purge_status>(*outcome);
}

net::awaitable<result<void>> postgres_store::async_ping() {
    auto r = co_await impl_->exec(stmt::ping, std::vector<pg_param>{}, true);
    if (r.ec) {
        co_return store_error_of(r);
    }
    co_return result<void>{};
}

net::awaitable<result<std::uint64_t>> postgres_store::async_sweep() {
    co_return co_await impl_->sweep();
}

} // namespace onceproxy::store
