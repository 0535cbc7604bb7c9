#include "http/access_log_queue.hpp"

#include <unistd.h>

namespace onceproxy::http {

namespace {

/// Writes all of `bytes` to `fd`; gives up quietly on an error (a closed stdout never stops
/// the proxy).
void write_all(int fd, std::string_view bytes) {
    const char* p = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
        const auto n = ::write(fd, p, left);
        if (n <= 0) {
            return;
        }
        p += n;
        left -= static_cast<std::size_t>(n);
    }
}

} // namespace

access_log_queue::push_result access_log_queue::push(std::string_view line) {
    bool wake = false;
    {
        std::lock_guard lk(m_);
        if (closed_) {
            return push_result::closed;
        }
        const auto before = pending_.size();
        if (line.size() > capacity_ - before) {
            return push_result::full;
        }
        pending_.append(line);
        // Wake the writer for a first line, or when a lingering batch reaches half the buffer;
        // otherwise it wakes on its own when the linger ends (no wake-up per line).
        const auto half = capacity_ / 2;
        wake = writer_waiting_ || (before < half && pending_.size() >= half);
        writer_waiting_ = false;
    }
    if (wake) {
        cv_.notify_one();
    }
    return push_result::queued;
}

bool access_log_queue::take(std::string& out, std::chrono::milliseconds linger) {
    std::unique_lock lk(m_);
    while (pending_.empty() && !closed_) {
        writer_waiting_ = true;
        cv_.wait(lk);
    }
    writer_waiting_ = false;
    if (!closed_ && linger.count() > 0) {
        const auto half = capacity_ / 2;
        cv_.wait_for(lk, linger, [&] { return closed_ || pending_.size() >= half; });
    }
    out.clear();
    out.swap(pending_);
    return !out.empty() || !closed_;
}

void access_log_queue::close() {
    {
        std::lock_guard lk(m_);
        closed_ = true;
    }
    cv_.notify_all();
}

std::size_t access_log_queue::pending_bytes() const {
    std::lock_guard lk(m_);
    return pending_.size();
}

access_log_writer::access_log_writer(int fd, std::size_t capacity_bytes,
                                     std::chrono::milliseconds linger)
    : queue_(capacity_bytes), fd_(fd), linger_(linger), thread_([this] { run(); }) {}

access_log_writer::~access_log_writer() {
    stop();
}

bool access_log_writer::submit(std::string_view line) {
    switch (queue_.push(line)) {
    case access_log_queue::push_result::queued:
        return true;
    case access_log_queue::push_result::full:
        return false;
    case access_log_queue::push_result::closed:
        break;
    }
    write_all(fd_, line); // after shutdown: no writer thread left to hand it to
    return true;
}

void access_log_writer::stop() {
    std::lock_guard lk(stop_m_);
    queue_.close();
    if (thread_.joinable()) {
        thread_.join();
    }
}

void access_log_writer::run() {
    std::string batch;
    while (queue_.take(batch, linger_)) {
        write_all(fd_, batch);
    }
}

} // namespace onceproxy::http
