#pragma once
// Runs one coroutine on a test's own io_context, bounded in time, and hands back its result.

#include "support/wait.hpp"

#include <doctest/doctest.h>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

namespace onceproxy::test {

/// Runs `op` on `ioc` until it finishes (the context is stopped then, although clients may keep
/// background work on it: reader, writer, health timer) or `limit` passes (test failure). An
/// exception of `op` is rethrown.
template <class T>
T run(boost::asio::io_context& ioc, boost::asio::awaitable<T> op,
      std::chrono::milliseconds limit = std::chrono::seconds(15)) {
    struct state {
        bool done = false;
        std::exception_ptr error;
        std::optional<T> value;
    };
    auto st = std::make_shared<state>();
    boost::asio::co_spawn(ioc, std::move(op), [st, &ioc](std::exception_ptr e, T v) {
        st->done = true;
        st->error = e;
        if (!e) {
            st->value.emplace(std::move(v));
        }
        ioc.stop();
    });
    ioc.restart();
    ioc.run_for(limit);
    REQUIRE_MESSAGE(st->done, "operation did not finish within the time limit");
    if (st->error) {
        std::rethrow_exception(st->error);
    }
    return std::move(*st->value);
}

/// Runs the work that is ready on `ioc` (readers, timers, ...) while it waits, as `eventually`
/// does, for `done`: true as soon as it holds, false when `bound` passed first.
template <class Pred>
bool run_until(boost::asio::io_context& ioc, Pred&& done, std::chrono::milliseconds bound) {
    return eventually(
        [&] {
            ioc.restart();
            ioc.poll();
            return done();
        },
        bound, std::chrono::milliseconds(5));
}

} // namespace onceproxy::test
