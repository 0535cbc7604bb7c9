#include "redis/redis_multiplexer.hpp"

#include "onceproxy/redis/error.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string_view>
#include <utility>

namespace onceproxy::redis {

namespace {

// The longest `<type><length>\r\n` header: a type byte, 20 digits, CRLF.
constexpr std::size_t max_header = 1 + 20 + 2;

// Writes `<type><n>\r\n` at `at`; returns its end.
char* put_header(char* at, char type, std::size_t n) {
    *at++ = type;
    at = std::to_chars(at, at + 20, n).ptr;
    *at++ = '\r';
    *at++ = '\n';
    return at;
}

// RESP encoding of one command (an array of bulk strings, binary-safe), appended to `out` in
// one pass: grown once (by an upper bound, trimmed after), written in place, no formatted
// printing. Always succeeds (the bool keeps the multiplexer's "not encodable" path for a
// future encoder that can fail).
bool append_command(std::string& out, redis_args args) {
    std::size_t size = max_header;
    for (const auto& a : args) {
        size += max_header + a.size() + 2;
    }
    const std::size_t at = out.size();
    out.resize(at + size);
    char* const begin = out.data();
    char* w = put_header(begin + at, '*', args.size());
    for (const auto& a : args) {
        w = put_header(w, '$', a.size());
        if (!a.empty()) {
            std::memcpy(w, a.data(), a.size());
            w += a.size();
        }
        *w++ = '\r';
        *w++ = '\n';
    }
    out.resize(static_cast<std::size_t>(w - begin));
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

bool redis_multiplexer::add(const std::shared_ptr<redis_request>& req, redis_args args) {
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
redis_multiplexer::join_wait(redis_args wait,
                             const std::function<std::shared_ptr<redis_request>()>& make) {
    if (closed_) {
        return nullptr;
    }
    if (wait_held_ &&
        std::equal(wait_held_args_.begin(), wait_held_args_.end(), wait.begin(), wait.end())) {
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
        wait_held_args_.assign(wait.begin(), wait.end());
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
        const std::vector<std::string_view> args(wait_held_args_.begin(), wait_held_args_.end());
        const bool added = add(wait_sent_, args);
        wait_held_args_.clear();
        if (!added) { // failed (closed): nothing to wait behind
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
