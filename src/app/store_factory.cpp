#include "app/store_factory.hpp"

#include <stdexcept>

namespace onceproxy::app {

std::shared_ptr<store::store> make_store(const config::config& cfg) {
    // The stores arrive with the idempotency engine; until then only plain proxying runs.
    (void)cfg;
    return nullptr;
}

} // namespace onceproxy::app
