#pragma once
// Failed bearer-token attempts per client address (admin keys API, issue 26): each address may
// fail `burst` times at once, then once per `refill`; beyond that it is refused (429) without
// its token being compared, so a token cannot be guessed at network speed. A generic cell rate
// algorithm: one time point per address (when its budget is full again). Pure: `now` is an
// input; the caller keeps it on one thread.

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>

namespace onceproxy::http {

class auth_throttle {
public:
    using clock = std::chrono::steady_clock;

    /// `burst` failures allowed at once (at least 1), then one per `refill`. At most
    /// `max_addresses` addresses are told apart; beyond them, new addresses share one budget.
    auth_throttle(unsigned burst, clock::duration refill, std::size_t max_addresses) noexcept
        : burst_(burst == 0 ? 1 : burst), refill_(refill), max_addresses_(max_addresses) {}

    /// Zero when `address` may try now; else how long it has to wait.
    clock::duration retry_after(std::string_view address, clock::time_point now) const {
        const auto it = full_at_.find(slot(address));
        if (it == full_at_.end()) {
            return clock::duration::zero();
        }
        // Allowed while the budget already used leaves room for one more failure.
        const auto used = it->second - now;
        const auto room = refill_ * (burst_ - 1);
        return used > room ? used - room : clock::duration::zero();
    }

    /// `address` sent a wrong token at `now`.
    void note_failure(std::string_view address, clock::time_point now) {
        if (full_at_.size() >= max_addresses_ && !full_at_.contains(std::string(address))) {
            forget_recovered(now);
        }
        auto& full = full_at_[slot(address)];
        full = (full > now ? full : now) + refill_;
    }

    /// Addresses tracked now (bounded by max_addresses + 1).
    std::size_t size() const noexcept { return full_at_.size(); }

private:
    static constexpr std::string_view shared_slot = "*"; ///< no address looks like this

    /// The map key of `address`: itself, or the shared slot once the map is full.
    std::string slot(std::string_view address) const {
        std::string key(address);
        if (full_at_.size() >= max_addresses_ && !full_at_.contains(key)) {
            return std::string(shared_slot);
        }
        return key;
    }

    /// Drops the addresses whose budget is full again (they are like new ones).
    void forget_recovered(clock::time_point now) {
        std::erase_if(full_at_, [now](const auto& e) { return e.second <= now; });
    }

    unsigned burst_;
    clock::duration refill_;
    std::size_t max_addresses_;
    std::unordered_map<std::string, clock::time_point> full_at_;
};

} // namespace onceproxy::http
