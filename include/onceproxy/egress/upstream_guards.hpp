#pragma once
// The retry budget and circuit breaker of each upstream egress routes call, shared by every
// worker (a budget per worker would let N workers retry N times as much). Kept by upstream
// name across reloads; a reload changes their settings, not their counts.

#include "onceproxy/egress/circuit_breaker.hpp"
#include "onceproxy/egress/retry_budget.hpp"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace onceproxy::egress {

/// Told of every change of a breaker's state, under the guard's lock (so the changes of one
/// upstream arrive in their order): the metrics.
using breaker_observer = std::function<void(breaker_state)>;

/// One upstream's budget and breaker. Any thread: each call takes its lock briefly.
class upstream_guard {
public:
    using time_point = std::chrono::steady_clock::time_point;

    upstream_guard(const config::retry_budget_config& b, const config::breaker_config& c,
                   breaker_observer o)
        : budget_(b), breaker_(c), observer_(std::move(o)) {}

    void configure(const config::retry_budget_config& b, const config::breaker_config& c) {
        std::lock_guard lk(mutex_);
        const auto before = breaker_.state();
        budget_.configure(b);
        breaker_.configure(c);
        if (breaker_.state() != before) {
            tell(breaker_.state());
        }
    }
    circuit_breaker::admission admit(time_point now) {
        std::lock_guard lk(mutex_);
        auto a = breaker_.admit(now);
        if (a.became) {
            tell(*a.became);
        }
        return a;
    }
    /// How an admitted attempt ended (circuit_breaker::on_result).
    void on_result(bool failed, bool probe, time_point now) {
        std::lock_guard lk(mutex_);
        if (const auto became = breaker_.on_result(failed, probe, now)) {
            tell(*became);
        }
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
    void tell(breaker_state s) {
        if (observer_) {
            observer_(s);
        }
    }

    std::mutex mutex_;
    retry_budget budget_;
    circuit_breaker breaker_;
    breaker_observer observer_;
};

/// Every upstream's guard, by name. Any thread.
class upstream_guards {
public:
    /// The guard of upstream `name`, made on first use (its breaker closed; `observer` is told
    /// of its changes), else given these settings (a reload).
    std::shared_ptr<upstream_guard> of(std::string_view name,
                                       const config::retry_budget_config& budget,
                                       const config::breaker_config& breaker,
                                       const breaker_observer& observer) {
        std::lock_guard lk(mutex_);
        auto it = guards_.find(name);
        if (it == guards_.end()) {
            it = guards_
                     .emplace(std::string(name),
                              std::make_shared<upstream_guard>(budget, breaker, observer))
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
