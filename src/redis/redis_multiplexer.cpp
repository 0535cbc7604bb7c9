#include "redis/redis_multiplexer.hpp"

#include "onceproxy/redis/error.hpp"

#include <cstring>
#include <string_view>
#include <utility>

namespace onceproxy::redis {

namespace {

// How many decimal digits `n` has.
std::size_t decimal_width(std::size_t n) {
    std::size_t w = 1;
    while (n >= 10) {
        n /= 10;
        ++w;
    }
    return w;
}

// Writes `n` in decimal (`width` digits, from decimal_width) at `at`; returns the end.
char* put_decimal(char* at, std::size_t n, std::size_t width) {
    char* p = at + width;
    do {
        *--p = static_cast<char>('0' + n % 10);
        n /= 10;
    } while (n != 0);
    return at + width;
}

char* put_bytes(char* at, std::string_view s) {
    if (!s.empty()) {
        std::memcpy(at, s.data(), s.size());
    }
    return at + s.size();
}

// RESP encoding of one command (an array of bulk strings, binary-safe), appended to `out` in
// one pass: sized exactly, grown once, written in place, no formatted printing. Always
// succeeds (the bool keeps the multiplexer's "not encodable" path for a future encoder that
// can fail).
bool append_command(std::string& out, const std::vector<std::string>& args) {
    const std::size_t count_width = decimal_width(args.size());
    std::size_t size = 1 + count_width + 2;
    for (const auto& a : args) {
        size += 1 + decimal_width(a.size()) + 2 + a.size() + 2;
    }
    const std::size_t at = out.size();
    out.resize(at + size);
    char* w = out.data() + at;
    *w++ = '*';
    w = put_decimal(w, args.size(), count_width);
    w = put_bytes(w, "\r\n");
    for (const auto& a : args) {
        *w++ = '$';
        w = put_decimal(w, a.size(), decimal_width(a.size()));
        w = put_bytes(w, "\r\n");
        w = put_bytes(w, a);
        w = put_bytes(w, "\r\n");
    }
    return true;
}

} // namespace

void redis_multiplexer::finish(redis_request& r, boost::system::error_code ec) {
    if (r.done()) {
        return;
    }
    r.st = redis_request::state::done;
    r.ec = ec;
    if (r.on_done) {
        auto notify = std::move(r.on_done);
        r.on_done = nullptr;
        notify();
    }
}

bool redis_multiplexer::add(const std::shared_ptr<redis_request>& req,
                            const std::vector<std::string>& args) {
    if (closed_) {
        finish(*req, errc::unavailable);
        return false;
    }
    if (args.empty() || !append_command(wbuf_, args)) {
        finish(*req, errc::protocol);
        return false;
    }
    req->st = redis_request::state::queued;
    fifo_.push_back(req);
    ++unwritten_;
    return true;
}

std::shared_ptr<redis_request>
redis_multiplexer::join_wait(const std::vector<std::string>& wait,
                             const std::function<std::shared_ptr<redis_request>()>& make) {
    if (closed_) {
        return nullptr;
    }
    if (wait_held_ && wait_held_args_ == wait) {
        return wait_held_;
    }
    auto r = make();
    if (!wait_sent_) {
        if (add(r, wait)) { // a WAIT that could not be added (failed) holds nothing back
            wait_sent_ = r;
        }
    } else if (!wait_held_) {
        r->st = redis_request::state::held;
        wait_held_ = r;
        wait_held_args_ = wait;
    } else {
        add(r, wait); // another WAIT command than the held one's: its own, now
    }
    return r;
}

void redis_multiplexer::wait_answered(const redis_request& r) {
    if (wait_sent_.get() != &r) {
        return;
    }
    wait_sent_ = std::exchange(wait_held_, nullptr);
    if (wait_sent_) {
        auto args = std::move(wait_held_args_);
        wait_held_args_.clear();
        if (!add(wait_sent_, args)) { // failed (closed): nothing to wait behind
            wait_sent_ = nullptr;
        }
    }
}

void redis_multiplexer::take_write(std::string& out) {
    out.clear();
    std::swap(out, wbuf_);
    // Conservative: from here the commands may reach Redis (a lost claim must be resolved by
    // reading the owner, never retried blindly).
    for (std::size_t i = fifo_.size() - unwritten_; i < fifo_.size(); ++i) {
        auto& r = *fifo_[i];
        r.written = true;
        if (!r.done()) {
            r.st = redis_request::state::written;
        }
    }
    unwritten_ = 0;
}

redis_multiplexer::read_status redis_multiplexer::on_read(const char* data, std::size_t n) {
    if (closed_) {
        return read_status::closed;
    }
    // On a broken stream every request fails as on a lost connection (errc::unavailable): a
    // written one may have run, and its issuer resolves that as after a disconnect.
    if (reader_.feed(data, n) == resp_reader::status::protocol_error) {
        close(errc::unavailable);
        return read_status::protocol;
    }
    for (;;) {
        redis_reply reply;
        const auto st = reader_.next(reply);
        if (st == resp_reader::status::protocol_error) {
            // The reader is unusable after a protocol error: only a new connection helps.
            close(errc::unavailable);
            return read_status::protocol;
        }
        if (st == resp_reader::status::need_more) {
            return read_status::ok;
        }
        if (on_push_ && is_push(reply)) {
            // A message answers no request: it may arrive between a command and its reply
            // (a PING of the health check).
            on_push_(std::move(reply));
            if (closed_) {
                return read_status::closed;
            }
            continue;
        }
        if (fifo_.size() == unwritten_) {
            // A reply nobody asked for: the stream can no longer be matched.
            close(errc::unavailable);
            return read_status::unsolicited;
        }
        auto r = std::move(fifo_.front());
        fifo_.pop_front();
        if (!r->done()) {
            r->reply = std::move(reply);
            finish(*r, {});
        }
        wait_answered(*r);
        if (closed_) { // a completion handler closed it
            return read_status::closed;
        }
    }
}

bool redis_multiplexer::is_push(const redis_reply& r) noexcept {
    if (r.type != redis_reply::kind::array || r.elements.empty() ||
        r.elements[0].type != redis_reply::kind::string) {
        return false;
    }
    const auto& kind = r.elements[0].str;
    return (kind == "message" && r.elements.size() == 3) ||
           (kind == "pmessage" && r.elements.size() == 4);
}

void redis_multiplexer::on_timeout(const std::shared_ptr<redis_request>& req) {
    if (req->done()) {
        return;
    }
    finish(*req, errc::timeout);
    close(errc::unavailable);
}

void redis_multiplexer::abandon(const std::shared_ptr<redis_request>& req,
                                boost::system::error_code why) {
    finish(*req, why);
}

void redis_multiplexer::close(boost::system::error_code why) {
    if (closed_) {
        return;
    }
    closed_ = true;
    // Moved out first: a completion handler may add to (a closed) multiplexer.
    auto fifo = std::move(fifo_);
    fifo_.clear();
    unwritten_ = 0;
    wbuf_.clear();
    wait_sent_ = nullptr;
    if (auto held = std::exchange(wait_held_, nullptr)) {
        fifo.push_back(std::move(held)); // never added: it fails with the rest
    }
    for (auto& r : fifo) {
        finish(*r, why);
    }
}

} // namespace onceproxy::redis
