#include "app/store_factory.hpp"

#include "onceproxy/store/memory_store.hpp"
#include "onceproxy/store/postgres_store.hpp"
#include "onceproxy/store/redis_store.hpp"

#include <stdexcept>

namespace onceproxy::app {

std::shared_ptr<store::store> make_store(const config::config& cfg,
                                         const std::vector<boost::asio::any_io_executor>& workers) {
    switch (cfg.store.type) {
    case config::store_type::memory:
        return std::make_shared<store::memory_store>(cfg.store.memory.max_bytes,
                                                     cfg.store.memory.max_bytes_per_holder);
    case config::store_type::redis:
        return std::make_shared<store::redis_store>(cfg.store.redis, workers);
    case config::store_type::postgres:
        return std::make_shared<store::postgres_store>(cfg.store.postgres, workers);
    }
    throw std::runtime_error("unknown store type");
}

} // namespace onceproxy::app
