#include "onceproxy/http/task_tracker.hpp"

#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <optional>

using onceproxy::http::task_tracker;
namespace net = boost::asio;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

/// Runs a join on `ioc` and reports its result (nullopt: it never returned).
std::optional<bool> run_join(net::io_context& ioc, task_tracker& t, clock_type::time_point until) {
    std::optional<bool> joined;
    net::co_spawn(
        ioc, [&]() -> net::awaitable<void> { joined = co_await t.async_join(until); },
        net::detached);
    ioc.run();
    return joined;
}

} // namespace

TEST_SUITE("task_tracker") {
    TEST_CASE("a join with nothing tracked returns true at once") {
        net::io_context ioc;
        task_tracker t;
        const auto start = clock_type::now();
        CHECK(run_join(ioc, t, start + 10s) == true);
        CHECK(clock_type::now() - start < 5s);
    }

    TEST_CASE("a join wakes when the last token goes, before its deadline") {
        net::io_context ioc;
        task_tracker t;
        std::optional<task_tracker::token> a(t.enter());
        std::optional<task_tracker::token> b(t.enter());
        CHECK(t.active() == 2);
        // Both tokens go from handlers that run after the join started waiting.
        net::post(ioc, [&] { a.reset(); });
        net::post(ioc, [&] { net::post(ioc, [&] { b.reset(); }); });
        const auto start = clock_type::now();
        CHECK(run_join(ioc, t, start + 10s) == true);
        CHECK(t.active() == 0);
        CHECK(clock_type::now() - start < 5s); // woken, not timed out
    }

    TEST_CASE("a join gives up at its deadline while a token is held") {
        net::io_context ioc;
        task_tracker t;
        auto held = t.enter();
        CHECK(run_join(ioc, t, clock_type::now() + 20ms) == false);
        CHECK(t.active() == 1);
    }

    TEST_CASE("a moved token counts once") {
        task_tracker t;
        {
            auto a = t.enter();
            auto b = std::move(a);
            CHECK(t.active() == 1);
        }
        CHECK(t.active() == 0);
    }

    TEST_CASE("a join destroyed unfinished leaves the tracker usable") {
        task_tracker t;
        auto held = t.enter();
        {
            net::io_context ioc;
            net::co_spawn(
                ioc,
                [&]() -> net::awaitable<void> { co_await t.async_join(clock_type::now() + 10s); },
                net::detached);
            ioc.run_for(10ms); // the join is suspended; the context is destroyed with it
        }
        { auto released = std::move(held); } // must not touch the destroyed join's timer
        CHECK(t.active() == 0);
    }
}
