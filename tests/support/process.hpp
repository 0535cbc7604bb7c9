#pragma once
// Starts real programs (onceproxy, the test upstream, redis-server) for integration tests.
// The child's stdout/stderr go to a log file that is printed when a test fails to start it.

#include "support/wait.hpp"

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace onceproxy::test {

class process {
public:
    process() = default;
    /// fork + exec `argv`; output appended to `log_file`.
    process(std::vector<std::string> argv, std::string log_file);
    process(process&& o) noexcept;
    process& operator=(process&& o) noexcept;
    ~process(); ///< SIGKILL + reap if still running

    int pid() const noexcept { return pid_; }
    bool running();
    /// Sends `sig`.
    void signal(int sig);
    /// Waits up to `timeout` for exit; returns the exit status (or -1 on timeout, 128+sig when
    /// killed by a signal).
    int wait(std::chrono::milliseconds timeout);
    const std::string& log_file() const noexcept { return log_; }
    std::string log() const;

private:
    int pid_ = -1;
    int status_ = -1;
    std::string log_;
};

/// A fresh temporary directory (removed by the destructor).
class temp_dir {
public:
    temp_dir();
    ~temp_dir();
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    const std::string& path() const noexcept { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }
    /// Writes `content` to `name` in the directory and returns the full path.
    std::string write(const std::string& name, const std::string& content) const;

private:
    std::string path_;
};

/// Waits until `path` exists and is non-empty (bounded); returns its content or "".
std::string wait_for_file(const std::string& path, std::chrono::milliseconds timeout);

/// The whole content of the file `path`; "" when there is none.
std::string read_file(const std::string& path);

/// `s` quoted for sh: in single quotes, each ' written as '\''.
std::string shell_quote(const std::string& s);

/// How a command run to its end ended, and what it printed.
struct command_result {
    int status = -1; ///< exit status, -1 when it did not exit normally
    std::string output;
};

/// Runs `argv` (a client: curl, nghttp, h2load, a Python script) through sh under
/// `timeout 60`, stdin from /dev/null, stdout captured; stderr with it, or into `stderr_file`
/// when one is given.
command_result run_command(const std::vector<std::string>& argv,
                           const std::string& stderr_file = {});

/// A loopback port that was free a moment ago (bind 0, read, close).
unsigned short free_port();

/// An idempotency key no other test (of this run, or an earlier run against a reused Redis) has
/// used: "<suite>-<tag>-<pid>-<clock>-<counter>".
std::string unique_key(std::string_view suite, std::string_view tag);

} // namespace onceproxy::test
