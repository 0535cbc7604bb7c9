#pragma once
// The pipeline of one Redis connection, without I/O (modelled on Boost.Redis's multiplexer):
// the FIFO of requests, which of them are written and which still wait in the write buffer,
// and the matching of replies to requests in order. The socket code around it only moves
// bytes: take_write() gives what to write, on_read() takes what was read.
//
// Rules (RESP2):
// - Replies come in the order of the requests: the n-th reply answers the n-th written request.
// - Pub/sub: only a connection given a push handler (set_push_handler: a SUBSCRIBE connection)
//   takes messages (["message", channel, payload], ["pmessage", pattern, channel, payload]);
//   they go to the handler in order of arrival and answer no request. On a data connection
//   nothing is subscribed, and such an array is an ordinary reply.
// - A reply when no written request waits, or bytes that are not RESP, make a stream we can no
//   longer match: the multiplexer fails everything as a lost connection would
//   (errc::unavailable; `written` tells whether a request may have run) and the connection
//   must be closed.
// - A request whose deadline passes (on_timeout) fails with errc::timeout; a reply that late
//   could no longer be matched with certainty against a server that may be stuck, so every
//   other request fails with errc::unavailable and the connection must be closed.
// - A request whose issuer went away (abandon) keeps its place: its late reply is read and
//   dropped, and the replies after it still reach their requests.
// - Error replies (-ERR, -MOVED, -ASK, -NOSCRIPT ...) are replies: they complete their request
//   and leave the connection usable.
// - Shared WAITs (durability replicated, join_wait): a WAIT counts what its connection wrote
//   before it, and Redis serves a connection's later commands only once its WAIT returns. So
//   at most one WAIT is unanswered at a time; commands added meanwhile join the next one, held
//   back and added when the unanswered one is answered (or fails). One WAIT then answers a
//   whole group, and while replicas lag a connection spends one wait timeout per group rather
//   than one per command.
//
// Single-threaded, no clock reads: deadlines are the caller's (for_each_open, on_timeout).

#include "onceproxy/redis/redis_args.hpp"
#include "onceproxy/redis/redis_reply.hpp"
#include "redis/resp_reader.hpp"

#include <boost/system/error_code.hpp>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace onceproxy::redis {

/// One command in a pipeline, shared by its issuer and the multiplexer.
struct redis_request {
    enum class state {
        held,    ///< a shared WAIT not added yet: waits for the WAIT ahead of it (join_wait)
        queued,  ///< encoded in the write buffer, not handed to a write yet
        written, ///< handed to a write: may have reached Redis, awaiting its reply
        done,    ///< finished: `ec` empty with `reply`, or a failure in `ec`
    };
    state st = state::queued;
    /// True once the command was handed to a write (so it may have run on Redis), even if it
    /// failed afterwards. A failed request with written == false certainly had no effect.
    bool written = false;
    boost::system::error_code ec;
    redis_reply reply;
    /// Called once when the request becomes done (the I/O shell wakes the issuer with it).
    std::function<void()> on_done;

    bool done() const noexcept { return st == state::done; }
};

class redis_multiplexer {
public:
    enum class read_status {
        ok,          ///< every complete reply was matched; the rest waits for more bytes
        protocol,    ///< malformed bytes: everything failed (errc::unavailable); close
        unsolicited, ///< a reply nobody asked for: everything failed (errc::unavailable); close
        closed,      ///< the multiplexer was closed before: the bytes were ignored
    };

    /// Encodes `args` (`args[0]` the command name; binary-safe) into the write buffer (the
    /// bytes are not used after the call) and appends the request to the FIFO. Requests added one
    /// after another leave back to back, in that order, in one write (ASKING + command relies on
    /// it). False, with `req` failed (errc::protocol), if the command cannot be encoded; false with
    /// errc::unavailable once the multiplexer is closed.
    bool add(const std::shared_ptr<redis_request>& req, redis_args args);

    /// durability replicated: the WAIT (`wait`, e.g. {"WAIT", "1", "50"}) that will follow
    /// every request added so far. With no WAIT unanswered it is added now (`make` creates
    /// the request); otherwise it is the next one, held (state::held) until the unanswered
    /// WAIT is answered or fails, and shared by everyone who joins meanwhile with the same
    /// `wait`. A different `wait` gets a WAIT of its own, added now. Null once closed. The
    /// request completes as any other: its reply, or the failure of the connection.
    std::shared_ptr<redis_request>
    join_wait(redis_args wait, const std::function<std::shared_ptr<redis_request>()>& make);

    /// True when add() queued bytes that no take_write() took yet.
    bool has_unwritten() const noexcept { return !wbuf_.empty(); }

    /// Moves the bytes of every queued request into `out` (cleared first) and marks those
    /// requests written. `out` is empty when nothing was queued.
    void take_write(std::string& out);

    /// Bytes read from the connection: completes the written requests whose replies are whole,
    /// and hands pub/sub messages to the push handler, if one is set.
    read_status on_read(const char* data, std::size_t n);

    /// Subscriber connections: `on_push` receives each pub/sub message (see the rules above),
    /// called from on_read. It may close() the multiplexer; on_read then stops.
    void set_push_handler(std::function<void(redis_reply)> on_push) {
        on_push_ = std::move(on_push);
    }

    /// True for a pub/sub message: ["message", channel, payload] or ["pmessage", pattern,
    /// channel, payload].
    static bool is_push(const redis_reply& r) noexcept;

    /// The deadline of `req` passed before its reply: `req` fails with errc::timeout, every
    /// other request with errc::unavailable, and the multiplexer closes (close the connection).
    /// Nothing happens if `req` is already done.
    void on_timeout(const std::shared_ptr<redis_request>& req);

    /// The issuer of `req` no longer waits (its coroutine was cancelled): `req` is done with
    /// `why`; its place in the FIFO stays so that its reply, if it comes, is dropped.
    void abandon(const std::shared_ptr<redis_request>& req, boost::system::error_code why);

    /// Fails every request not done yet with `why` and refuses further work. Idempotent.
    void close(boost::system::error_code why);

    bool closed() const noexcept { return closed_; }

    /// Calls `f(request)` for every request not done yet, in wire order, a held WAIT last: for
    /// the I/O shell's deadline checks.
    template <class F>
    void for_each_open(F&& f) const {
        for (const auto& r : fifo_) {
            if (!r->done()) {
                f(r);
            }
        }
        if (wait_held_ && !wait_held_->done()) {
            f(wait_held_);
        }
    }

    /// Requests whose reply has not been read yet (abandoned ones included).
    std::size_t in_flight() const noexcept { return fifo_.size(); }
    /// The requests of in_flight() that are still in the write buffer.
    std::size_t unwritten() const noexcept { return unwritten_; }

private:
    static void finish(redis_request& r, boost::system::error_code ec);
    // `r` finished: when it was the unanswered WAIT, adds the held one.
    void wait_answered(const redis_request& r);

    resp_reader reader_;
    std::function<void(redis_reply)> on_push_;
    std::string wbuf_;
    std::deque<std::shared_ptr<redis_request>> fifo_; // awaiting a reply, in wire order
    std::size_t unwritten_ = 0;                       // the last `unwritten_` of fifo_
    std::shared_ptr<redis_request> wait_sent_;        // the unanswered shared WAIT
    std::shared_ptr<redis_request> wait_held_;        // the next one (state::held)
    std::vector<std::string> wait_held_args_;
    bool closed_ = false;
};

} // namespace onceproxy::redis
