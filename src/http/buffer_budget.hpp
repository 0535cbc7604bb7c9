#pragma once
// The process-wide budget of buffered bodies (limits.max_buffered_bytes, issue 26): request
// bodies read whole (guarded routes, to fingerprint and record them; egress routes, to send
// them again), upstream answers held for recording (up to max_record_bytes) and egress answers
// count against one counter that every worker shares.
// A reservation is RAII: it grows as its body does and gives everything back when destroyed,
// on every path (answered, refused, client gone, exception).
//
// A request body is admitted only while the budget has room (try_grow_to); an upstream answer
// is counted but never refused (force_grow_to): the upstream has acted on the request, so its
// answer must reach the client and the record. New bodies are refused until it is released.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace onceproxy::http {

class buffer_reservation {
public:
    /// An empty reservation bound to no budget: every grow succeeds and counts nothing.
    buffer_reservation() noexcept = default;
    /// Counts in `used` (bytes held now, all reservations together), bounded by `limit`.
    buffer_reservation(std::atomic<std::int64_t>& used,
                       const std::atomic<std::int64_t>& limit) noexcept
        : used_(&used), limit_(&limit) {}
    buffer_reservation(buffer_reservation&& o) noexcept
        : used_(std::exchange(o.used_, nullptr)), limit_(std::exchange(o.limit_, nullptr)),
          bytes_(std::exchange(o.bytes_, 0)) {}
    buffer_reservation& operator=(buffer_reservation&& o) noexcept {
        if (this != &o) {
            release();
            used_ = std::exchange(o.used_, nullptr);
            limit_ = std::exchange(o.limit_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    buffer_reservation(const buffer_reservation&) = delete;
    buffer_reservation& operator=(const buffer_reservation&) = delete;
    ~buffer_reservation() { release(); }

    /// Holds `total` bytes if that fits the budget with everything else held (growing only:
    /// a smaller `total` changes nothing). False, with nothing changed, when it does not fit.
    bool try_grow_to(std::size_t total) noexcept {
        if (used_ == nullptr || total <= bytes_) {
            return true;
        }
        const auto delta = static_cast<std::int64_t>(total - bytes_);
        const auto limit = limit_->load(std::memory_order_relaxed);
        auto now = used_->load(std::memory_order_relaxed);
        do {
            if (now + delta > limit) {
                return false;
            }
        } while (!used_->compare_exchange_weak(now, now + delta, std::memory_order_relaxed));
        bytes_ = total;
        return true;
    }

    /// Holds `total` bytes whatever the budget says (bytes that are in memory already and may
    /// not be refused); growing only.
    void force_grow_to(std::size_t total) noexcept {
        if (used_ == nullptr || total <= bytes_) {
            return;
        }
        used_->fetch_add(static_cast<std::int64_t>(total - bytes_), std::memory_order_relaxed);
        bytes_ = total;
    }

    /// Gives every byte back; the reservation stays bound and may grow again.
    void release() noexcept {
        if (used_ != nullptr && bytes_ != 0) {
            used_->fetch_sub(static_cast<std::int64_t>(bytes_), std::memory_order_relaxed);
        }
        bytes_ = 0;
    }

    std::size_t bytes() const noexcept { return bytes_; }

private:
    std::atomic<std::int64_t>* used_ = nullptr;
    const std::atomic<std::int64_t>* limit_ = nullptr;
    std::size_t bytes_ = 0;
};

} // namespace onceproxy::http
