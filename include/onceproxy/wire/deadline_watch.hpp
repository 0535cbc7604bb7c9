#pragma once
// Coarse per-worker I/O deadlines. Every socket of a worker registers here once; before an
// operation the owner moves the socket's deadline (a plain store, no system call), and a
// single worker timer that ticks every `tick` cancels the pending operations of sockets whose
// deadline has passed. Compared with Beast's tcp_stream, which arms and cancels a timer for
// every read and write, this takes the timer queue (and its timerfd updates) off the hot path.
// expires_after reads the coarse clock (coarse_now, no hardware counter read: it runs before
// every read and write of every socket), so a deadline lands up to two jiffies (coarse_margin,
// 2-20 ms) after the precise now + d, never before it (coarse_clock.hpp says when the kernel
// can break that); the tick then fires it up to one tick later. A deadline thus fires up to
// two jiffies plus one tick late, never early, which timeouts measured in seconds do not
// notice. How late the tick itself runs is the worker's event-loop lag (report_lag).
//
// Single-threaded: everything runs on the worker's executor.

#include "onceproxy/wire/coarse_clock.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <optional>

namespace onceproxy::wire {

/// Event-loop lag: how late a periodic tick ran, reduced to the largest lateness per window.
class lag_meter {
public:
    using clock = std::chrono::steady_clock;

    explicit lag_meter(clock::duration window = std::chrono::seconds(1)) : window_(window) {}

    /// Starts the first window at `now`.
    void start(clock::time_point now) {
        since_ = now;
        max_ = {};
    }
    /// A tick ran at `now`, `late` after it was due. Once the window is over: its largest
    /// lateness (this tick's included), and the next window starts at `now`.
    std::optional<clock::duration> note(clock::time_point now, clock::duration late) {
        max_ = std::max(max_, late);
        if (now - since_ < window_) {
            return std::nullopt;
        }
        const auto out = max_;
        start(now);
        return out;
    }

private:
    clock::duration window_;
    clock::time_point since_{};
    clock::duration max_{};
};

class deadline_watch {
public:
    using clock = std::chrono::steady_clock;

    struct entry {
        boost::asio::ip::tcp::socket* socket = nullptr;
        clock::time_point deadline = clock::time_point::max();
        bool fired = false; ///< the watch cancelled this socket's operations
    };

    struct state; ///< the entry list and the tick timer, shared with every slot

    /// A socket's registration; unregisters on destruction.
    class slot {
    public:
        slot() = default;
        slot(deadline_watch& w, boost::asio::ip::tcp::socket& s);
        slot(slot&& o) noexcept;
        slot& operator=(slot&& o) noexcept;
        ~slot();

        /// The next operations must finish within `d` from now (from coarse_now(): not before
        /// `d` has passed, up to coarse_margin() after).
        void expires_after(clock::duration d) {
            it_->deadline = coarse_now() + d;
            it_->fired = false;
        }
        void expires_at(clock::time_point t) {
            it_->deadline = t;
            it_->fired = false;
        }
        /// No deadline (an idle pooled connection, a session waiting for its upstream).
        void disarm() { it_->deadline = clock::time_point::max(); }
        /// True when the last failure came from the deadline, not from the peer.
        bool fired() const { return it_->fired; }

    private:
        std::shared_ptr<state> state_; ///< keeps the list alive for frames destroyed late
        std::list<entry>::iterator it_;
    };

    explicit deadline_watch(boost::asio::any_io_executor ex,
                            clock::duration tick = std::chrono::milliseconds(50));
    ~deadline_watch();
    deadline_watch(const deadline_watch&) = delete;
    deadline_watch& operator=(const deadline_watch&) = delete;

    /// Event-loop lag. `sink` is called at every tick (and at start) with when the next tick
    /// is due (a loop blocked past it shows as overdue) and, once a second, the largest
    /// lateness of a tick over that second (lag_meter: how long the tick, due, waited behind
    /// other handlers). Call before start().
    using lag_sink = std::function<void(clock::time_point next_due,
                                        std::optional<clock::duration> window_worst)>;
    void report_lag(lag_sink sink);
    /// Starts the tick loop (call once on the worker).
    void start();
    /// Ends the tick loop.
    void stop();

private:
    std::shared_ptr<state> state_;
};

} // namespace onceproxy::wire
