#pragma once
// Builds the configured store (SPEC §5).

#include "onceproxy/config/config.hpp"
#include "onceproxy/store/store.hpp"

#include <memory>

namespace onceproxy::app {

/// Throws std::runtime_error with a clear message when the store cannot be set up.
std::shared_ptr<store::store> make_store(const config::config& cfg);

} // namespace onceproxy::app
