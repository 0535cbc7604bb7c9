#include "onceproxy/pg/pg_connection.hpp"

#include <libpq-fe.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdlib>
#include <deque>
#include <utility>

namespace onceproxy::pg {

namespace net = boost::asio;
using boost::system::error_code;

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

/// libpq's message without its trailing newline.
std::string conn_message(const PGconn* conn) {
    std::string m = conn != nullptr ? PQerrorMessage(conn) : "out of memory";
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) {
        m.pop_back();
    }
    return m;
}

pg_result failure(errc e, std::string message, bool sent) {
    pg_result r;
    r.ec = e;
    r.message = std::move(message);
    r.sent = sent;
    return r;
}

/// Copies a statement's result out of `res` (PGRES_TUPLES_OK, PGRES_COMMAND_OK or an error).
pg_result copy_result(const PGresult* res, const PGconn* conn) {
    pg_result out;
    out.sent = true;
    switch (PQresultStatus(res)) {
    case PGRES_TUPLES_OK:
    case PGRES_COMMAND_OK: {
        const int ncols = PQnfields(res);
        const int nrows = PQntuples(res);
        out.columns.reserve(static_cast<std::size_t>(ncols));
        for (int c = 0; c < ncols; ++c) {
            out.columns.emplace_back(PQfname(res, c));
        }
        out.rows.reserve(static_cast<std::size_t>(nrows));
        for (int r = 0; r < nrows; ++r) {
            pg_row row;
            row.reserve(static_cast<std::size_t>(ncols));
            for (int c = 0; c < ncols; ++c) {
                if (PQgetisnull(res, r, c) != 0) {
                    row.emplace_back();
                } else {
                    row.emplace_back(std::string(PQgetvalue(res, r, c),
                                                 static_cast<std::size_t>(PQgetlength(res, r, c))));
                }
            }
            out.rows.push_back(std::move(row));
        }
        const char* tuples = PQcmdTuples(const_cast<PGresult*>(res));
        out.affected = (tuples != nullptr && *tuples != 0) ? std::strtoull(tuples, nullptr, 10) : 0;
        return out;
    }
    case PGRES_FATAL_ERROR:
    case PGRES_NONFATAL_ERROR: {
        const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char* primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        out.message = primary != nullptr ? primary : PQresultErrorMessage(res);
        if (state != nullptr) {
            out.sqlstate = state;
            out.ec = errc_of_sqlstate(out.sqlstate);
        } else {
            // libpq's own error (no SQLSTATE): the connection broke while reading the result.
            out.ec = PQstatus(conn) == CONNECTION_BAD ? errc::connection_lost : errc::protocol;
        }
        return out;
    }
    default:
        out.ec = errc::protocol;
        out.message = std::string("unexpected result status ") + PQresStatus(PQresultStatus(res));
        return out;
    }
}

} // namespace

/// One statement handed to the connection, from the call until its result.
struct request {
    enum class kind {
        exec_prepared, ///< PQsendQueryPrepared(text = statement name)
        exec_sql,      ///< PQsendQueryParams(text = SQL)
        prepare,       ///< PQsendPrepare(text = statement name, sql)
    };

    request(const net::any_io_executor& ex, kind k, std::string t)
        : what(k), text(std::move(t)), timer(ex) {}

    kind what;
    std::string text;
    std::string sql;
    std::vector<pg_param> params;
    pg_format result_format = pg_format::text;
    net::steady_timer timer; ///< the deadline; cancelled when the result is in
    pg_result result;
    bool done = false;
};

using request_ptr = std::shared_ptr<request>;

struct pg_connection::impl : std::enable_shared_from_this<impl> {
    impl(executor_type e, pg_connection_options o)
        : ex(std::move(e)), options(std::move(o)), socket(ex), connect_timer(ex) {}

    ~impl() {
        if (socket.is_open()) {
            socket.release(); // libpq owns the descriptor: PQfinish closes it
        }
        if (conn != nullptr) {
            PQfinish(conn);
        }
    }

    executor_type ex;
    pg_connection_options options;
    PGconn* conn = nullptr;
    net::posix::stream_descriptor socket; ///< PQsocket(conn), waited on, never read
    net::steady_timer connect_timer;
    bool connecting = false;
    bool connect_timed_out = false;
    bool ready = false;           ///< open, in pipeline mode, statements prepared
    bool sync_scheduled = false;  ///< a Sync is posted for the end of this turn
    bool flushing = false;        ///< a flush loop waits for the socket to be writable
    std::uint64_t generation = 0; ///< one per connection: coroutines of an old one stop
    std::uint64_t connects = 0;
    std::uint64_t syncs = 0;

    /// What was sent and awaits its result, in order; nullptr stands for a Sync.
    std::deque<request_ptr> queue;
    /// The current batch (since the last Sync result): statements that succeeded, their results
    /// handed out once the Sync confirms the commit, and statements rolled back or skipped by an
    /// error in the batch, sent again after the Sync.
    std::vector<request_ptr> held;
    std::vector<request_ptr> retry;
    /// Statements issued while a batch is in flight: they go out together as the next batch
    /// when its Sync result arrives, so one commit (one WAL flush) serves them all, instead of
    /// one per event-loop turn queueing behind each other in the server.
    std::vector<request_ptr> waiting;
    unsigned syncs_in_flight = 0;

    static void complete(const request_ptr& r, pg_result result) {
        if (r->done) {
            return;
        }
        r->result = std::move(result);
        r->done = true;
        r->timer.cancel();
    }

    /// Closes the connection and fails everything pending with `e` (sent: it may have run).
    void fail_connection(errc e, const std::string& message) {
        ready = false;
        flushing = false;
        ++generation;
        if (socket.is_open()) {
            socket.release(); // its waits complete with operation_aborted
        }
        if (conn != nullptr) {
            PQfinish(conn);
            conn = nullptr;
        }
        std::vector<request_ptr> pending = std::move(held);
        pending.insert(pending.end(), retry.begin(), retry.end());
        for (auto& r : queue) {
            if (r) {
                pending.push_back(std::move(r));
            }
        }
        held.clear();
        retry.clear();
        queue.clear();
        syncs_in_flight = 0;
        const auto unsent = std::move(waiting);
        waiting.clear();
        for (const auto& r : pending) {
            complete(r, failure(e, message, true));
        }
        for (const auto& r : unsent) {
            complete(r, failure(e, message, false)); // never handed to libpq: no effect
        }
    }

    /// Hands `r` to libpq and schedules the Sync of this turn.
    void send(const request_ptr& r) {
        std::vector<const char*> values;
        std::vector<int> lengths;
        std::vector<int> formats;
        for (const auto& p : r->params) {
            values.push_back(p.value ? p.value->data() : nullptr);
            lengths.push_back(p.value ? static_cast<int>(p.value->size()) : 0);
            formats.push_back(static_cast<int>(p.format));
        }
        const int n = static_cast<int>(r->params.size());
        const int fmt = static_cast<int>(r->result_format);
        int ok = 0;
        switch (r->what) {
        case request::kind::exec_prepared:
            ok = PQsendQueryPrepared(conn, r->text.c_str(), n, values.data(), lengths.data(),
                                     formats.data(), fmt);
            break;
        case request::kind::exec_sql:
            ok = PQsendQueryParams(conn, r->text.c_str(), n, nullptr, values.data(), lengths.data(),
                                   formats.data(), fmt);
            break;
        case request::kind::prepare:
            ok = PQsendPrepare(conn, r->text.c_str(), r->sql.c_str(), 0, nullptr);
            break;
        }
        if (ok == 0) {
            const std::string message = conn_message(conn);
            complete(r, failure(errc::send_failed, message, false));
            if (PQstatus(conn) == CONNECTION_BAD) {
                fail_connection(errc::connection_lost, message);
            }
            return;
        }
        queue.push_back(r);
        schedule_sync();
    }

    void schedule_sync() {
        if (sync_scheduled) {
            return;
        }
        sync_scheduled = true;
        // Posted behind the work already queued on the executor: every statement issued in this
        // turn joins the batch before its Sync.
        net::post(ex, [self = shared_from_this(), gen = generation] {
            self->sync_scheduled = false;
            if (gen == self->generation && self->conn != nullptr) {
                self->sync();
            }
        });
    }

    void sync() {
        if (PQpipelineSync(conn) != 1) { // also flushes, as far as the socket takes it
            fail_connection(errc::connection_lost, conn_message(conn));
            return;
        }
        queue.push_back(nullptr);
        ++syncs;
        ++syncs_in_flight;
        flush();
    }

    void flush() {
        const int r = PQflush(conn);
        if (r < 0) {
            fail_connection(errc::connection_lost, conn_message(conn));
            return;
        }
        if (r == 1 && !flushing) {
            flushing = true;
            net::co_spawn(ex, flush_loop(shared_from_this(), generation), net::detached);
        }
        // Flushing may have read input into libpq's buffer (it does so to avoid a deadlock
        // with a server whose own output is full): results there would never wake the reader.
        drain();
    }

    static net::awaitable<void> flush_loop(std::shared_ptr<impl> self, std::uint64_t gen) {
        for (;;) {
            auto [ec] = co_await self->socket.async_wait(net::posix::stream_descriptor::wait_write,
                                                         use_tuple);
            if (gen != self->generation) {
                co_return;
            }
            if (ec) {
                self->fail_connection(errc::connection_lost, ec.message());
                co_return;
            }
            const int r = PQflush(self->conn);
            if (r < 0) {
                self->fail_connection(errc::connection_lost, conn_message(self->conn));
                co_return;
            }
            self->drain();
            if (gen != self->generation) {
                co_return;
            }
            if (r == 0) {
                self->flushing = false;
                co_return;
            }
        }
    }

    static net::awaitable<void> read_loop(std::shared_ptr<impl> self, std::uint64_t gen) {
        for (;;) {
            auto [ec] = co_await self->socket.async_wait(net::posix::stream_descriptor::wait_read,
                                                         use_tuple);
            if (gen != self->generation) {
                co_return;
            }
            if (ec) {
                self->fail_connection(errc::connection_lost, ec.message());
                co_return;
            }
            if (PQconsumeInput(self->conn) == 0) {
                self->fail_connection(errc::connection_lost, conn_message(self->conn));
                co_return;
            }
            self->drain();
            if (gen != self->generation) {
                co_return;
            }
        }
    }

    /// Takes every result libpq can give without more input and matches it to `queue`.
    void drain() {
        const auto gen = generation;
        int nulls = 0;
        // A null result ends each statement's results; two in a row: nothing more for now.
        while (gen == generation && PQisBusy(conn) == 0 && nulls < 2) {
            PGresult* res = PQgetResult(conn);
            if (res == nullptr) {
                ++nulls;
                continue;
            }
            nulls = 0;
            on_result(res);
            PQclear(res);
        }
        if (gen == generation && PQstatus(conn) == CONNECTION_BAD) {
            fail_connection(errc::connection_lost, conn_message(conn));
        }
    }

    void on_result(const PGresult* res) {
        const auto status = PQresultStatus(res);
        if (status == PGRES_PIPELINE_SYNC) {
            if (queue.empty() || queue.front() != nullptr) {
                fail_connection(errc::protocol, "a Sync result out of order");
                return;
            }
            queue.pop_front();
            --syncs_in_flight;
            end_batch();
            return;
        }
        if (queue.empty() || queue.front() == nullptr) {
            // An error with no statement before the Sync: the commit of the batch failed.
            if (!queue.empty() && status == PGRES_FATAL_ERROR) {
                const pg_result error = copy_result(res, conn);
                for (const auto& r : held) {
                    complete(r, error);
                }
                held.clear();
            }
            return;
        }
        request_ptr r = std::move(queue.front());
        queue.pop_front();
        if (status == PGRES_PIPELINE_ABORTED) {
            retry.push_back(std::move(r)); // skipped: an earlier statement of the batch failed
            return;
        }
        pg_result result = copy_result(res, conn);
        if (result.ec) {
            // The batch's transaction is rolled back: the statements before this one too. A
            // prepared statement is not transactional: it stays.
            for (const auto& h : held) {
                if (h->what == request::kind::prepare) {
                    complete(h, std::move(h->result));
                } else {
                    retry.push_back(h);
                }
            }
            held.clear();
            complete(r, std::move(result));
            return;
        }
        r->result = std::move(result);
        held.push_back(std::move(r));
    }

    void end_batch() {
        for (const auto& r : held) {
            complete(r, std::move(r->result));
        }
        held.clear();
        auto again = std::move(retry);
        retry.clear();
        again.insert(again.end(), waiting.begin(), waiting.end());
        waiting.clear();
        for (const auto& r : again) {
            if (conn == nullptr) { // lost while sending the ones before
                complete(r, failure(errc::connection_lost, "connection lost", true));
            } else if (!r->done) {
                send(r);
            }
        }
    }

    /// The shared state is an argument (not `this`) so it outlives a handle destroyed between
    /// the call and the first co_await.
    static net::awaitable<pg_result> exec(std::shared_ptr<impl> self, request_ptr r) {
        if (!self->ready) {
            co_return failure(errc::not_connected, "not connected", false);
        }
        co_return co_await self->await_result(std::move(r));
    }

    /// Sends `r` on the open connection; its command_timeout starts now.
    void start(const request_ptr& r) {
        r->timer.expires_after(options.command_timeout);
        if (syncs_in_flight > 0 && ready) {
            waiting.push_back(r); // joins the next batch (see `waiting`)
            return;
        }
        send(r);
    }

    /// Sends `r` on the open connection and waits for its result, at most command_timeout.
    net::awaitable<pg_result> await_result(request_ptr r) {
        start(r);
        co_return co_await finish(std::move(r));
    }

    /// Waits for the result of a started `r`; closes the connection at its deadline.
    net::awaitable<pg_result> finish(request_ptr r) {
        auto self = shared_from_this();
        if (!r->done) {
            co_await r->timer.async_wait(use_tuple);
        }
        if (!r->done) {
            complete(r, failure(errc::timeout, "no result within the command timeout", true));
            fail_connection(errc::connection_lost, "closed after a command timeout");
        }
        co_return std::move(r->result);
    }

    void close() {
        connecting = false;
        connect_timer.cancel();
        fail_connection(errc::connection_lost, "connection closed");
    }

    static net::awaitable<pg_connect_report> connect(std::shared_ptr<impl> self) {
        co_return co_await self->do_connect();
    }

    net::awaitable<pg_connect_report> do_connect() {
        auto self = shared_from_this();
        close();
        const auto gen = generation;
        // conninfo is expanded first (expand_dbname); later keywords win over its values.
        std::vector<const char*> keys{"dbname"};
        std::vector<const char*> values{options.conninfo.c_str()};
        for (const auto& [k, v] : options.settings) {
            keys.push_back(k.c_str());
            values.push_back(v.c_str());
        }
        keys.push_back(nullptr);
        values.push_back(nullptr);
        conn = PQconnectStartParams(keys.data(), values.data(), 1);
        connecting = true;
        connect_timed_out = false;
        connect_timer.expires_after(options.connect_timeout);
        connect_timer.async_wait([self, gen](const error_code& ec) {
            if (!ec && gen == self->generation && self->connecting) {
                self->connect_timed_out = true;
                self->socket.cancel();
            }
        });
        auto fail = [&](errc e, std::string message) {
            if (gen == generation) {
                connecting = false;
                connect_timer.cancel();
                fail_connection(e, message);
            }
            return pg_connect_report{e, std::move(message)};
        };
        if (conn == nullptr || PQstatus(conn) == CONNECTION_BAD) {
            co_return fail(errc::connect_failed, conn_message(conn));
        }
        auto poll = PGRES_POLLING_WRITING;
        while (poll != PGRES_POLLING_OK) {
            if (poll == PGRES_POLLING_FAILED) {
                co_return fail(errc::connect_failed, conn_message(conn));
            }
            // libpq may open a new socket for the next host: wait on the current one.
            if (socket.is_open()) {
                socket.release();
            }
            error_code ec;
            socket.assign(PQsocket(conn), ec);
            if (ec) {
                co_return fail(errc::connect_failed, "no socket: " + ec.message());
            }
            auto [wait_ec] = co_await socket.async_wait(
                poll == PGRES_POLLING_READING ? net::posix::stream_descriptor::wait_read
                                              : net::posix::stream_descriptor::wait_write,
                use_tuple);
            if (gen != generation && connect_timed_out) {
                co_return pg_connect_report{errc::timeout,
                                            "no connection within the connect timeout"};
            }
            if (gen != generation) {
                co_return pg_connect_report{errc::connect_failed, "connection closed"};
            }
            if (connect_timed_out) {
                co_return fail(errc::timeout, "no connection within the connect timeout");
            }
            if (wait_ec) {
                co_return fail(errc::connect_failed, wait_ec.message());
            }
            poll = PQconnectPoll(conn);
        }
        if (socket.is_open()) {
            socket.release();
        }
        error_code ec;
        socket.assign(PQsocket(conn), ec);
        if (ec || PQsetnonblocking(conn, 1) != 0 || PQenterPipelineMode(conn) != 1) {
            co_return fail(errc::connect_failed, "cannot enter pipeline mode: " +
                                                     (ec ? ec.message() : conn_message(conn)));
        }
        PQsetNoticeProcessor(
            conn, [](void*, const char*) {}, nullptr);
        net::co_spawn(ex, read_loop(self, gen), net::detached);
        // All prepared in one batch.
        std::vector<request_ptr> prepares;
        for (const auto& s : options.statements) {
            prepares.push_back(std::make_shared<request>(ex, request::kind::prepare, s.name));
            prepares.back()->sql = s.sql;
            start(prepares.back());
        }
        for (std::size_t i = 0; i < prepares.size(); ++i) {
            const auto& s = options.statements[i];
            const pg_result prepared = co_await finish(prepares[i]);
            if (gen != generation && connect_timed_out) {
                co_return pg_connect_report{errc::timeout,
                                            "no connection within the connect timeout"};
            }
            if (gen != generation) {
                co_return pg_connect_report{errc::connect_failed,
                                            "connection lost while preparing statements: " +
                                                prepared.message};
            }
            if (prepared.ec) {
                co_return fail(errc::connect_failed,
                               "cannot prepare statement " + s.name + ": " + prepared.message);
            }
        }
        if (connect_timed_out) {
            co_return fail(errc::timeout, "no connection within the connect timeout");
        }
        connecting = false;
        connect_timer.cancel();
        ready = true;
        ++connects;
        co_return pg_connect_report{};
    }
};

pg_connection::pg_connection(executor_type ex, pg_connection_options options)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(options))) {}

pg_connection::~pg_connection() {
    close();
}

pg_connection::pg_connection(pg_connection&&) noexcept = default;

pg_connection& pg_connection::operator=(pg_connection&& o) noexcept {
    if (this != &o) {
        close();
        impl_ = std::move(o.impl_);
    }
    return *this;
}

const pg_connection::executor_type& pg_connection::get_executor() const noexcept {
    return impl_->ex;
}

net::awaitable<pg_connect_report> pg_connection::async_connect() {
    return impl::connect(impl_);
}

net::awaitable<pg_result> pg_connection::async_exec(std::string statement,
                                                    std::vector<pg_param> params,
                                                    pg_format result_format) {
    auto r =
        std::make_shared<request>(impl_->ex, request::kind::exec_prepared, std::move(statement));
    r->params = std::move(params);
    r->result_format = result_format;
    return impl::exec(impl_, std::move(r));
}

net::awaitable<pg_result> pg_connection::async_query(std::string sql, std::vector<pg_param> params,
                                                     pg_format result_format) {
    auto r = std::make_shared<request>(impl_->ex, request::kind::exec_sql, std::move(sql));
    r->params = std::move(params);
    r->result_format = result_format;
    return impl::exec(impl_, std::move(r));
}

void pg_connection::close() {
    if (impl_) {
        impl_->close();
    }
}

bool pg_connection::ready() const noexcept {
    return impl_ && impl_->ready;
}

std::uint64_t pg_connection::connect_count() const noexcept {
    return impl_ ? impl_->connects : 0;
}

std::uint64_t pg_connection::sync_count() const noexcept {
    return impl_ ? impl_->syncs : 0;
}

} // namespace onceproxy::pg
