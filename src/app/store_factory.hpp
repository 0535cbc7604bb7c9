#pragma once
// Builds the configured store (SPEC §5).

#include "onceproxy/config/config.hpp"
#include "onceproxy/store/store.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <memory>
#include <vector>

namespace onceproxy::app {

/// Throws std::runtime_error with a clear message when the store cannot be set up.
/// `workers`: the worker executors (the Redis store keeps a connection on each).
std::shared_ptr<store::store> make_store(const config::config& cfg,
                                         const std::vector<boost::asio::any_io_executor>& workers);

} // namespace onceproxy::app
