#pragma once
// Turns one fully read client request into the response to send: routes it, and either proxies
// it plainly or runs the idempotency exchange (SPEC §1). One handler per worker, used only from
// that worker's executor.

#include "onceproxy/config/config.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/store/store.hpp"
#include "onceproxy/upstream/forwarder.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace onceproxy::http {

using request = upstream::request;
using response = upstream::response;

/// Facts about the connection a request arrived on.
struct request_context {
    std::string client_ip;
    bool tls = false;
    std::chrono::steady_clock::time_point received{};
};

class handler {
public:
    /// `st` may be shared by all workers (its own contract says so); `fwd` and `reg` outlive
    /// the handler.
    handler(std::shared_ptr<const config::config> cfg, upstream::forwarder& fwd,
            std::shared_ptr<store::store> st, metrics::registry& reg);
    ~handler();

    /// Produces the response for `req`. `req` is consumed (moved upstream). Never throws for
    /// anything a client or an upstream does: those become problem responses.
    boost::asio::awaitable<response> async_handle(request& req, const request_context& ctx);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

/// Exchanges of this process still retrying their completion after answering the client
/// (`Idempotency-Status: unrecorded`); a drain waits for them so a record is not abandoned.
std::size_t background_exchanges() noexcept;

} // namespace onceproxy::http
