#include "onceproxy/http/loop_guard.hpp"

#include "onceproxy/log/log.hpp"

#include <algorithm>

namespace onceproxy::http {

std::chrono::milliseconds accept_backoff::on_error(std::string_view listener,
                                                   const boost::system::error_code& ec) {
    using namespace std::chrono_literals;
    delay_ = delay_.count() == 0 ? 10ms : std::min<std::chrono::milliseconds>(delay_ * 2, 1s);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log_ >= 1s) {
        last_log_ = now;
        log::error("http", "accept failed; retrying",
                   {{"listener", listener},
                    {"error", ec.message()},
                    {"retry_in_ms", static_cast<std::int64_t>(delay_.count())}});
    }
    return delay_;
}

void report_exception(std::exception_ptr e, std::string_view what,
                      metrics::counter_ref errors) noexcept {
    if (!e) {
        return;
    }
    errors.inc();
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        log::error("http", "unhandled exception", {{"in", what}, {"error", ex.what()}});
    } catch (...) {
        log::error("http", "unhandled exception",
                   {{"in", what}, {"error", "not a std::exception"}});
    }
}

void run_guarded(boost::asio::io_context& ioc, std::string_view name,
                 metrics::counter_ref errors) noexcept {
    for (;;) {
        try {
            ioc.run();
            return;
        } catch (...) {
            report_exception(std::current_exception(), name, errors);
        }
    }
}

} // namespace onceproxy::http
