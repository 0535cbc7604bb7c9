#include <onceproxy/store/error.hpp>
#include <onceproxy/store/memory_store.hpp>

#include <algorithm>
#include <utility>

namespace onceproxy::store {

namespace {

// Redis refuses PX 0; a non-positive lease or TTL here is a caller bug, kept harmless.
duration at_least_1ms(duration d) noexcept {
    return std::max(d, duration{1});
}

} // namespace

memory_store::memory_store(std::size_t max_bytes, clock_fn now)
    : max_bytes_(max_bytes), now_(std::move(now)) {}

memory_store::shard& memory_store::shard_for(const std::string& key) noexcept {
    return shards_[std::hash<std::string>{}(key) % shard_count];
}

bool memory_store::try_charge(std::size_t bytes) noexcept {
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
        if (bytes > max_bytes_ || used > max_bytes_ - bytes) {
            return false;
        }
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
}

void memory_store::uncharge(std::size_t bytes) noexcept {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
}

void memory_store::erase(shard& s, std::unordered_map<std::string, entry>::iterator it) {
    uncharge(it->second.charged);
    s.entries.erase(it);
}

void memory_store::reap(shard& s, time_point now, std::size_t limit) {
    for (std::size_t n = 0; n < limit && !s.expiries.empty(); ++n) {
        const expiry_item& top = s.expiries.top();
        if (top.expiry > now) {
            return;
        }
        auto it = s.entries.find(top.key);
        // Stale items (the entry was extended, completed, released or replaced since) only
        // leave the heap; the entry itself is removed when its current expiry is due.
        if (it != s.entries.end() && it->second.expiry == top.expiry) {
            erase(s, it);
        }
        s.expiries.pop();
    }
}

memory_store::entry* memory_store::find_live(shard& s, const std::string& key, time_point now) {
    auto it = s.entries.find(key);
    if (it == s.entries.end()) {
        return nullptr;
    }
    if (it->second.expiry <= now) {
        erase(s, it);
        return nullptr;
    }
    return &it->second;
}

void memory_store::sweep_expired() {
    const time_point now = now_();
    for (shard& s : shards_) {
        std::lock_guard lock(s.mutex);
        reap(s, now, s.expiries.size());
    }
}

std::size_t memory_store::entry_count() const {
    std::size_t n = 0;
    for (const shard& s : shards_) {
        std::lock_guard lock(s.mutex);
        n += s.entries.size();
    }
    return n;
}

result<claim_result> memory_store::claim(const claim_request& req) {
    const std::size_t bytes =
        req.key.size() + req.fingerprint.size() + req.owner.size() + entry_overhead;
    shard& s = shard_for(req.key);
    // Two rounds at most: the second only after a full sweep freed expired entries elsewhere.
    for (int round = 0; round < 2; ++round) {
        if (round == 1) {
            sweep_expired();
        }
        std::lock_guard lock(s.mutex);
        const time_point now = now_();
        reap(s, now, reap_per_operation);
        if (entry* e = find_live(s, req.key, now)) {
            claim_result r;
            if (e->fingerprint != req.fingerprint) {
                r.status = claim_status::mismatch;
            } else if (e->completed) {
                r.status = claim_status::completed;
                r.record = e->payload;
            } else {
                r.status = claim_status::in_flight;
                r.remaining_lease = std::chrono::ceil<duration>(e->expiry - now);
            }
            return r;
        }
        if (!try_charge(bytes)) {
            continue;
        }
        const time_point expiry = now + at_least_1ms(req.lease);
        s.entries.insert_or_assign(
            req.key, entry{req.fingerprint, req.owner, {}, false, expiry, now, bytes});
        s.expiries.push(expiry_item{expiry, req.key});
        return claim_result{claim_status::acquired, duration{0}, {}};
    }
    return make_error_code(errc::store_full);
}

result<fence_status> memory_store::complete(const std::string& key, const std::string& owner,
                                            std::string payload, duration ttl) {
    shard& s = shard_for(key);
    for (int round = 0; round < 2; ++round) {
        if (round == 1) {
            sweep_expired();
        }
        std::lock_guard lock(s.mutex);
        const time_point now = now_();
        reap(s, now, reap_per_operation);
        entry* e = find_live(s, key, now);
        if (e == nullptr || e->owner != owner) {
            return fence_status::not_owner;
        }
        if (e->completed) {
            // A retried completion whose first reply was lost: acknowledged, record unchanged.
            return fence_status::ok;
        }
        if (!try_charge(payload.size())) {
            continue;
        }
        e->charged += payload.size();
        e->payload = std::move(payload);
        e->completed = true;
        e->expiry = now + at_least_1ms(ttl);
        s.expiries.push(expiry_item{e->expiry, key});
        return fence_status::ok;
    }
    return make_error_code(errc::store_full);
}

result<fence_status> memory_store::release(const std::string& key, const std::string& owner) {
    shard& s = shard_for(key);
    std::lock_guard lock(s.mutex);
    const time_point now = now_();
    reap(s, now, reap_per_operation);
    entry* e = find_live(s, key, now);
    if (e == nullptr || e->completed || e->owner != owner) {
        return fence_status::not_owner;
    }
    erase(s, s.entries.find(key));
    return fence_status::ok;
}

result<fence_status> memory_store::extend(const std::string& key, const std::string& owner,
                                          duration lease) {
    shard& s = shard_for(key);
    std::lock_guard lock(s.mutex);
    const time_point now = now_();
    reap(s, now, reap_per_operation);
    entry* e = find_live(s, key, now);
    if (e == nullptr || e->completed || e->owner != owner) {
        return fence_status::not_owner;
    }
    e->expiry = now + at_least_1ms(lease);
    s.expiries.push(expiry_item{e->expiry, key});
    return fence_status::ok;
}

result<key_info> memory_store::inspect(const std::string& key) {
    shard& s = shard_for(key);
    std::lock_guard lock(s.mutex);
    const time_point now = now_();
    reap(s, now, reap_per_operation);
    key_info info;
    const entry* e = find_live(s, key, now);
    if (e == nullptr) {
        return info;
    }
    info.remaining = std::chrono::ceil<duration>(e->expiry - now);
    if (e->completed) {
        info.state = key_state::completed;
        info.record = e->payload;
    } else {
        info.state = key_state::in_flight;
        info.owner_age = std::chrono::floor<duration>(now - e->claimed);
    }
    return info;
}

result<purge_status> memory_store::purge(const std::string& key, bool force) {
    shard& s = shard_for(key);
    std::lock_guard lock(s.mutex);
    const time_point now = now_();
    reap(s, now, reap_per_operation);
    const entry* e = find_live(s, key, now);
    if (e == nullptr) {
        return purge_status::absent;
    }
    if (!e->completed && !force) {
        return purge_status::in_flight;
    }
    const bool lease = !e->completed;
    // The owner's token goes with the entry: its later complete finds no lease (not_owner).
    erase(s, s.entries.find(key));
    return lease ? purge_status::purged_lease : purge_status::purged_record;
}

boost::asio::awaitable<result<key_info>> memory_store::async_inspect(std::string key) {
    co_return inspect(key);
}

boost::asio::awaitable<result<purge_status>> memory_store::async_purge(std::string key,
                                                                       bool force) {
    co_return purge(key, force);
}

boost::asio::awaitable<result<claim_result>> memory_store::async_claim(claim_request req) {
    co_return claim(req);
}

boost::asio::awaitable<result<fence_status>> memory_store::async_complete(std::string key,
                                                                          std::string owner,
                                                                          std::string payload,
                                                                          duration ttl) {
    co_return complete(key, owner, std::move(payload), ttl);
}

boost::asio::awaitable<result<fence_status>> memory_store::async_release(std::string key,
                                                                         std::string owner) {
    co_return release(key, owner);
}

boost::asio::awaitable<result<fence_status>>
memory_store::async_extend(std::string key, std::string owner, duration lease) {
    co_return extend(key, owner, lease);
}

boost::asio::awaitable<open_report> memory_store::async_open() {
    co_return open_report{};
}

void memory_store::close() {}

boost::asio::awaitable<result<void>> memory_store::async_ping() {
    co_return result<void>{};
}

} // namespace onceproxy::store
