#pragma once
// The client-facing side of one worker: accept loop and one session coroutine per connection
// (read with limits and deadlines, hand the request to the handler, write the response).

#include "onceproxy/config/config.hpp"
#include "onceproxy/http/handler.hpp"
#include "onceproxy/http/task_tracker.hpp"
#include "onceproxy/http/tls_source.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/wire/deadline_watch.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstddef>
#include <memory>

namespace onceproxy::http {

/// One worker's listener and sessions. Created, run and drained on the worker's io_context.
class server {
public:
    /// Where a server counts: the registry, and the worker it runs on (the `worker` label of
    /// the per-worker series).
    struct counted {
        metrics::registry& reg;
        std::size_t worker = 0;
    };

    /// `cfg`: the start config (listen). `h`: the request path of the config to serve.
    /// `watch`: the worker's coarse deadline clock (client read and write deadlines).
    /// `tracker`: the worker's tracked coroutines; each session holds a token of it.
    /// `tls`: the certificate TLS connections are served with (config `tls`); null: no TLS.
    server(boost::asio::io_context& ioc, std::shared_ptr<const config::config> cfg,
           std::shared_ptr<handler> h, counted metrics, wire::deadline_watch& watch,
           task_tracker& tracker, std::shared_ptr<tls_source> tls = nullptr);
    ~server();

    /// Opens the listening socket (SO_REUSEPORT, so every worker binds the same port and the
    /// kernel spreads connections; a connection then stays on its worker). Throws on failure.
    /// `port_override` replaces the configured port (the port worker 0 got for port 0);
    /// `tls_port_override` the same for tls.listen. With TLS on `listen` itself (tls.listen
    /// unset), the one listener serves TLS.
    void listen(unsigned short port_override = 0, unsigned short tls_port_override = 0);

    /// The bound port (useful when the config says port 0).
    unsigned short port() const;
    /// The port TLS is served on: tls.listen's, or port() when `listen` serves TLS; 0: no TLS.
    unsigned short tls_port() const;

    /// Starts accepting. Call once, after listen().
    void start();

    /// Stops accepting, closes idle keep-alive connections, and lets in-flight requests finish;
    /// their connections close after the response. The sessions are reached by cancellation.
    /// Call on the worker's executor.
    void drain();

    /// A reload: requests read from now on use `h` (and its config's limits); requests in
    /// flight finish on the handler they started with. Call on the worker's executor.
    void set_handler(std::shared_ptr<handler> h);

    /// The drain deadline passed: cancels every session, which cuts its client connection
    /// (exchanges behind them go on recording or releasing their keys). Call on the worker's
    /// executor.
    void cut_connections();

private:
    struct impl;
    std::shared_ptr<impl> impl_;
};

/// Writes every access-log line still queued and ends the log writer thread. Call at shutdown,
/// once the workers have stopped; lines logged afterwards are written directly. Idempotent.
void flush_access_log();

} // namespace onceproxy::http
