#include "onceproxy/config/config.hpp"

namespace onceproxy::config {

std::shared_ptr<const config> egress_view(const config& cfg) {
    auto view = std::make_shared<config>(cfg);
    view->listen = cfg.egress->listen;
    view->tls.reset(); // the app calls its sidecar over loopback
    view->routes = cfg.egress->routes;
    return view;
}

} // namespace onceproxy::config
