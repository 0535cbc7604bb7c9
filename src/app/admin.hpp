#pragma once
// The admin listener: /metrics (Prometheus), /healthz (alive), /readyz (SPEC §6), the status
// page at / with its JSON at /admin/v1/status (status.hpp), key administration (key_admin.hpp).

#include "onceproxy/config/config.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/store/store.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>

#include <memory>
#include <vector>

namespace onceproxy::app {

class admin_server {
public:
    /// `workers`: the worker executors. The store is probed on each of them (the Redis store
    /// keeps one connection per worker), and the store counts as answering only when every
    /// worker's connection answers.
    admin_server(boost::asio::io_context& ioc, std::vector<boost::asio::any_io_executor> workers,
                 std::shared_ptr<const config::config> cfg, metrics::registry& reg,
                 std::shared_ptr<store::store> st);
    ~admin_server();

    /// Binds the admin address; returns the bound port (0 when no admin listener is configured).
    unsigned short listen();
    /// Starts serving, and probes the store until it has answered once.
    void start();
    /// Shutting down: /readyz answers 503 "draining" from now on, whatever it checks.
    void set_draining();
    /// A reload installed `serving`: the status page shows its routes. Admin loop only.
    void set_config(std::shared_ptr<const config::config> serving);
    void stop();

private:
    struct impl;
    std::shared_ptr<impl> impl_;
};

} // namespace onceproxy::app
