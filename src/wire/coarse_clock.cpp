#include "onceproxy/wire/coarse_clock.hpp"

#include <time.h>

namespace onceproxy::wire {

namespace {

using std::chrono::steady_clock;

steady_clock::duration to_duration(const timespec& t) {
    return std::chrono::duration_cast<steady_clock::duration>(std::chrono::seconds(t.tv_sec) +
                                                              std::chrono::nanoseconds(t.tv_nsec));
}

steady_clock::duration read_margin() noexcept {
    timespec r{};
    if (::clock_getres(CLOCK_MONOTONIC_COARSE, &r) != 0) {
        // Not reached on Linux (the clock exists since 2.6.32); a jiffy at HZ=100 is the
        // coarsest there is.
        return 2 * std::chrono::milliseconds(10);
    }
    return 2 * to_duration(r);
}

} // namespace

steady_clock::duration coarse_margin() noexcept {
    static const steady_clock::duration margin = read_margin();
    return margin;
}

steady_clock::time_point coarse_now() noexcept {
    timespec t{};
    if (::clock_gettime(CLOCK_MONOTONIC_COARSE, &t) != 0) {
        return steady_clock::now(); // not reached on Linux; the contract holds all the same
    }
    return steady_clock::time_point(to_duration(t) + coarse_margin());
}

std::chrono::system_clock::time_point coarse_wall_now() noexcept {
    timespec t{};
    if (::clock_gettime(CLOCK_REALTIME_COARSE, &t) != 0) {
        return std::chrono::system_clock::now(); // not reached on Linux
    }
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec)));
}

} // namespace onceproxy::wire
