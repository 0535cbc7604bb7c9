#pragma once
// The hand-over of access-log lines from the worker threads to one writer thread (SPEC §6,
// issue 8): a worker formats its line and appends it here, which takes a short lock and never
// waits for stdout; the writer thread takes the pending lines in batches and writes each batch
// with one write(2). The buffer is bounded in bytes: a line that does not fit is refused (the
// caller counts it, metrics::family::access_log_dropped) rather than stalling a worker behind a
// slow log collector or growing without bound.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace onceproxy::http {

/// Bounded, multi-producer, single-consumer buffer of whole lines. Thread-safe.
class access_log_queue {
public:
    /// What became of a pushed line.
    enum class push_result {
        queued, ///< appended; the writer will write it
        full,   ///< refused: it would take the pending bytes past the capacity (a drop)
        closed, ///< refused: the queue was closed (shutdown); the caller writes it itself
    };

    /// `capacity_bytes`: most bytes pending at once (a line longer than that is always refused).
    explicit access_log_queue(std::size_t capacity_bytes) : capacity_(capacity_bytes) {}

    /// Appends `line` whole (the caller ends it with '\n'), or nothing of it. Any thread.
    push_result push(std::string_view line);

    /// Writer side: waits until lines are pending, then up to `linger` more so that a batch
    /// gathers (cut short when half the capacity is pending or the queue closes), and swaps the
    /// pending bytes into `out` (whose previous content is discarded; its storage is reused).
    /// Returns false, with `out` empty, once the queue is closed and nothing is pending.
    bool take(std::string& out, std::chrono::milliseconds linger);

    /// Refuses later pushes; take() hands over what is pending, then returns false.
    void close();

    /// Bytes pending now (for tests).
    std::size_t pending_bytes() const;

private:
    const std::size_t capacity_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::string pending_;
    bool closed_ = false;
    bool writer_waiting_ = false; ///< the writer sleeps until a first line: a push wakes it
};

/// The writer thread of one queue: writes every batch to `fd` with write(2) (whole lines, so
/// the lines of several workers never interleave), until stop().
class access_log_writer {
public:
    access_log_writer(int fd, std::size_t capacity_bytes, std::chrono::milliseconds linger);
    ~access_log_writer();
    access_log_writer(const access_log_writer&) = delete;
    access_log_writer& operator=(const access_log_writer&) = delete;

    /// Hands `line` to the writer. False when the queue is full: the line is dropped. After
    /// stop() the line is written at once, on the caller's thread (nothing is lost).
    bool submit(std::string_view line);

    /// Closes the queue, waits for the writer to write every line queued before, and ends it.
    /// Idempotent.
    void stop();

private:
    void run();

    access_log_queue queue_;
    int fd_;
    std::chrono::milliseconds linger_;
    std::mutex stop_m_;
    std::thread thread_;
};

} // namespace onceproxy::http
