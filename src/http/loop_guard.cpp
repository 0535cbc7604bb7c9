#include "onceproxy/http/loop_guard.hpp"

#include <algorithm>
#include <cstdio>

namespace onceproxy::http {

std::chrono::milliseconds accept_backoff::on_error(std::string_view listener,
                                                   const boost::system::error_code& ec) {
    using namespace std::chrono_literals;
    delay_ = delay_.count() == 0 ? 10ms : std::min<std::chrono::milliseconds>(delay_ * 2, 1s);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log_ >= 1s) {
        last_log_ = now;
        std::fprintf(stderr, "onceproxy: %.*s listener: accept failed: %s; retrying in %lld ms\n",
                     static_cast<int>(listener.size()), listener.data(), ec.message().c_str(),
                     static_cast<long long>(delay_.count()));
    }
    return delay_;
}

void report_exception(std::exception_ptr e, std::string_view what,
                      std::atomic<std::uint64_t>& errors) noexcept {
    if (!e) {
        return;
    }
    errors.fetch_add(1, std::memory_order_relaxed);
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "onceproxy: %.*s failed: %s\n", static_cast<int>(what.size()),
                     what.data(), ex.what());
    } catch (...) {
        std::fprintf(stderr, "onceproxy: %.*s failed: unknown exception\n",
                     static_cast<int>(what.size()), what.data());
    }
}

void run_guarded(boost::asio::io_context& ioc, std::string_view name,
                 std::atomic<std::uint64_t>& errors) noexcept {
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
