#pragma once
// The proxy's own log lines written while a piece of code runs, for unit tests: log::write is
// pointed at a pipe for the duration (small amounts only: the pipe's buffer must hold them).

#include "onceproxy/log/log.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <string>

namespace onceproxy::test {

/// Everything written through log::write while `body` runs.
template <class Body>
std::string captured_log(Body body) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    log::set_fd(fds[1]);
    body();
    log::set_fd(STDERR_FILENO);
    ::close(fds[1]);
    std::string out;
    char buf[4096];
    for (;;) {
        const auto n = ::read(fds[0], buf, sizeof buf);
        if (n <= 0) {
            break;
        }
        out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fds[0]);
    return out;
}

} // namespace onceproxy::test
