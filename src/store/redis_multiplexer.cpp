#include "store/redis_multiplexer.hpp"

#include "onceproxy/store/error.hpp"

#include <hiredis/hiredis.h>

namespace onceproxy::store {

namespace {

// RESP encoding of one command through hiredis; false only if hiredis cannot allocate.
bool append_command(std::string& out, const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    argv.reserve(args.size());
    lens.reserve(args.size());
    for (const auto& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
    }
    char* cmd = nullptr;
    const int len =
        redisFormatCommandArgv(&cmd, static_cast<int>(args.size()), argv.data(), lens.data());
    if (len < 0 || cmd == nullptr) {
        return false;
    }
    out.append(cmd, static_cast<std::size_t>(len));
    redisFreeCommand(cmd);
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
    }
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
    for (auto& r : fifo) {
        finish(*r, why);
    }
}

} // namespace onceproxy::store
