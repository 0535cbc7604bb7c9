#include "onceproxy/redis/redis_sentinel.hpp"

#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/redis/error.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <random>

// GCC 12 reports a false -Wmismatched-new-delete on Asio's awaitable frames once it inlines
// their recycling allocator (operator new and delete do match: thread_info_base).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace onceproxy::redis {

namespace net = boost::asio;
using boost::system::error_code;

namespace {

constexpr std::string_view channel = "+switch-master";

std::optional<std::uint16_t> parse_port(std::string_view text) {
    std::uint16_t port = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
    if (ec != std::errc{} || end != text.data() + text.size() || port == 0) {
        return std::nullopt;
    }
    return port;
}

std::string address_text(const std::string& host, std::uint16_t port) {
    return host + ":" + std::to_string(port);
}

// Delay uniform in [cap/2, cap]: several replicas of the proxy do not come back to the
// sentinels in the same millisecond.
std::chrono::milliseconds jittered(std::chrono::milliseconds cap) {
    thread_local std::minstd_rand rng{std::random_device{}()};
    const auto hi = std::max<long long>(cap.count(), 1);
    std::uniform_int_distribution<long long> dist(hi / 2, hi);
    return std::chrono::milliseconds(dist(rng));
}

// At most this much of a message that could not be read goes to the log.
std::string excerpt(std::string_view text) {
    constexpr std::size_t most = 200;
    return std::string(text.substr(0, most)) + (text.size() > most ? "..." : "");
}

} // namespace

std::optional<switch_master_event> parse_switch_master(std::string_view payload) {
    std::array<std::string_view, 5> fields;
    std::size_t count = 0;
    std::size_t at = 0;
    for (;;) {
        const auto space = payload.find(' ', at);
        const auto field = payload.substr(
            at, space == std::string_view::npos ? std::string_view::npos : space - at);
        if (field.empty() || count == fields.size()) {
            return std::nullopt;
        }
        fields[count++] = field;
        if (space == std::string_view::npos) {
            break;
        }
        at = space + 1;
    }
    if (count != fields.size()) {
        return std::nullopt;
    }
    const auto old_port = parse_port(fields[2]);
    const auto new_port = parse_port(fields[4]);
    if (!old_port || !new_port) {
        return std::nullopt;
    }
    switch_master_event out;
    out.master = std::string(fields[0]);
    out.old_host = std::string(fields[1]);
    out.old_port = *old_port;
    out.new_host = std::string(fields[3]);
    out.new_port = *new_port;
    return out;
}

/// The state of the watch, on its executor only (stop_watch posts there).
struct redis_sentinel::watch {
    explicit watch(net::any_io_executor e) : ex(std::move(e)), backoff(ex) {}
    net::any_io_executor ex;
    net::steady_timer backoff;
    switch_handler on_switch;
    redis_client* client = nullptr; // the subscribed (or subscribing) connection, if any
    bool stopped = false;
};

redis_sentinel::redis_sentinel(redis_sentinel_options options) : options_(std::move(options)) {}

redis_client_options redis_sentinel::client_options(std::size_t index) const {
    const auto& node = options_.nodes[index];
    redis_client_options o;
    o.url.tls = options_.tls;
    o.url.host = node.host;
    o.url.port = node.port;
    o.url.user = options_.username;
    o.url.password = options_.password;
    o.tls_ca_file = options_.tls_ca_file;
    o.connect_timeout = options_.connect_timeout;
    o.command_timeout = options_.command_timeout;
    o.health_check_interval = std::chrono::milliseconds{0};
    return o;
}

net::awaitable<redis_sentinel::answer> redis_sentinel::ask(std::size_t index) {
    auto ex = co_await net::this_coro::executor;
    const auto& node = options_.nodes[index];
    const std::string where = address_text(node.host, node.port);
    answer out;
    out.address.ec = errc::unavailable;
    redis_client sentinel(ex, client_options(index));
    auto connected = co_await sentinel.async_connect_once();
    if (connected.ec) {
        out.auth_refused = connected.ec == errc::auth_failed;
        out.address.message = connected.message;
        co_return out;
    }
    auto r = co_await sentinel.async_exec(
        command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", options_.master_name));
    sentinel.stop();
    const auto& rep = r.reply;
    std::optional<std::uint16_t> port;
    if (r.ec) {
        out.address.message = "sentinel " + where + ": " + r.ec.message();
    } else if (rep.is_error()) {
        out.address.message = "sentinel " + where + " refused: " + rep.str;
    } else if (rep.type == redis_reply::kind::nil ||
               (rep.type == redis_reply::kind::array && rep.elements.empty())) {
        out.address.message =
            "sentinel " + where + " does not know master '" + options_.master_name + "'";
    } else if (rep.type != redis_reply::kind::array || rep.elements.size() != 2 ||
               !(port = parse_port(rep.elements[1].str)) || rep.elements[0].str.empty()) {
        out.address.message = "sentinel " + where + " gave an unexpected reply";
    } else {
        out.address.ec = {};
        out.address.host = rep.elements[0].str;
        out.address.port = *port;
    }
    co_return out;
}

net::awaitable<redis_address> redis_sentinel::async_master_address() {
    const std::size_t count = options_.nodes.size();
    const auto announced_before = announcements_.load(std::memory_order_acquire);
    redis_address out;
    out.ec = errc::unavailable;
    std::string failures;
    bool auth_refused = false;
    std::size_t start = first_.load(std::memory_order_relaxed);
    {
        std::lock_guard lock(mutex_);
        if (unconfirmed_ && count > 0) {
            start = (unconfirmed_by_ + 1) % count; // its last answer led to no verified master
        }
    }
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t index = (start + i) % count;
        auto a = co_await ask(index);
        if (!a.address.ec) {
            out = std::move(a.address);
            first_.store(index, std::memory_order_relaxed);
            std::lock_guard lock(mutex_);
            if (announcements_.load(std::memory_order_acquire) != announced_before) {
                // A switch was announced meanwhile: this answer may predate it.
                out.host = master_host_;
                out.port = master_port_;
            }
            unconfirmed_ = true;
            unconfirmed_host_ = out.host;
            unconfirmed_port_ = out.port;
            unconfirmed_by_ = index;
            log::debug(
                "store", "sentinel named the master",
                {{"sentinel", address_text(options_.nodes[index].host, options_.nodes[index].port)},
                 {"master", options_.master_name},
                 {"redis", address_text(out.host, out.port)}});
            co_return out;
        }
        auth_refused = auth_refused || a.auth_refused;
        if (!failures.empty()) {
            failures += "; ";
        }
        failures += a.address.message;
    }
    if (auth_refused) {
        out.ec = errc::auth_failed;
    }
    out.message = "no sentinel gave the address of master '" + options_.master_name +
                  "': " + (failures.empty() ? std::string("no sentinels configured") : failures);
    co_return out;
}

namespace {

net::awaitable<redis_address> ask_sentinels(std::shared_ptr<redis_sentinel> sentinel) {
    co_return co_await sentinel->async_master_address();
}

} // namespace

std::function<net::awaitable<redis_address>()>
redis_sentinel::address_source(std::shared_ptr<redis_sentinel> sentinel) {
    return [sentinel = std::move(sentinel)] { return ask_sentinels(sentinel); };
}

std::function<void(const redis_address&, bool)>
redis_sentinel::connected_sink(std::shared_ptr<redis_sentinel> sentinel) {
    return [sentinel = std::move(sentinel)](const redis_address& at, bool after_readonly) {
        sentinel->note_connected(at.host, at.port, after_readonly);
    };
}

void redis_sentinel::set_switch_observer(std::function<void(master_switch_cause)> observer) {
    std::lock_guard lock(mutex_);
    observer_ = std::move(observer);
}

bool redis_sentinel::move_to(const std::string& host, std::uint16_t port, master_switch_cause cause,
                             const std::string& by) {
    std::lock_guard lock(mutex_);
    if (cause == master_switch_cause::switch_master) {
        unconfirmed_ = false; // the announcing sentinel is asked first again (first_)
    }
    if (host == master_host_ && port == master_port_) {
        return false;
    }
    const bool first = master_host_.empty();
    const std::string from = first ? std::string() : address_text(master_host_, master_port_);
    master_host_ = host;
    master_port_ = port;
    if (cause == master_switch_cause::switch_master) {
        // After the address, under the lock: whoever sees the new count reads the new address.
        announcements_.fetch_add(1, std::memory_order_acq_rel);
    }
    if (first) {
        return true; // where the store starts: not a move
    }
    switches_[static_cast<std::size_t>(cause)].fetch_add(1, std::memory_order_relaxed);
    if (observer_) {
        observer_(cause);
    }
    log::warn("store", "redis master switched",
              {{"master", options_.master_name},
               {"from", from},
               {"to", address_text(host, port)},
               {"cause", to_string(cause)},
               {"by", by}});
    return true;
}

void redis_sentinel::note_connected(const std::string& host, std::uint16_t port,
                                    bool after_readonly) {
    {
        std::lock_guard lock(mutex_);
        if (unconfirmed_ && host == unconfirmed_host_ && port == unconfirmed_port_) {
            unconfirmed_ = false;
        }
    }
    move_to(host, port,
            after_readonly ? master_switch_cause::readonly : master_switch_cause::connection_lost,
            "reconnect");
}

void redis_sentinel::start_watch(net::any_io_executor ex, switch_handler on_switch) {
    auto w = std::make_shared<watch>(std::move(ex));
    w->on_switch = std::move(on_switch);
    {
        std::lock_guard lock(mutex_);
        if (watch_ || options_.nodes.empty()) {
            return;
        }
        watch_ = w;
    }
    net::co_spawn(w->ex, run_watch(w), net::detached);
}

void redis_sentinel::stop_watch() {
    std::shared_ptr<watch> w;
    {
        std::lock_guard lock(mutex_);
        w = watch_;
    }
    if (!w) {
        return;
    }
    net::post(w->ex, [w] {
        w->stopped = true;
        w->backoff.cancel();
        if (w->client != nullptr) {
            w->client->stop();
        }
    });
}

void redis_sentinel::announced(watch* w, const std::string& host, std::uint16_t port,
                               const std::string& sentinel, bool caught_up) {
    move_to(host, port, master_switch_cause::switch_master,
            caught_up ? "sentinel " + sentinel + " (asked after subscribing)"
                      : "sentinel " + sentinel + " (+switch-master)");
    if (w != nullptr && !w->stopped && w->on_switch) {
        w->on_switch(host, port);
    }
}

void redis_sentinel::take_message(std::size_t index, const redis_reply& m) {
    if (index >= options_.nodes.size()) {
        return;
    }
    const auto& node = options_.nodes[index];
    const std::string where = address_text(node.host, node.port);
    // ["message", "+switch-master", payload]: the only kind of message we subscribe to.
    if (m.type != redis_reply::kind::array || m.elements.size() != 3 ||
        m.elements[0].str != "message" || m.elements[1].str != channel ||
        m.elements[2].type != redis_reply::kind::string) {
        log::warn("store", "ignored an unexpected message from a sentinel",
                  {{"sentinel", where},
                   {"channel", m.elements.size() > 1 ? excerpt(m.elements[1].str) : ""}});
        return;
    }
    const auto& payload = m.elements[2];
    const auto event = parse_switch_master(payload.str);
    if (!event) {
        log::warn("store", "ignored a malformed +switch-master message",
                  {{"sentinel", where}, {"message", excerpt(payload.str)}});
        return;
    }
    if (event->master != options_.master_name) {
        log::debug("store", "+switch-master of another master",
                   {{"sentinel", where}, {"master", event->master}});
        return;
    }
    // This sentinel knows the new master for sure: reconnects ask it first.
    first_.store(index, std::memory_order_relaxed);
    std::shared_ptr<watch> w;
    {
        std::lock_guard lock(mutex_);
        w = watch_;
    }
    announced(w.get(), event->new_host, event->new_port, where, false);
}

net::awaitable<bool> redis_sentinel::follow(std::shared_ptr<watch> w, std::size_t index) {
    const auto& node = options_.nodes[index];
    const std::string where = address_text(node.host, node.port);
    auto o = client_options(index);
    o.health_check_interval = options_.health_check_interval;
    o.on_message = [self = shared_from_this(), index](redis_reply m) {
        self->take_message(index, m);
    };
    redis_client sub(w->ex, std::move(o));
    w->client = &sub;
    struct forget {
        watch& w;
        ~forget() { w.client = nullptr; }
    } forget_on_exit{*w};

    auto connected = co_await sub.async_connect_once();
    if (connected.ec || w->stopped) {
        log::debug("store", "cannot subscribe to a sentinel",
                   {{"sentinel", where}, {"error", connected.message}});
        sub.stop();
        co_return false;
    }
    auto r = co_await sub.async_exec(command("SUBSCRIBE", channel));
    if (r.ec || r.reply.type != redis_reply::kind::array || r.reply.elements.size() != 3 ||
        r.reply.elements[0].str != "subscribe" || w->stopped) {
        log::debug("store", "a sentinel refused the subscription",
                   {{"sentinel", where}, {"error", r.ec ? r.ec.message() : excerpt(r.reply.str)}});
        sub.stop();
        co_return false;
    }
    log::info("store", "following failovers through a sentinel",
              {{"sentinel", where}, {"master", options_.master_name}});
    // A failover announced while no subscription was up: the master the sentinels name now.
    // An announcement heard while asking is newer than the answer: the answer is dropped.
    const auto announced_before = announcements_.load(std::memory_order_acquire);
    auto a = co_await ask(index);
    if (!a.address.ec && !w->stopped &&
        announcements_.load(std::memory_order_acquire) == announced_before) {
        bool moved = false;
        {
            std::lock_guard lock(mutex_);
            moved = !master_host_.empty() &&
                    (a.address.host != master_host_ || a.address.port != master_port_);
        }
        if (moved) {
            first_.store(index, std::memory_order_relaxed);
            announced(w.get(), a.address.host, a.address.port, where, true);
        }
    }
    co_await sub.async_wait_closed();
    if (!w->stopped) {
        log::warn("store", "lost the subscription to a sentinel; subscribing again",
                  {{"sentinel", where}, {"master", options_.master_name}});
    }
    sub.stop();
    co_return true;
}

net::awaitable<void> redis_sentinel::run_watch(std::shared_ptr<watch> w) {
    auto self = shared_from_this();
    const std::size_t count = options_.nodes.size();
    std::size_t next = first_.load(std::memory_order_relaxed) % count;
    auto delay = options_.reconnect_min;
    std::uint64_t failures = 0;
    while (!w->stopped) {
        bool followed = false;
        bool lasted = false;
        for (std::size_t i = 0; i < count && !w->stopped && !followed; ++i) {
            const std::size_t index = (next + i) % count;
            const auto since = std::chrono::steady_clock::now();
            followed = co_await follow(w, index);
            // A subscription that drops at once (a flapping sentinel) keeps backing off.
            lasted = std::chrono::steady_clock::now() - since >= std::chrono::seconds(10);
            if (followed) {
                // The next subscription starts with another sentinel: this one just dropped.
                next = (index + 1) % count;
            }
        }
        if (w->stopped) {
            break;
        }
        if (followed) {
            failures = 0;
            if (lasted) {
                delay = options_.reconnect_min;
            }
        } else {
            ++failures;
            log::write(failures == 1 ? log::level::warn : log::level::debug, "store",
                       "no sentinel takes a subscription to +switch-master; trying again",
                       {{"master", options_.master_name},
                        {"attempt", failures},
                        {"retry_in_ms", static_cast<std::int64_t>(delay.count())}});
        }
        w->backoff.expires_after(jittered(delay));
        co_await w->backoff.async_wait(use_tuple);
        delay = std::min(delay * 2, options_.reconnect_max);
    }
}

} // namespace onceproxy::redis
