#pragma once
// The certificate and key new TLS connections are served with, shared by every worker and
// replaceable while the proxy runs (a rotated Secret): a connection takes the current context
// when it is accepted and keeps it until it closes, so a rotation affects new connections only.

#include "onceproxy/config/config.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace boost::asio::ssl {
class context;
}

namespace onceproxy::http {

class tls_source {
public:
    /// Loads `files` (config::load_server_tls); throws std::runtime_error when they do not load.
    explicit tls_source(const config::tls_files& files);
    ~tls_source();
    tls_source(const tls_source&) = delete;
    tls_source& operator=(const tls_source&) = delete;

    /// The context for a new connection. Any thread.
    std::shared_ptr<boost::asio::ssl::context> current() const;

    /// Loads `files` again. Loaded: new connections get them, and the answer is empty. Not
    /// loaded: what is wrong; the current pair stays. Any thread.
    std::optional<std::string> reload(const config::tls_files& files);

    /// The current leaf certificate's expiry, seconds since the epoch.
    std::int64_t not_after() const;

private:
    mutable std::mutex mutex_;
    std::shared_ptr<boost::asio::ssl::context> ctx_;
    std::int64_t not_after_ = 0;
};

} // namespace onceproxy::http
