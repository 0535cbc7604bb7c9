#pragma once
// The retry budget and circuit breaker of each upstream egress routes call, shared by every
// worker (a budget per worker would let N workers retry N times as much). Kept by upstream
// name across reloads; a reload changes their settings, not their counts.

#include "onceproxy/egress/circuit_breaker.hpp"
#include "onceproxy/egress/retry_budget.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace onceproxy::egress {

/// One upstream's budget and breaker. Any thread: each call takes its lock briefly.
class upstream_guard {
public:
    using time_point = std::chrono::steady_clock::time_point;

    upstream_guard(const config::retry_budget_config& b, const config::breaker_config& c)
        : budget_(b), breaker_(c) {}

    void configure(const config::retry_budget_config& b, const config::breaker_config& c) {
        std::lock_guard lk(mutex_);
        budget_.configure(b);
        breaker_.configure(c);
    }
    circuit_breaker::admission admit(time_point now) {
        std::lock_guard lk(mutex_);
        return breaker_.admit(now);
    }
    std::optional<breaker_state> on_result(bool failed, bool probe, time_point now) {
        std::lock_guard lk(mutex_);
        return breaker_.on_result(failed, probe, now);
    }
    void on_abandoned(bool probe) {
        std::lock_guard lk(mutex_);
        breaker_.on_abandoned(probe);
    }
    void on_request(time_point now) {
        std::lock_guard lk(mutex_);
        budget_.on_request(now);
    }
    bool try_retry(time_point now) {
        std::lock_guard lk(mutex_);
        return budget_.try_retry(now);
    }
    breaker_state state() {
        std::lock_guard lk(mutex_);
        return breaker_.state();
    }

private:
    std::mutex mutex_;
    retry_budget budget_;
    circuit_breaker breaker_;
};

/// Every upstream's guard, by name. Any thread.
class upstream_guards {
public:
    /// The guard of upstream `name`, made on first use, else given these settings (a reload).
    std::shared_ptr<upstream_guard> of(std::string_view name,
                                       const config::retry_budget_config& budget,
                                       const config::breaker_config& breaker) {
        std::lock_guard lk(mutex_);
        auto it = guards_.find(name);
        if (it == guards_.end()) {
            it = guards_
                     .emplace(std::string(name), std::make_shared<upstream_guard>(budget, breaker))
                     .first;
        } else {
            it->second->configure(budget, breaker);
        }
        return it->second;
    }

private:
    std::mutex mutex_;
    std::map<std::string, std::shared_ptr<upstream_guard>, std::less<>> guards_;
};

} // namespace onceproxy::egress
