#pragma once
// Process-wide release signals for held event streams (X-Test-Events + X-Test-Stream-Id), shared
// by every worker thread: `POST /__release?id=ID` on any connection lets the stream ID send its
// next event. A test uses it to prove that an event reached it while the upstream was still
// writing, with no timing assumption.

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace onceproxy::test_upstream {

/// Per stream id: releases not yet consumed, and the timer of the stream waiting for one (if
/// any). A release that arrives before the stream waits is kept, so no signal is lost.
class stream_releases {
public:
    /// Records one release of `id`; wakes the stream waiting on it, on that stream's executor.
    /// Returns true when a stream was waiting.
    bool release(std::string const& id) {
        std::lock_guard lock(mutex_);
        auto& e = entries_[id];
        ++e.pending;
        if (!e.waiter)
            return false;
        // The timer belongs to another thread's io_context: cancel it there. The shared_ptr keeps
        // it alive if the stream ends before the handler runs.
        boost::asio::post(e.waiter->get_executor(), [timer = e.waiter] { timer->cancel(); });
        return true;
    }

    /// Consumes one release of `id` if there is one (true). Otherwise registers `timer` to be
    /// cancelled by the next release and returns false; the caller then waits on `timer`.
    bool take(std::string const& id, std::shared_ptr<boost::asio::steady_timer> const& timer) {
        std::lock_guard lock(mutex_);
        auto& e = entries_[id];
        if (e.pending > 0) {
            --e.pending;
            e.waiter.reset();
            if (e.pending == 0)
                entries_.erase(id);
            return true;
        }
        e.waiter = timer;
        return false;
    }

    /// The stream `id` stops waiting (it timed out or ended).
    void forget(std::string const& id) {
        std::lock_guard lock(mutex_);
        auto it = entries_.find(id);
        if (it == entries_.end())
            return;
        it->second.waiter.reset();
        if (it->second.pending == 0)
            entries_.erase(it);
    }

private:
    struct entry {
        std::uint64_t pending = 0;
        std::shared_ptr<boost::asio::steady_timer> waiter;
    };
    std::mutex mutex_;
    std::map<std::string, entry, std::less<>> entries_;
};

} // namespace onceproxy::test_upstream
