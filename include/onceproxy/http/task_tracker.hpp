#pragma once
// The coroutines one worker must see end before it stops: client sessions, and exchanges that
// go on completing their record after their client was answered. A drain joins them under a
// deadline (async_join) instead of polling counters. One tracker per worker, used only from
// that worker's executor.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstddef>

namespace onceproxy::http {

class task_tracker {
public:
    /// Held by a tracked coroutine for as long as it runs (moved into its frame).
    class token {
    public:
        token() = default;
        token(token&& other) noexcept : t_(other.t_) { other.t_ = nullptr; }
        token& operator=(token&&) = delete;
        token(const token&) = delete;
        token& operator=(const token&) = delete;
        ~token();

    private:
        friend class task_tracker;
        explicit token(task_tracker& t) noexcept : t_(&t) { ++t.active_; }
        task_tracker* t_ = nullptr;
    };

    task_tracker() = default;
    task_tracker(const task_tracker&) = delete;
    task_tracker& operator=(const task_tracker&) = delete;
    ~task_tracker();

    /// Tracks the coroutine that keeps the token.
    token enter() noexcept { return token(*this); }

    /// Tracked coroutines still running.
    std::size_t active() const noexcept { return active_; }

    /// Returns when no tracked coroutine is left (true) or at `deadline` (false), whichever
    /// comes first. One joiner at a time.
    boost::asio::awaitable<bool> async_join(std::chrono::steady_clock::time_point deadline);

private:
    class waiter;
    void leave() noexcept;

    std::size_t active_ = 0;
    waiter* waiter_ = nullptr; ///< the join in progress, woken when the last token goes
};

} // namespace onceproxy::http
