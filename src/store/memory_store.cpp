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

std::int64_t created_ms_of(const claim_request& req) {
    if (req.created_ms != 0) {
        return req.created_ms;
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

} // namespace

memory_store::memory_store(std::size_t max_bytes, std::size_t max_bytes_per_holder, clock_fn now)
    : max_bytes_(max_bytes), max_bytes_per_holder_(std::min(max_bytes_per_holder, max_bytes)),
      now_(std::move(now)) {}

memory_store::shard& memory_store::shard_for(const std::string& key) noexcept {
    return shards_[std::hash<std::string>{}(key) % shard_count];
}

template <class F>
void memory_store::reweigh(holder_map::iterator account, F change) {
    holder_account& a = account->second;
    if (!a.evictable.empty()) {
        weights_.erase({a.bytes, &account->first});
    }
    change(a);
    if (!a.evictable.empty()) {
        weights_.insert({a.bytes, &account->first});
    }
}

memory_store::charge_status memory_store::try_charge(const std::string& holder, std::size_t bytes,
                                                     bool check_holder) {
    std::lock_guard lock(holders_mutex_);
    const std::size_t used = used_.load(std::memory_order_relaxed);
    if (bytes > max_bytes_ || used > max_bytes_ - bytes) {
        return charge_status::store_full;
    }
    auto account = holders_.try_emplace(holder).first;
    const std::size_t held = account->second.bytes;
    if (check_holder && (bytes > max_bytes_per_holder_ || held > max_bytes_per_holder_ - bytes)) {
        if (held == 0) {
            holders_.erase(account);
        }
        return charge_status::holder_full;
    }
    reweigh(account, [&](holder_account& a) { a.bytes += bytes; });
    used_.fetch_add(bytes, std::memory_order_relaxed);
    return charge_status::ok;
}

void memory_store::uncharge(const entry& e) {
    std::lock_guard lock(holders_mutex_);
    used_.fetch_sub(e.charged, std::memory_order_relaxed);
    auto account = holders_.find(e.holder);
    if (account == holders_.end()) {
        return;
    }
    reweigh(account, [&](holder_account& a) {
        a.bytes -= std::min(a.bytes, e.charged);
        if (e.evictable) {
            a.evictable.erase(e.evict_pos);
        }
    });
    if (account->second.bytes == 0) {
        holders_.erase(account);
    }
}

void memory_store::erase(shard& s, std::unordered_map<std::string, entry>::iterator it) {
    uncharge(it->second);
    s.entries.erase(it);
}

bool memory_store::evict_one(const std::string* holder) {
    std::string key;
    std::string victim;
    {
        std::lock_guard lock(holders_mutex_);
        const holder_account* a = nullptr;
        if (holder != nullptr) {
            auto it = holders_.find(*holder);
            if (it != holders_.end()) {
                a = &it->second;
                victim = it->first;
            }
        } else if (!weights_.empty()) {
            victim = *weights_.rbegin()->second;
            a = &holders_.find(victim)->second;
        }
        if (a == nullptr || a->evictable.empty()) {
            return false;
        }
        key = a->evictable.front();
    }
    // Shard first, then holders (the lock order): the record may have changed meanwhile.
    shard& s = shard_for(key);
    std::lock_guard lock(s.mutex);
    auto it = s.entries.find(key);
    if (it != s.entries.end() && it->second.evictable && it->second.holder == victim) {
        erase(s, it);
        evictions_.fetch_add(1, std::memory_order_relaxed);
    }
    // Erased now, or by someone else since: either way the holder has one record less.
    return true;
}

bool memory_store::make_room(charge_status why, const std::string& holder, std::size_t bytes,
                             bool& swept) {
    if (why == charge_status::holder_full) {
        // The holder's own oldest non-2xx records go until the lease fits in its bound.
        while (holder_bytes(holder) + bytes > max_bytes_per_holder_) {
            if (!evict_one(&holder)) {
                return false;
            }
        }
        return true;
    }
    if (!swept) {
        swept = true;
        sweep_expired();
        return true;
    }
    while (used_.load(std::memory_order_relaxed) + bytes > max_bytes_) {
        if (!evict_one(nullptr)) {
            return false;
        }
    }
    return true;
}

std::size_t memory_store::holder_bytes(const std::string& holder) const {
    std::lock_guard lock(holders_mutex_);
    auto it = holders_.find(holder);
    return it == holders_.end() ? 0 : it->second.bytes;
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
    const std::size_t bytes = req.key.size() + req.fingerprint.size() + req.owner.size() +
                              req.holder.size() + entry_overhead;
    const std::string key(req.key);
    const std::string holder(req.holder);
    shard& s = shard_for(key);
    bool swept = false;
    // A few rounds at most: each after make_room freed something (another thread may take it).
    for (int round = 0; round < 4; ++round) {
        charge_status why = charge_status::ok;
        {
            std::lock_guard lock(s.mutex);
            const time_point now = now_();
            reap(s, now, reap_per_operation);
            if (entry* e = find_live(s, key, now)) {
                claim_result r;
                if (e->fingerprint != req.fingerprint) {
                    r.status = claim_status::mismatch;
                } else if (e->completed) {
                    r.status = claim_status::completed;
                    r.record = e->payload;
                    r.created_ms = e->created_ms;
                } else {
                    r.status = claim_status::in_flight;
                    r.remaining_lease = std::chrono::ceil<duration>(e->expiry - now);
                }
                return r;
            }
            why = try_charge(holder, bytes, true);
            if (why == charge_status::ok) {
                const time_point expiry = now + at_least_1ms(req.lease);
                s.entries.insert_or_assign(key, entry{.fingerprint = std::string(req.fingerprint),
                                                      .owner = std::string(req.owner),
                                                      .holder = holder,
                                                      .expiry = expiry,
                                                      .claimed = now,
                                                      .created_ms = created_ms_of(req),
                                                      .charged = bytes});
                s.expiries.push(expiry_item{expiry, key});
                return claim_result{claim_status::acquired, duration{0}, {}};
            }
        }
        if (!make_room(why, holder, bytes, swept)) {
            return make_error_code(why == charge_status::holder_full ? errc::holder_full
                                                                     : errc::store_full);
        }
    }
    return make_error_code(errc::store_full);
}

result<fence_status> memory_store::complete(const std::string& key, const std::string& owner,
                                            std::string payload, duration ttl, record_kind kind) {
    shard& s = shard_for(key);
    bool swept = false;
    for (int round = 0; round < 4; ++round) {
        std::string holder;
        {
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
            if (try_charge(e->holder, payload.size(), false) == charge_status::ok) {
                e->charged += payload.size();
                e->payload = std::move(payload);
                e->completed = true;
                e->expiry = now + at_least_1ms(ttl);
                s.expiries.push(expiry_item{e->expiry, key});
                if (kind == record_kind::evictable) {
                    std::lock_guard holders(holders_mutex_);
                    reweigh(holders_.find(e->holder), [&](holder_account& a) {
                        e->evict_pos = a.evictable.insert(a.evictable.end(), key);
                    });
                    e->evictable = true;
                }
                return fence_status::ok;
            }
            holder = e->holder;
        }
        if (!make_room(charge_status::store_full, holder, payload.size(), swept)) {
            break;
        }
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
        info.fingerprint = e->fingerprint;
        info.created_ms = e->created_ms;
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

boost::asio::awaitable<result<fence_status>>
memory_store::async_complete(std::string_view key, std::string_view owner, std::string_view payload,
                             duration ttl, record_kind kind,
                             claimed_lease /*claimed: the owner fences alone*/) {
    co_return complete(std::string(key), std::string(owner), std::string(payload), ttl, kind);
}

boost::asio::awaitable<result<fence_status>> memory_store::async_release(std::string_view key,
                                                                         std::string_view owner) {
    co_return release(std::string(key), std::string(owner));
}

boost::asio::awaitable<result<fence_status>>
memory_store::async_extend(std::string_view key, std::string_view owner, duration lease) {
    co_return extend(std::string(key), std::string(owner), lease);
}

boost::asio::awaitable<open_report> memory_store::async_open() {
    co_return open_report{};
}

void memory_store::close() {}

boost::asio::awaitable<result<void>> memory_store::async_ping() {
    co_return result<void>{};
}

} // namespace onceproxy::store
