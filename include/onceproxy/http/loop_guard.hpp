#pragma once
// What keeps an event loop serving when something goes wrong that a request cannot be blamed
// for: a failed accept (out of descriptors, ENOBUFS, ...) and an exception escaping a handler.
// Ending the accept loop or the thread instead would leave a listener dead for good while the
// process looks alive (a dead admin listener gets a healthy pod killed by its probes; a dead
// worker loses the memory store's records with the process).

#include "onceproxy/metrics/registry.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/system/error_code.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string_view>

namespace onceproxy::http {

/// Back-off of an accept loop: 10 ms after the first failure, doubling up to 1 s; a successful
/// accept resets it. Also keeps the log to one line per second per listener during a storm.
class accept_backoff {
public:
    /// The wait before the next accept; logs `ec` (at most once a second) as a failure of
    /// `listener`.
    std::chrono::milliseconds on_error(std::string_view listener,
                                       const boost::system::error_code& ec);

    /// A connection was accepted: the next failure waits the shortest time again.
    void reset() noexcept { delay_ = std::chrono::milliseconds(0); }

private:
    std::chrono::milliseconds delay_{0};
    std::chrono::steady_clock::time_point last_log_{};
};

/// Completion of a spawned coroutine (co_spawn): a non-null `e` is a bug in the proxy; it is
/// logged with `what` and counted in `errors`, and the loop goes on.
void report_exception(std::exception_ptr e, std::string_view what,
                      metrics::counter_ref errors) noexcept;

/// Runs `ioc` until it runs out of work or is stopped. An exception thrown out of a handler
/// is logged and counted in `errors`, and the loop resumes (Asio allows run() to be called
/// again after a handler threw, without restart()).
void run_guarded(boost::asio::io_context& ioc, std::string_view name,
                 metrics::counter_ref errors) noexcept;

} // namespace onceproxy::http
