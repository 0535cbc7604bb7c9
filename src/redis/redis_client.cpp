#include "onceproxy/redis/redis_client.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/redis/error.hpp"
#include "onceproxy/wire/coarse_clock.hpp"
#include "onceproxy/wire/stream.hpp"
#include "redis/redis_multiplexer.hpp"

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

// GCC 12 reports a false -Wmismatched-new-delete on Asio's awaitable frames once it inlines
// their recycling allocator (operator new and delete do match: thread_info_base).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace onceproxy::redis {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using boost::system::error_code;

namespace {

std::chrono::milliseconds jittered(std::chrono::milliseconds cap) {
    // Jitter (delay uniform in [cap/2, cap]) spreads the reconnects of many workers and
    // replicas after a Redis restart instead of sending them all in the same millisecond.
    thread_local std::minstd_rand rng{std::random_device{}()};
    const auto hi = std::max<long long>(cap.count(), 1);
    std::uniform_int_distribution<long long> dist(hi / 2, hi);
    return std::chrono::milliseconds(dist(rng));
}

struct pending;

using waiter_type = net::any_completion_handler<void()>;

// Runs a waiter as a move-only function object: Asio 1.81's any_completion_handler wraps an
// lvalue of itself in a new one (its move assignment does too), endlessly.
struct resumption {
    explicit resumption(waiter_type h) : w(std::move(h)) {}
    resumption(resumption&&) noexcept = default;
    resumption(const resumption&) = delete;
    resumption& operator=(const resumption&) = delete;
    resumption& operator=(resumption&&) = delete;
    ~resumption() = default;
    void operator()() { std::move(w)(); }
    waiter_type w;
};

// The coroutines of one event loop waiting for Redis replies, as a service of that loop. A
// waiting coroutine is a completion handler kept in its request (pending::waiter), woken when the
// request is done. Listed here so that the loop's shutdown reaches the handlers of requests that
// were never done (a loop torn down with its connection still open): their coroutines, and what
// they hold, are destroyed with the loop, as a timer's waiters would be.
class parked_replies final : public net::execution_context::service {
public:
    static net::execution_context::id id;

    explicit parked_replies(net::execution_context& ctx) : net::execution_context::service(ctx) {}

    void park(pending& p) noexcept;
    void unpark(pending& p) noexcept;

    // Resumes `w` in the loop, never inside the caller (a reply reader, a connection's close):
    // held for the reader of a batch of replies to run once the batch is read (batch), else
    // posted.
    void resume(waiter_type w) {
        if (reading_) {
            woken_.push_back(std::move(w));
        } else {
            net::post(executor, resumption(std::move(w)));
        }
    }

    // Runs `read` (which hands a batch of replies to the multiplexer), then resumes at once, in
    // their order, the waiters whose replies it read: a batch's wake-ups need no trip through
    // the loop's queue (two per first execution). The caller's state must be consistent
    // around `read` (the resumed coroutines issue commands, close the connection).
    template <class F>
    auto batch(F&& read) {
        struct reading {
            bool& on;
            explicit reading(bool& b) : on(b) { on = true; }
            ~reading() { on = false; }
            reading(const reading&) = delete;
            reading& operator=(const reading&) = delete;
        };
        auto out = [&] {
            const reading r(reading_);
            return std::forward<F>(read)();
        }();
        auto woken = std::exchange(woken_, {});
        for (auto& w : woken) { // none is added meanwhile (resume posts outside a batch)
            try {
                resumption(std::move(w))();
            } catch (...) {
                // Out of the loop's run(), as from a posted wake-up; the reader goes on.
                net::post(executor, [e = std::current_exception()] { std::rethrow_exception(e); });
            }
        }
        woken.clear();
        woken_.swap(woken); // its capacity, for the next batch
        return out;
    }

    // An executor of the loop, where woken waiters resume (set by the first client on it).
    net::any_io_executor executor;

private:
    void shutdown() override;

    pending* first_ = nullptr;
    bool reading_ = false;
    std::vector<waiter_type> woken_; // during a batch
};

net::execution_context::id parked_replies::id;

// One request of the shell: the multiplexer's request, its deadline and who waits for it.
struct pending : redis_request {
    explicit pending(parked_replies& p) : parking(&p) {
        on_done = [this] { wake(); };
    }
    ~pending() {
        if (parked) {
            parking->unpark(*this);
        }
    }
    pending(const pending&) = delete;
    pending& operator=(const pending&) = delete;

    // Parks `handler` until the request is done. It never resumes inside the reply reader
    // that completed the request (parked_replies::resume).
    void wait(waiter_type handler) {
        if (!waiter) {
            waiter.swap(handler); // not a move assignment: Asio 1.81's copies (see resumption)
        } else {
            more_waiters.push_back(std::move(handler)); // a shared WAIT's other joiners
        }
        if (!parked) {
            parking->park(*this);
        }
    }

    // The request is done: every waiter resumes (on its own executor, after this returns).
    void wake() {
        if (parked) {
            parking->unpark(*this);
        }
        if (waiter) {
            resume(std::move(waiter));
        }
        for (auto& w : std::exchange(more_waiters, {})) {
            resume(std::move(w));
        }
    }

    void resume(waiter_type w) { parking->resume(std::move(w)); }

    parked_replies* parking;
    // When its reply is due at the latest (the link's deadline check); max: none (yet) of its
    // own: an ASKING, whose command right behind it carries the deadline, or a shared WAIT
    // before the first to join it sets one.
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    waiter_type waiter;
    std::vector<waiter_type> more_waiters;
    // parked_replies' list.
    bool parked = false;
    pending* prev = nullptr;
    pending* next = nullptr;
};

void parked_replies::park(pending& p) noexcept {
    p.parked = true;
    p.prev = nullptr;
    p.next = first_;
    if (first_ != nullptr) {
        first_->prev = &p;
    }
    first_ = &p;
}

void parked_replies::unpark(pending& p) noexcept {
    (p.prev != nullptr ? p.prev->next : first_) = p.next;
    if (p.next != nullptr) {
        p.next->prev = p.prev;
    }
    p.parked = false;
    p.prev = p.next = nullptr;
}

void parked_replies::shutdown() {
    while (first_ != nullptr) {
        auto& p = *first_;
        unpark(p);
        // Destroyed at the end of this iteration, coroutine frames and all; that may end `p`
        // (and unpark others), so nothing of it is used after.
        auto waiter = std::move(p.waiter);
        auto more = std::move(p.more_waiters);
    }
}

// Waits until `p` is done: its reply, or its failure (its deadline, a lost connection). Not
// cancellable: the request ends by its deadline anyway.
net::awaitable<void> done(pending& p) {
    return net::async_initiate<const net::use_awaitable_t<>, void()>(
        [&p](auto handler) { p.wait(std::move(handler)); }, net::use_awaitable);
}

// One established (or being established) connection. A new link per attempt: the coroutines
// of an old link only ever touch their own link, so a late completion cannot hit a new socket.
// The link only moves bytes; the pipeline itself is the multiplexer's.
struct link : std::enable_shared_from_this<link> {
    // `ctx`: TLS with it (rediss://), else null: plain TCP.
    link(const net::any_io_executor& ex, std::shared_ptr<ssl::context> ctx)
        : stream(ctx ? wire::stream(tcp::socket(ex), std::move(ctx))
                     : wire::stream(tcp::socket(ex))),
          write_signal(ex), closed_signal(ex), health_timer(ex), deadline_timer(ex) {
        write_signal.expires_at(net::steady_timer::time_point::max());
        closed_signal.expires_at(net::steady_timer::time_point::max());
    }

    tcp::socket& socket() { return stream.socket(); }

    // Queues one command; false (and `p` failed) when the link is closed or it cannot be
    // encoded.
    bool enqueue(const std::shared_ptr<pending>& p, redis_args args) {
        if (closed || !mux.add(p, args)) {
            if (!p->done()) {
                p->st = redis_request::state::done;
                p->ec = errc::unavailable;
            }
            return false;
        }
        // Wakes the writer; everything enqueued before it resumes goes out in the same write.
        write_signal.cancel();
        return true;
    }

    // Closes the socket and fails every request still waiting. Idempotent.
    void close(error_code why) {
        if (closed) {
            return;
        }
        closed = true;
        close_reason = why;
        closed_at = std::chrono::steady_clock::now();
        stream.close(); // no close_notify: the commands still pending fail anyway
        write_signal.cancel();
        closed_signal.cancel();
        health_timer.cancel();
        deadline_timer.cancel();
        mux.close(errc::unavailable);
    }

    wire::stream stream; // plain or TLS
    net::steady_timer write_signal;
    net::steady_timer closed_signal;
    net::steady_timer health_timer; // cancelled by close(), so no timer outlives the link
    // Due at the earliest deadline of its requests, or later (see watch_deadline).
    net::steady_timer deadline_timer;
    bool deadline_armed = false;
    std::chrono::steady_clock::time_point deadline_at{}; // when armed

    redis_multiplexer mux;
    bool closed = false;
    error_code close_reason;
    std::uint64_t* write_counter = nullptr; // the owning client's statistic (same thread)
    parked_replies* parking = nullptr;      // where its replies' waiters wait (its loop's)
    bool readonly = false;                  // closed on a -READONLY reply (a demoted master)
    std::chrono::steady_clock::time_point ready_at{};  // when it was declared ready
    std::chrono::steady_clock::time_point closed_at{}; // when close() ran
};

// Makes sure `l` checks its requests' deadlines by `at` (a request's deadline). One timer per
// connection rather than one per request: when it fires, the first request past its deadline
// fails the connection (replies can no longer be matched safely on this pipeline), as its own
// timer did; with none, it is set again for the earliest deadline still open. Deadlines are
// set at coarse_now() + a timeout, so it usually runs once per timeout under load.
void watch_deadline(link& l, std::chrono::steady_clock::time_point at) {
    if (l.closed || (l.deadline_armed && l.deadline_at <= at)) {
        return;
    }
    l.deadline_armed = true;
    l.deadline_at = at;
    l.deadline_timer.expires_at(at); // a wait for a later time ends, aborted
    l.deadline_timer.async_wait([w = l.weak_from_this()](const error_code& ec) {
        const auto self = w.lock();
        if (ec || !self) {
            return; // set again for an earlier deadline, or the connection closed
        }
        self->deadline_armed = false;
        if (self->closed) {
            return;
        }
        const auto now = std::chrono::steady_clock::now();
        std::shared_ptr<redis_request> overdue;
        auto next = std::chrono::steady_clock::time_point::max();
        self->mux.for_each_open([&](const std::shared_ptr<redis_request>& r) {
            const auto due = static_cast<const pending&>(*r).deadline; // every request is one
            if (due <= now) {
                if (!overdue) {
                    overdue = r;
                }
            } else {
                next = std::min(next, due);
            }
        });
        if (overdue) {
            self->mux.on_timeout(overdue);
            self->close(errc::timeout);
        } else if (next != std::chrono::steady_clock::time_point::max()) {
            watch_deadline(*self, next);
        }
    });
}

net::awaitable<void> write_loop(std::shared_ptr<link> l) {
    std::string out;
    while (!l->closed) {
        if (!l->mux.has_unwritten()) {
            co_await l->write_signal.async_wait(use_tuple);
            continue;
        }
        l->mux.take_write(out);
        if (l->write_counter != nullptr) {
            ++*l->write_counter;
        }
        auto [ec, n] = co_await wire::async_write_all(l->stream, net::buffer(out));
        (void)n;
        if (ec) {
            l->close(errc::unavailable);
        }
    }
}

net::awaitable<void> read_loop(std::shared_ptr<link> l) {
    std::vector<char> buf(16 * 1024);
    while (!l->closed) {
        auto [ec, n] = co_await l->stream.async_read_some(net::buffer(buf), use_tuple);
        if (ec || l->closed) {
            l->close(errc::unavailable);
            co_return;
        }
        const auto read = l->parking->batch([&] { return l->mux.on_read(buf.data(), n); });
        if (read != redis_multiplexer::read_status::ok) {
            // Malformed or unmatched: the multiplexer failed everything; only a new
            // connection helps.
            l->close(errc::protocol);
            co_return;
        }
        if (l->mux.has_unwritten()) {
            l->write_signal.cancel(); // a reply released a held WAIT (join_wait)
        }
    }
}

} // namespace

struct redis_client::impl : std::enable_shared_from_this<redis_client::impl> {
    impl(net::any_io_executor executor, redis_client_options opts)
        : ex(std::move(executor)), options(std::move(opts)),
          parking(&net::use_service<parked_replies>(net::query(ex, net::execution::context))),
          backoff_timer(ex) {
        if (!parking->executor) {
            parking->executor = ex;
        }
        if (options.url.tls) {
            ssl_ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
            ssl_ctx->set_verify_mode(ssl::verify_peer);
            error_code ec;
            if (options.tls_ca_file.empty()) {
                ssl_ctx->set_default_verify_paths(ec);
            } else {
                ssl_ctx->load_verify_file(options.tls_ca_file, ec);
            }
            if (ec) {
                ca_error = "cannot load TLS CA file '" + options.tls_ca_file + "': " + ec.message();
            }
        }
    }

    std::string where() const { return options.url.host + ":" + std::to_string(options.url.port); }

    // Queues `commands` on `l` back to back (nothing of another issuer between them: ASKING +
    // command), at once: the bytes are encoded before this returns. The pending request of the
    // last one, or null with `ec` set when the link is closed or a command cannot be encoded
    // (the commands queued before it are then dropped).
    std::shared_ptr<pending> enqueue(link& l, std::span<const redis_args> commands,
                                     error_code& ec) {
        if (l.closed) {
            ec = errc::unavailable;
            return nullptr;
        }
        if (commands.empty() || commands.size() > 2) { // one command, or ASKING + one
            ec = errc::protocol;
            return nullptr;
        }
        for (const auto& args : commands) {
            if (args.empty()) { // refused before anything is queued: no ASKING goes out alone
                ec = errc::protocol;
                return nullptr;
            }
        }
        std::shared_ptr<pending> last;
        std::shared_ptr<pending> before; // ASKING: the one command ahead of `last`
        for (const auto& args : commands) {
            auto p = std::make_shared<pending>(*parking);
            if (!l.enqueue(p, args)) {
                if (last) {
                    l.mux.abandon(last, errc::protocol);
                }
                if (before) {
                    l.mux.abandon(before, errc::protocol);
                }
                ec = p->ec;
                return nullptr;
            }
            before = std::move(last);
            last = std::move(p);
        }
        return last;
    }

    // Sets `p`'s deadline, `after` from now, and has `l` check it.
    static void set_deadline(link& l, pending& p, std::chrono::milliseconds after) {
        // A command timeout needs no precision: the coarse clock (never earlier) spares a
        // precise read per command.
        p.deadline = wire::coarse_now() + after;
        watch_deadline(l, p.deadline);
    }

    // Waits for the reply of `p` (queued on `l` by enqueue, its deadline set) or its failure;
    // the result is that command's (an earlier one of the same batch that failed took the
    // connection, hence `p`, down).
    static net::awaitable<redis_exec_result> await_reply(std::shared_ptr<link> l,
                                                         std::shared_ptr<pending> p) {
        if (!p->done()) {
            co_await done(*p);
        }
        if (p->reply.is_error("READONLY")) {
            // A demoted master: find the new one. Behind Sentinel the sentinels are asked again;
            // with a plain URL the reconnect resolves its name again (a managed primary
            // endpoint or a Service that now points at the new master).
            l->readonly = true;
            l->close(errc::unavailable);
        }
        redis_exec_result out;
        out.ec = p->ec;
        out.written = p->written;
        out.reply = std::move(p->reply);
        co_return out;
    }

    // durability replicated: the shared WAIT (redis_multiplexer::join_wait) behind everything
    // queued on `l` so far; null when the link is closed. Its deadline runs from the first to
    // join it: command_timeout for a WAIT sent at once, twice that for a held one, which goes
    // out once the one ahead of it is answered (within wait_timeout, which the config keeps
    // below command_timeout, unless Redis stalls).
    std::shared_ptr<pending> join_wait(link& l, redis_args wait) {
        if (l.closed) {
            return nullptr;
        }
        auto r = l.mux.join_wait(wait, [this] { return std::make_shared<pending>(*parking); });
        auto p = std::static_pointer_cast<pending>(std::move(r)); // every request is a pending
        if (!p) {
            return nullptr;
        }
        if (p->deadline == std::chrono::steady_clock::time_point::max()) {
            const auto held = p->st == redis_request::state::held;
            set_deadline(l, *p, held ? 2 * options.command_timeout : options.command_timeout);
        }
        l.write_signal.cancel();
        return p;
    }

    // Waits for the reply of a shared WAIT `p` (join_wait) on `l` or its failure (its deadline
    // closes the connection as await_reply's does). The WAIT's other joiners read it too.
    static net::awaitable<redis_exec_result> await_shared(std::shared_ptr<link> l,
                                                          std::shared_ptr<pending> p) {
        (void)l; // held while waiting, as await_reply holds its link
        if (!p->done()) {
            co_await done(*p);
        }
        redis_exec_result out;
        out.ec = p->ec;
        out.written = p->written;
        out.reply = p->reply; // a copy: the others read it too
        co_return out;
    }

    static net::awaitable<redis_exec_result> failed(error_code ec) {
        redis_exec_result out;
        out.ec = ec;
        co_return out;
    }

    // Issues `commands` on `l` back to back and waits for the reply of the last one, at most
    // command_timeout (see enqueue and await_reply). The commands are queued before this
    // returns.
    net::awaitable<redis_exec_result> exec_on(const std::shared_ptr<link>& l,
                                              std::span<const redis_args> commands) {
        if (!l) {
            return failed(errc::unavailable);
        }
        error_code ec;
        auto p = enqueue(*l, commands, ec);
        if (!p) {
            return failed(ec);
        }
        set_deadline(*l, *p, options.command_timeout);
        return await_reply(l, std::move(p));
    }

    net::awaitable<redis_exec_result> exec_on(const std::shared_ptr<link>& l, redis_args args) {
        return exec_on(l, std::span<const redis_args>(&args, 1));
    }

    // Wakes everyone waiting for the outcome of a connection attempt.
    void notify() {
        for (auto& w : waiters) {
            if (auto t = w.lock()) {
                t->cancel();
            }
        }
        waiters.clear();
    }

    void set_ready(std::shared_ptr<link> l) {
        l->ready_at = std::chrono::steady_clock::now();
        current = std::move(l);
        ++connects;
        connecting = false;
        notify();
    }

    // Waits for the next change of connection state, at most until `deadline`.
    net::awaitable<void> wait_state_change(std::chrono::steady_clock::time_point deadline) {
        auto timer = std::make_shared<net::steady_timer>(ex, deadline);
        waiters.push_back(timer);
        co_await timer->async_wait(use_tuple);
    }

    bool is_ready() const { return current && !current->closed; }

    // A lost connection the run loop re-opens at once (see stable_connection): up long enough,
    // and not closed by a command timeout (a stuck server would only stall the new one too).
    // Judged by how long it was up (ready to closed), whenever asked; a stable_connection of
    // zero or less turns it off.
    bool reopens_at_once(const link& l) const {
        return l.closed && options.stable_connection.count() > 0 &&
               l.close_reason != errc::timeout && l.ready_at != decltype(l.ready_at){} &&
               l.closed_at - l.ready_at >= options.stable_connection;
    }

    // A connection attempt is under way, or about to start: the ready connection was just lost
    // and the run loop, not resumed yet, re-opens it at once. A command waits for it then.
    bool attempt_due() const {
        if (stopped) {
            return false;
        }
        return connecting || (started && backoff_cut) ||
               (started && current && current->closed && reopens_at_once(*current));
    }

    net::awaitable<void> health_loop(std::shared_ptr<link> l) {
        auto self = shared_from_this();
        while (!l->closed && !stopped) {
            l->health_timer.expires_after(options.health_check_interval);
            co_await l->health_timer.async_wait(use_tuple);
            if (l->closed || stopped) {
                co_return;
            }
            auto r = co_await exec_on(l, command("PING"));
            if (r.ec || r.reply.is_error()) {
                l->close(r.ec ? r.ec : error_code(errc::protocol));
            }
        }
    }

    // State of the watchdog of one connection attempt, shared with its handler, which may run
    // after the attempt returned.
    struct watchdog_state {
        explicit watchdog_state(const net::any_io_executor& e) : resolver(e), timer(e) {}
        tcp::resolver resolver;
        net::steady_timer timer;
        bool timed_out = false;
    };

    redis_connect_report timeout_failure(const std::shared_ptr<link>& l) {
        return fail(l, errc::timeout,
                    "connecting to Redis at " + where() + " timed out after " +
                        std::to_string(options.connect_timeout.count()) + " ms");
    }

    // One command of the connection handshake; a report when it failed.
    net::awaitable<std::optional<redis_connect_report>>
    handshake(std::shared_ptr<link> l, std::shared_ptr<watchdog_state> wd, redis_args args,
              std::string what, error_code on_error) {
        auto r = co_await exec_on(l, args); // queued at once: `args` is not used afterwards
        if (wd->timed_out) {
            co_return timeout_failure(l);
        }
        if (r.ec) {
            co_return fail(l, r.ec,
                           what + " on Redis at " + where() + " failed: " + r.ec.message());
        }
        if (r.reply.is_error()) {
            co_return fail(l, on_error,
                           what + " on Redis at " + where() + " refused: " + r.reply.str);
        }
        co_return std::nullopt;
    }

    redis_connect_report fail(const std::shared_ptr<link>& l, error_code ec, std::string message) {
        l->close(ec);
        redis_connect_report report{ec, std::move(message)};
        last_failure = report;
        connecting = false;
        notify();
        return report;
    }

    // Transport: resolve, TCP connect, TLS handshake. A report when it failed.
    net::awaitable<std::optional<redis_connect_report>>
    open_transport(std::shared_ptr<link> l, std::shared_ptr<watchdog_state> wd) {
        const bool& timed_out = wd->timed_out;
        auto [rec, endpoints] = co_await wd->resolver.async_resolve(
            options.url.host, std::to_string(options.url.port), use_tuple);
        if (timed_out) {
            co_return timeout_failure(l);
        }
        if (rec) {
            co_return fail(l, errc::unavailable,
                           "cannot resolve Redis host '" + options.url.host +
                               "': " + rec.message());
        }
        auto [cec, ep] = co_await net::async_connect(l->socket(), endpoints, use_tuple);
        if (timed_out) {
            co_return timeout_failure(l);
        }
        if (cec) {
            co_return fail(l, errc::unavailable,
                           "cannot connect to Redis at " + where() + ": " + cec.message());
        }
        error_code ignored;
        l->socket().set_option(tcp::no_delay(true), ignored);
        if (options.url.tls) {
            // SNI (names only) and certificate name/IP verification.
            error_code addr_ec;
            net::ip::make_address(options.url.host, addr_ec);
            if (addr_ec) {
                SSL_set_tlsext_host_name(l->stream.native_handle(), options.url.host.c_str());
            }
            l->stream.verify_host_name(options.url.host);
            const auto hec = co_await l->stream.async_handshake(wire::stream::role::client);
            if (timed_out) {
                co_return timeout_failure(l);
            }
            if (hec) {
                co_return fail(l, errc::tls_failed,
                               "TLS handshake with Redis at " + where() +
                                   " failed: " + hec.message());
            }
        }
        co_return std::nullopt;
    }

    // Session handshake on an open transport: AUTH, SELECT, SCRIPT LOAD. A report when it
    // failed.
    net::awaitable<std::optional<redis_connect_report>>
    run_handshake(std::shared_ptr<link> l, std::shared_ptr<watchdog_state> wd) {
        if (!options.url.password.empty()) {
            std::vector<std::string_view> args{"AUTH"};
            if (!options.url.user.empty()) {
                args.emplace_back(options.url.user);
            }
            args.emplace_back(options.url.password);
            if (auto bad = co_await handshake(l, wd, args, "AUTH", errc::auth_failed)) {
                co_return bad;
            }
        }
        if (options.url.db != 0) {
            const std::string db = std::to_string(options.url.db);
            if (auto bad =
                    co_await handshake(l, wd, command("SELECT", db), "SELECT", errc::protocol)) {
                co_return bad;
            }
        }
        if (options.address_source) {
            auto r = co_await exec_on(l, command("ROLE"));
            if (wd->timed_out) {
                co_return timeout_failure(l);
            }
            if (!r.ec && r.reply.is_error()) {
                // Refused, not a replica: say so. A user without +role (-NOPERM) or without
                // credentials (-NOAUTH) is a credentials problem the sentinels cannot help
                // with; anything else (-BUSY) is tried again.
                const bool credentials =
                    r.reply.str.rfind("NOPERM", 0) == 0 || r.reply.str.rfind("NOAUTH", 0) == 0;
                co_return fail(l, credentials ? errc::auth_failed : errc::unavailable,
                               "Redis at " + where() + " refused ROLE, which following a master " +
                                   "through Sentinel needs: " + r.reply.str);
            }
            if (r.ec || r.reply.type != redis_reply::kind::array || r.reply.elements.empty() ||
                r.reply.elements[0].str != "master") {
                co_return fail(l, errc::unavailable,
                               "Redis at " + where() + " is not a master (ROLE); asking again");
            }
        }
        for (const auto& script : options.scripts) {
            if (auto bad = co_await handshake(l, wd, command("SCRIPT", "LOAD", script),
                                              "SCRIPT LOAD", errc::protocol)) {
                // A server answering NOAUTH here means it wants a password we did not give.
                if (last_failure.message.find("NOAUTH") != std::string::npos) {
                    last_failure.ec = errc::auth_failed;
                    bad->ec = errc::auth_failed;
                }
                co_return bad;
            }
        }
        co_return std::nullopt;
    }

    net::awaitable<redis_connect_report> connect_once() {
        auto self = shared_from_this();
        auto l = std::make_shared<link>(ex, ssl_ctx);
        l->parking = parking;
        attempt = l;
        ++attempts;
        connecting = true;
        l->write_counter = &writes;
        if (!ca_error.empty()) {
            co_return fail(l, errc::tls_failed, ca_error);
        }
        if (options.address_source) {
            auto addr = co_await options.address_source();
            if (addr.ec) {
                co_return fail(l, addr.ec, std::move(addr.message));
            }
            if (l->closed) {
                // A +switch-master announcement closed this attempt while the sentinels were
                // asked: their answer may predate it. Ask again (the backoff is cut) rather
                // than connect and fail the ROLE check with a misleading "not a master".
                co_return fail(l, errc::unavailable,
                               "a new master was announced while the sentinels were asked; "
                               "asking again");
            }
            options.url.host = std::move(addr.host);
            options.url.port = addr.port;
        }
        // One watchdog bounds the whole attempt, transport (resolve + connect + TLS) and
        // handshake (AUTH + SELECT + SCRIPT LOAD): an unreachable or silent Redis gives a clear
        // error, never a hang.
        auto wd = std::make_shared<watchdog_state>(ex);
        wd->timer.expires_after(options.connect_timeout);
        wd->timer.async_wait([wd, weak = std::weak_ptr<link>(l)](error_code ec) {
            if (ec) {
                return;
            }
            wd->timed_out = true;
            wd->resolver.cancel();
            if (auto sl = weak.lock()) {
                sl->close(errc::timeout);
            }
        });
        struct cancel_on_exit {
            std::shared_ptr<watchdog_state> w;
            ~cancel_on_exit() { w->timer.cancel(); }
        } guard{wd};

        if (auto bad = co_await open_transport(l, wd)) {
            co_return *bad;
        }
        if (options.on_message) {
            l->mux.set_push_handler(options.on_message);
        }
        net::co_spawn(ex, read_loop(l), net::detached);
        net::co_spawn(ex, write_loop(l), net::detached);
        if (auto bad = co_await run_handshake(l, wd)) {
            co_return *bad;
        }
        if (stopped) {
            co_return fail(l, errc::unavailable, "client stopped");
        }
        set_ready(l);
        if (options.health_check_interval.count() > 0) {
            net::co_spawn(ex, health_loop(l), net::detached);
        }
        co_return redis_connect_report{};
    }

    net::awaitable<void> run() {
        auto self = shared_from_this();
        auto delay = options.reconnect_min;
        // Failed attempts since the last connection: only the first of a streak, or one whose
        // reason changed, is logged at warn, so an outage costs a line per client, not one per
        // backoff step.
        std::uint64_t failures = 0;
        std::string last_reason;
        bool after_readonly = false; // the last connection ended on -READONLY
        while (!stopped) {
            backoff_cut = false; // an announcement from here on is for this attempt's outcome
            auto report = co_await connect_once();
            if (!report.ec) {
                if (options.on_connected) {
                    options.on_connected({{}, {}, options.url.host, options.url.port},
                                         after_readonly);
                }
                after_readonly = false;
                log::info("store", "redis connected",
                          {{"redis", where()}, {"failed_attempts", failures}});
                failures = 0;
                last_reason.clear();
                delay = options.reconnect_min;
                auto l = current;
                while (!l->closed) {
                    co_await l->closed_signal.async_wait(use_tuple);
                }
                after_readonly = l->readonly;
                if (stopped) {
                    co_return;
                }
                const bool at_once = reopens_at_once(*l);
                current.reset(); // from here only connecting says whether to wait for us
                log::warn("store", "redis connection lost; reconnecting",
                          {{"redis", where()}, {"at_once", at_once}});
                if (at_once) {
                    // A master switch or a restart: commands issued meanwhile wait for this
                    // attempt rather than fail through a backoff delay.
                    continue;
                }
            } else {
                if (stopped) {
                    co_return;
                }
                ++failures;
                if (report.ec == errc::auth_failed || report.ec == errc::tls_failed) {
                    // Retrying a refused password at full speed only fills Redis's log.
                    delay = options.reconnect_max;
                }
                log::write(failures == 1 || report.message != last_reason ? log::level::warn
                                                                          : log::level::debug,
                           "store", "redis connect failed; reconnecting",
                           {{"redis", where()},
                            {"error", report.message},
                            {"attempt", failures},
                            {"retry_in_ms", static_cast<std::int64_t>(delay.count())}});
                last_reason = std::move(report.message);
            }
            if (!backoff_cut) {
                backoff_timer.expires_after(jittered(delay));
                co_await backoff_timer.async_wait(use_tuple);
            }
            if (backoff_cut) { // drop_connection_unless_at: a new master was announced
                backoff_cut = false;
                delay = options.reconnect_min;
            } else {
                delay = std::min(delay * 2, options.reconnect_max);
            }
        }
    }

    void stop() {
        stopped = true;
        backoff_timer.cancel();
        if (attempt) {
            attempt->close(errc::unavailable);
        }
        if (current) {
            current->close(errc::unavailable);
        }
        notify();
    }

    net::any_io_executor ex;
    redis_client_options options;
    parked_replies* parking;               // of ex's loop
    std::shared_ptr<ssl::context> ssl_ctx; // rediss:// only
    std::string ca_error;
    net::steady_timer backoff_timer;
    bool backoff_cut = false;      // a new master's address came since the current attempt began
    std::shared_ptr<link> current; // the ready link, if any
    std::shared_ptr<link> attempt; // the link of the latest attempt (ready or not)
    std::vector<std::weak_ptr<net::steady_timer>> waiters;
    redis_connect_report last_failure;
    std::uint64_t connects = 0;
    bool connecting = false; // a connection attempt is under way
    std::uint64_t writes = 0;
    std::uint64_t attempts = 0;
    bool started = false;
    bool stopped = false;
};

redis_client::redis_client(executor_type ex, redis_client_options options)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(options))) {}

redis_client::~redis_client() {
    if (impl_) {
        impl_->stop();
    }
}

redis_client::redis_client(redis_client&&) noexcept = default;

redis_client& redis_client::operator=(redis_client&& other) noexcept {
    if (this != &other) {
        if (impl_) {
            impl_->stop();
        }
        impl_ = std::move(other.impl_);
    }
    return *this;
}

const redis_client::executor_type& redis_client::get_executor() const noexcept {
    return impl_->ex;
}

void redis_client::start() {
    if (impl_->started) {
        return;
    }
    impl_->started = true;
    net::co_spawn(impl_->ex, impl_->run(), net::detached);
}

void redis_client::stop() {
    impl_->stop();
}

void redis_client::drop_connection() {
    if (impl_->current) {
        impl_->current->close(errc::unavailable);
    }
}

void redis_client::drop_connection_unless_at(const std::string& host, std::uint16_t port) {
    if (impl_->options.url.host == host && impl_->options.url.port == port) {
        return;
    }
    if (impl_->current) {
        impl_->current->close(errc::unavailable);
    }
    // An attempt under way towards the old address too: it fails and the next one asks the
    // sentinels again.
    if (impl_->attempt && impl_->attempt != impl_->current) {
        impl_->attempt->close(errc::unavailable);
    }
    // Backing off after failed attempts (towards a master that died): the new address is
    // known now, so the next attempt goes at once, with the backoff started over.
    // Also when it is connecting now: that attempt's failure skips the backoff.
    impl_->backoff_cut = true;
    impl_->backoff_timer.cancel();
}

net::awaitable<void> redis_client::async_wait_closed() {
    auto self = impl_;
    auto l = self->current;
    while (l && !l->closed) {
        co_await l->closed_signal.async_wait(use_tuple);
    }
}

void redis_client::set_password(std::string password) {
    impl_->options.url.password = std::move(password);
}

net::awaitable<redis_connect_report> redis_client::async_connect_once() {
    auto self = impl_;
    co_return co_await self->connect_once();
}

namespace {

// async_exec when a (re)connection is under way: waits for it (within the command's own
// deadline), then sends. Holds its own copy of the command.
net::awaitable<redis_exec_result> exec_after_connect(std::shared_ptr<redis_client::impl> self,
                                                     std::vector<std::string> args) {
    const std::vector<std::string_view> views(args.begin(), args.end());
    // Up to command_timeout for the attempt, then a whole command_timeout for the reply: a
    // reply deadline shortened by the wait could expire before any reply can come, and a
    // timeout closes the connection just opened (failing everything else on it).
    // Asked again here: the attempt may have ended between the call and the first resumption.
    if (!self->is_ready() && self->attempt_due()) {
        co_await self->wait_state_change(std::chrono::steady_clock::now() +
                                         self->options.command_timeout);
    }
    if (!self->is_ready()) {
        redis_exec_result out;
        out.ec = errc::unavailable; // never sent
        co_return out;
    }
    co_return co_await self->exec_on(self->current, views);
}

} // namespace

net::awaitable<redis_exec_result> redis_client::async_exec(redis_args args) {
    // No coroutine frame of its own on the ready path: the command is queued now and the
    // returned awaitable waits for its reply.
    auto& self = impl_;
    if (!self->is_ready() && self->attempt_due()) {
        // A (re)connection is under way or about to start: a command issued at start-up or
        // during a quick reconnect waits for it instead of failing at once.
        return exec_after_connect(self, {args.begin(), args.end()});
    }
    if (!self->is_ready()) {
        return impl::failed(errc::unavailable);
    }
    return self->exec_on(self->current, args);
}

net::awaitable<std::pair<redis_exec_result, redis_exec_result>>
redis_client::async_exec_replicated(redis_args args, redis_args wait) {
    auto self = impl_;
    std::pair<redis_exec_result, redis_exec_result> out;
    out.second.ec = errc::unavailable;
    if (!self->is_ready() && self->attempt_due()) {
        // As async_exec: wait for a (re)connection under way, then a whole command_timeout.
        co_await self->wait_state_change(std::chrono::steady_clock::now() +
                                         self->options.command_timeout);
    }
    if (!self->is_ready()) {
        out.first.ec = errc::unavailable; // never sent
        co_return out;
    }
    auto l = self->current;
    error_code ec;
    auto p = self->enqueue(*l, std::span<const redis_args>(&args, 1), ec);
    if (!p) {
        out.first.ec = ec;
        co_return out;
    }
    auto w = self->join_wait(*l, wait); // joined after `args` was queued: it covers `args`
    impl::set_deadline(*l, *p, self->options.command_timeout);
    out.first = co_await impl::await_reply(l, std::move(p));
    if (w && !out.first.ec && !out.first.reply.is_error()) {
        // Nothing to wait for after a failure or an error reply (a NOSCRIPT is retried at once);
        // the WAIT stays for the others.
        out.second = co_await impl::await_shared(l, std::move(w));
    }
    co_return out;
}

net::awaitable<redis_exec_result> redis_client::async_wait_replicas(redis_args wait) {
    auto self = impl_;
    std::shared_ptr<link> l = self->is_ready() ? self->current : nullptr;
    auto w = l ? self->join_wait(*l, wait) : nullptr;
    if (!w) {
        redis_exec_result out;
        out.ec = errc::unavailable;
        co_return out;
    }
    co_return co_await impl::await_shared(std::move(l), std::move(w));
}

net::awaitable<redis_exec_result> redis_client::async_exec_asking(redis_args args) {
    auto& self = impl_;
    if (!self->is_ready()) {
        return impl::failed(errc::unavailable);
    }
    static constexpr std::string_view asking[] = {"ASKING"};
    const std::array<redis_args, 2> both{asking, args};
    return self->exec_on(self->current, both);
}

net::awaitable<bool> redis_client::async_wait_ready(std::chrono::milliseconds timeout) {
    auto self = impl_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!self->is_ready() && !self->stopped && std::chrono::steady_clock::now() < deadline) {
        co_await self->wait_state_change(deadline);
    }
    co_return self->is_ready();
}

bool redis_client::ready() const noexcept {
    return impl_->is_ready();
}

std::uint64_t redis_client::connect_count() const noexcept {
    return impl_->connects;
}

std::uint64_t redis_client::attempt_count() const noexcept {
    return impl_->attempts;
}

std::uint64_t redis_client::write_count() const noexcept {
    return impl_->writes;
}

const redis_connect_report& redis_client::last_failure() const noexcept {
    return impl_->last_failure;
}

} // namespace onceproxy::redis
