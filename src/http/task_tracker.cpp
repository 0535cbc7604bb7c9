#include "onceproxy/http/task_tracker.hpp"

#include "onceproxy/asio/use_tuple.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace onceproxy::http {

namespace net = boost::asio;

/// The timer a join sleeps on, registered with the tracker for as long as the join's frame
/// lives: a frame destroyed unfinished (a loop stopped at shutdown) unregisters it.
class task_tracker::waiter {
public:
    waiter(task_tracker& t, const net::any_io_executor& ex) : t_(t), timer_(ex) {
        t_.waiter_ = this;
    }
    ~waiter() { t_.waiter_ = nullptr; }
    waiter(const waiter&) = delete;
    waiter& operator=(const waiter&) = delete;

    net::steady_timer& timer() noexcept { return timer_; }

private:
    task_tracker& t_;
    net::steady_timer timer_;
};

task_tracker::token::~token() {
    if (t_ != nullptr) {
        t_->leave();
    }
}

task_tracker::~task_tracker() = default;

void task_tracker::leave() noexcept {
    if (--active_ == 0 && waiter_ != nullptr) {
        waiter_->timer().cancel();
    }
}

net::awaitable<bool> task_tracker::async_join(std::chrono::steady_clock::time_point deadline) {
    waiter w(*this, co_await net::this_coro::executor);
    while (active_ > 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
            co_return false;
        }
        w.timer().expires_at(deadline);
        co_await w.timer().async_wait(use_tuple);
    }
    co_return true;
}

} // namespace onceproxy::http
