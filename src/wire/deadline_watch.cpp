#include "onceproxy/wire/deadline_watch.hpp"

#include <utility>

namespace onceproxy::wire {

namespace net = boost::asio;

struct deadline_watch::state {
    explicit state(net::any_io_executor ex, clock::duration t) : timer(std::move(ex)), tick(t) {}
    net::steady_timer timer;
    clock::duration tick;
    std::list<entry> entries;
    bool running = false;
    lag_sink on_lag;
    lag_meter lag;

    static void arm(const std::shared_ptr<state>& self) {
        self->timer.expires_after(self->tick);
        self->timer.async_wait([self](const boost::system::error_code& ec) {
            if (ec || !self->running) {
                return;
            }
            const auto now = clock::now();
            const auto worst = self->lag.note(now, now - self->timer.expiry());
            for (auto& e : self->entries) {
                // Every tick, not once: an operation started after a cancel that found nothing
                // pending (a read completing in the same loop turn) must not escape its
                // deadline.
                if (e.deadline <= now) {
                    e.fired = true;
                    boost::system::error_code ignored;
                    e.socket->cancel(ignored); // pending operations end with operation_aborted
                }
            }
            arm(self);
            if (self->on_lag) {
                self->on_lag(self->timer.expiry(), worst);
            }
        });
    }
};

deadline_watch::deadline_watch(net::any_io_executor ex, clock::duration tick)
    : state_(std::make_shared<state>(std::move(ex), tick)) {}

deadline_watch::~deadline_watch() {
    stop();
}

void deadline_watch::report_lag(lag_sink sink) {
    state_->on_lag = std::move(sink);
}

void deadline_watch::start() {
    if (!state_->running) {
        state_->running = true;
        state_->lag.start(clock::now());
        state::arm(state_);
        if (state_->on_lag) {
            state_->on_lag(state_->timer.expiry(), std::nullopt);
        }
    }
}

void deadline_watch::stop() {
    state_->running = false;
    state_->timer.cancel();
}

deadline_watch::slot::slot(deadline_watch& w, net::ip::tcp::socket& s)
    : state_(w.state_), it_(state_->entries.insert(state_->entries.end(), entry{&s})) {}

deadline_watch::slot::slot(slot&& o) noexcept : state_(std::move(o.state_)), it_(o.it_) {}

deadline_watch::slot& deadline_watch::slot::operator=(slot&& o) noexcept {
    if (this != &o) {
        if (state_) {
            state_->entries.erase(it_);
        }
        state_ = std::move(o.state_);
        it_ = o.it_;
    }
    return *this;
}

deadline_watch::slot::~slot() {
    if (state_) {
        state_->entries.erase(it_);
    }
}

} // namespace onceproxy::wire
