#include "http/buffer_budget.hpp"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

using onceproxy::http::buffer_reservation;

TEST_CASE("reservations share one budget and refuse what does not fit") {
    std::atomic<std::int64_t> used{0};
    std::atomic<std::int64_t> limit{100};
    buffer_reservation a(used, limit);
    buffer_reservation b(used, limit);
    CHECK(a.try_grow_to(60));
    CHECK(a.try_grow_to(40)); // growing only: a smaller size changes nothing
    CHECK(a.bytes() == 60);
    CHECK(b.try_grow_to(40));
    CHECK(used == 100);
    CHECK_FALSE(b.try_grow_to(41));
    CHECK(b.bytes() == 40); // a refusal changes nothing
    CHECK(used == 100);
    a.release();
    CHECK(used == 40);
    CHECK(b.try_grow_to(100));
    CHECK(used == 100);
}

TEST_CASE("a forced growth is counted past the limit and blocks new reservations") {
    std::atomic<std::int64_t> used{0};
    std::atomic<std::int64_t> limit{100};
    buffer_reservation answer(used, limit);
    answer.force_grow_to(150);
    CHECK(used == 150);
    buffer_reservation next(used, limit);
    CHECK_FALSE(next.try_grow_to(1));
    CHECK(next.try_grow_to(0));
    answer.release();
    CHECK(used == 0);
    CHECK(next.try_grow_to(100));
}

TEST_CASE("a reservation gives its bytes back when destroyed or moved over") {
    std::atomic<std::int64_t> used{0};
    std::atomic<std::int64_t> limit{100};
    {
        buffer_reservation a(used, limit);
        CHECK(a.try_grow_to(30));
        buffer_reservation moved(std::move(a));
        CHECK(moved.bytes() == 30);
        CHECK(used == 30);
        buffer_reservation c(used, limit);
        CHECK(c.try_grow_to(20));
        c = std::move(moved); // c's own 20 bytes go back, moved's 30 stay held
        CHECK(used == 30);
    }
    CHECK(used == 0);
    buffer_reservation unbound;
    CHECK(unbound.try_grow_to(1'000'000));
    CHECK(unbound.bytes() == 0);
}

TEST_CASE("concurrent reservations never overshoot the limit") {
    std::atomic<std::int64_t> used{0};
    std::atomic<std::int64_t> limit{1000};
    std::atomic<int> admitted{0};
    std::atomic<bool> overshot{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 1000; ++i) {
                buffer_reservation r(used, limit);
                if (r.try_grow_to(300)) {
                    if (used.load() > 1000) {
                        overshot = true;
                    }
                    admitted.fetch_add(1);
                }
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    CHECK_FALSE(overshot);
    CHECK(used == 0);
    CHECK(admitted > 0);
}
