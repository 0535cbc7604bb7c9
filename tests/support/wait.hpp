#pragma once
// Waiting for what a test observes (a port file, a log line, a metric, a state from the admin
// API, a process exit) instead of for a stretch of time. This is the one place in the tests that
// polls: a check every few milliseconds, backing off to `step`, until a deadline.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <thread>

namespace onceproxy::test {

/// Polls `done` until it holds (true) or `bound` has passed (false, after one last check). The
/// first checks follow each other closely (1 ms, doubling) so a quick event costs little; the
/// interval never exceeds `step`.
template <class Pred>
bool eventually(Pred&& done, std::chrono::milliseconds bound = std::chrono::seconds(10),
                std::chrono::milliseconds step = std::chrono::milliseconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    auto pause = std::min(std::chrono::milliseconds(1), step);
    while (std::chrono::steady_clock::now() < deadline) {
        if (done()) {
            return true;
        }
        std::this_thread::sleep_for(pause); // the one polling interval of the tests
        pause = std::min(pause * 2, step);
    }
    return done();
}

/// Waits as `eventually` does and fails the test (REQUIRE-like: the test case stops) when
/// `bound` passes first, naming `what` ("the upstream has the request", ...).
template <class Pred>
void wait_until(Pred&& done, std::chrono::milliseconds bound, std::string_view what,
                std::chrono::milliseconds step = std::chrono::milliseconds(20)) {
    if (!eventually(done, bound, step)) {
        FAIL("waited " << bound.count() << " ms in vain for: " << what);
    }
}

} // namespace onceproxy::test
