#include "onceproxy/store/redis_sentinel.hpp"

#include "onceproxy/log/log.hpp"
#include "onceproxy/store/error.hpp"

#include <boost/asio/this_coro.hpp>

#include <charconv>

// GCC 12 reports a false -Wmismatched-new-delete on Asio's awaitable frames once it inlines
// their recycling allocator (operator new and delete do match: thread_info_base).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace onceproxy::store {

namespace net = boost::asio;
using boost::system::error_code;

redis_sentinel::redis_sentinel(redis_sentinel_options options) : options_(std::move(options)) {}

net::awaitable<redis_address> redis_sentinel::async_master_address() {
    auto ex = co_await net::this_coro::executor;
    const std::size_t count = options_.nodes.size();
    redis_address out;
    out.ec = errc::unavailable;
    std::string failures;
    bool auth_refused = false;
    const std::size_t start = first_.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < count; ++i) {
        const std::size_t index = (start + i) % count;
        const auto& node = options_.nodes[index];
        const std::string where = node.host + ":" + std::to_string(node.port);
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
        redis_client sentinel(ex, std::move(o));
        auto connected = co_await sentinel.async_connect_once();
        std::string why;
        if (connected.ec) {
            auth_refused = auth_refused || connected.ec == errc::auth_failed;
            why = connected.message;
        } else {
            std::vector<std::string> ask{"SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                         options_.master_name};
            auto r = co_await sentinel.async_exec(std::move(ask));
            const auto& rep = r.reply;
            std::uint16_t port = 0;
            if (r.ec) {
                why = "sentinel " + where + ": " + r.ec.message();
            } else if (rep.is_error()) {
                why = "sentinel " + where + " refused: " + rep.str;
            } else if (rep.type == redis_reply::kind::nil ||
                       (rep.type == redis_reply::kind::array && rep.elements.empty())) {
                why = "sentinel " + where + " does not know master '" + options_.master_name + "'";
            } else if (rep.type != redis_reply::kind::array || rep.elements.size() != 2 ||
                       std::from_chars(rep.elements[1].str.data(),
                                       rep.elements[1].str.data() + rep.elements[1].str.size(),
                                       port)
                               .ec != std::errc{} ||
                       port == 0 || rep.elements[0].str.empty()) {
                why = "sentinel " + where + " gave an unexpected reply";
            } else {
                out.ec = {};
                out.host = rep.elements[0].str;
                out.port = port;
                first_.store(index, std::memory_order_relaxed);
                sentinel.stop();
                log::debug("store", "sentinel named the master",
                           {{"sentinel", where},
                            {"master", options_.master_name},
                            {"redis", out.host + ":" + std::to_string(out.port)}});
                co_return out;
            }
        }
        sentinel.stop();
        if (!failures.empty()) {
            failures += "; ";
        }
        failures += why;
    }
    if (auth_refused) {
        out.ec = errc::auth_failed;
    }
    out.message = "no sentinel gave the address of master '" + options_.master_name +
                  "': " + (failures.empty() ? std::string("no sentinels configured") : failures);
    co_return out;
}

namespace {

net::awaitable<redis_address> ask(std::shared_ptr<redis_sentinel> sentinel) {
    co_return co_await sentinel->async_master_address();
}

} // namespace

std::function<net::awaitable<redis_address>()>
redis_sentinel::address_source(std::shared_ptr<redis_sentinel> sentinel) {
    return [sentinel = std::move(sentinel)] { return ask(sentinel); };
}

} // namespace onceproxy::store
