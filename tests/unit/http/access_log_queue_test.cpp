#include "http/access_log_queue.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

using onceproxy::http::access_log_queue;
using onceproxy::http::access_log_writer;
using namespace std::chrono_literals;
using push_result = access_log_queue::push_result;

namespace {

/// Runs `act` on a thread of its own a moment later, once the test thread is blocked in take().
/// Real time is the subject: the queue does not show that its writer waits.
template <class Act>
std::thread after_take_blocks(Act act) {
    return std::thread([act] {
        std::this_thread::sleep_for(20ms);
        act();
    });
}

} // namespace

TEST_SUITE("access_log_queue") {

    TEST_CASE("lines come out whole and in order, in one batch") {
        access_log_queue q(1024);
        CHECK(q.push("a\n") == push_result::queued);
        CHECK(q.push("bb\n") == push_result::queued);
        CHECK(q.pending_bytes() == 5);
        std::string out = "stale";
        REQUIRE(q.take(out, 0ms));
        CHECK(out == "a\nbb\n");
        CHECK(q.pending_bytes() == 0);
    }

    TEST_CASE("a line that does not fit is refused whole; room made by take() is usable again") {
        access_log_queue q(10);
        CHECK(q.push("12345678\n") == push_result::queued); // 9 bytes
        CHECK(q.push("xy\n") == push_result::full);
        CHECK(q.pending_bytes() == 9);
        CHECK(q.push("\n") == push_result::queued); // exactly at the capacity
        CHECK(q.push("\n") == push_result::full);
        std::string out;
        REQUIRE(q.take(out, 0ms));
        CHECK(out == "12345678\n\n");
        CHECK(q.push("xy\n") == push_result::queued);
        SUBCASE("a line longer than the whole capacity never fits") {
            CHECK(q.push("0123456789a\n") == push_result::full);
        }
    }

    TEST_CASE("close: pending lines are still taken, then take() says the end") {
        access_log_queue q(64);
        CHECK(q.push("last\n") == push_result::queued);
        q.close();
        CHECK(q.push("late\n") == push_result::closed);
        std::string out;
        REQUIRE(q.take(out, 1000ms)); // no lingering once closed
        CHECK(out == "last\n");
        CHECK_FALSE(q.take(out, 1000ms));
        CHECK(out.empty());
    }

    TEST_CASE("take() waits for a first line, then lingers for a batch") {
        access_log_queue q(1 << 20);
        std::string out;
        std::thread producer = after_take_blocks([&] {
            for (int i = 0; i < 100; ++i) {
                CHECK(q.push("line\n") == push_result::queued);
            }
        });
        const auto start = std::chrono::steady_clock::now();
        REQUIRE(q.take(out, 200ms));
        producer.join();
        CHECK(std::chrono::steady_clock::now() - start < 5s);
        std::size_t taken = out.size();
        while (taken < 500) {
            REQUIRE(q.take(out, 0ms));
            taken += out.size();
        }
        CHECK(taken == 500);
    }

    TEST_CASE("a closed queue wakes a waiting writer") {
        access_log_queue q(64);
        std::string out;
        std::thread closer = after_take_blocks([&] { q.close(); });
        CHECK_FALSE(q.take(out, 1000ms));
        closer.join();
    }

    TEST_CASE("writer: every line submitted by several threads reaches the fd once, whole, "
              "by stop() at the latest") {
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        std::string read_back;
        std::thread reader([&] {
            char buf[4096];
            for (;;) {
                const auto n = ::read(fds[0], buf, sizeof buf);
                if (n <= 0) {
                    break;
                }
                read_back.append(buf, static_cast<std::size_t>(n));
            }
        });
        std::size_t dropped = 0;
        {
            access_log_writer w(fds[1], 1 << 20, 50ms);
            std::vector<std::thread> workers;
            std::vector<std::size_t> drops(4, 0);
            for (int t = 0; t < 4; ++t) {
                workers.emplace_back([&, t] {
                    for (int i = 0; i < 1000; ++i) {
                        const auto line = "w" + std::to_string(t) + "-" + std::to_string(i) + "\n";
                        if (!w.submit(line)) {
                            ++drops[static_cast<std::size_t>(t)];
                        }
                    }
                });
            }
            for (auto& th : workers) {
                th.join();
            }
            for (auto d : drops) {
                dropped += d;
            }
            w.stop();                        // no line may be lost by stopping
            CHECK(w.submit("after-stop\n")); // written directly
        }
        ::close(fds[1]);
        reader.join();
        ::close(fds[0]);
        CHECK(dropped == 0);
        std::size_t lines = 0;
        for (char c : read_back) {
            lines += c == '\n' ? 1 : 0;
        }
        CHECK(lines == 4001);
        CHECK(read_back.find("w3-999\n") != std::string::npos);
        CHECK(read_back.rfind("after-stop\n") == read_back.size() - 11);
    }

    TEST_CASE("writer: a full buffer drops lines instead of blocking") {
        std::signal(SIGPIPE, SIG_IGN); // as the proxy does: a closed pipe is EPIPE, not a signal
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        // Nobody reads the pipe: once its kernel buffer is full the writer blocks in write(2),
        // and the queue behind it fills up. submit() must keep returning at once.
        std::size_t dropped = 0;
        const std::string line(1000, 'x');
        const auto start = std::chrono::steady_clock::now();
        access_log_writer w(fds[1], 16 * 1024, 1ms);
        for (int i = 0; i < 2000 && std::chrono::steady_clock::now() - start < 10s; ++i) {
            dropped += w.submit(line + "\n") ? 0 : 1;
        }
        CHECK(dropped > 0);
        ::close(fds[0]); // the blocked write fails (EPIPE): stop() can end the writer
        w.stop();
        ::close(fds[1]);
    }
}
