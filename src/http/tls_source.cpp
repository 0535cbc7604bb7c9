#include "onceproxy/http/tls_source.hpp"

#include "onceproxy/config/tls_material.hpp"

#include <boost/asio/ssl/context.hpp>

#include <openssl/ssl.h>

#include <stdexcept>

namespace onceproxy::http {

namespace {

struct loaded {
    std::shared_ptr<boost::asio::ssl::context> ctx;
    std::int64_t not_after = 0;
    std::string error;
};

loaded load(const config::tls_files& files) {
    auto m = config::load_server_tls(files);
    if (m.error) {
        return {nullptr, 0, m.error->message};
    }
    // The Asio context takes over one reference of the OpenSSL context.
    SSL_CTX_up_ref(m.ctx.get());
    return {std::make_shared<boost::asio::ssl::context>(m.ctx.get()), m.not_after, {}};
}

} // namespace

tls_source::tls_source(const config::tls_files& files) {
    auto l = load(files);
    if (!l.ctx) {
        throw std::runtime_error(l.error);
    }
    ctx_ = std::move(l.ctx);
    not_after_ = l.not_after;
}

tls_source::~tls_source() = default;

std::shared_ptr<boost::asio::ssl::context> tls_source::current() const {
    std::lock_guard lk(mutex_);
    return ctx_;
}

std::optional<std::string> tls_source::reload(const config::tls_files& files) {
    auto l = load(files);
    if (!l.ctx) {
        return l.error;
    }
    std::lock_guard lk(mutex_);
    ctx_ = std::move(l.ctx);
    not_after_ = l.not_after;
    return std::nullopt;
}

std::int64_t tls_source::not_after() const {
    std::lock_guard lk(mutex_);
    return not_after_;
}

} // namespace onceproxy::http
