#include "support/process.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace onceproxy::test {

process::process(std::vector<std::string> argv, std::string log_file) : log_(std::move(log_file)) {
    std::vector<char*> args;
    for (auto& a : argv) {
        args.push_back(a.data());
    }
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) {
        throw std::runtime_error("fork failed");
    }
    if (pid_ == 0) {
        const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::close(fd);
        }
        ::setpgid(0, 0);
        ::execv(args[0], args.data());
        ::_exit(127);
    }
}

process::process(process&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), status_(o.status_), log_(std::move(o.log_)) {}

process& process::operator=(process&& o) noexcept {
    if (this != &o) {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        pid_ = std::exchange(o.pid_, -1);
        status_ = o.status_;
        log_ = std::move(o.log_);
    }
    return *this;
}

process::~process() {
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
}

bool process::running() {
    if (pid_ <= 0) {
        return false;
    }
    int st = 0;
    const auto r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pid_ = -1;
        return false;
    }
    return true;
}

void process::signal(int sig) {
    if (pid_ > 0) {
        ::kill(pid_, sig);
    }
}

int process::wait(std::chrono::milliseconds timeout) {
    if (!eventually([&] { return !running(); }, timeout, std::chrono::milliseconds(5))) {
        return -1;
    }
    return status_;
}

std::string process::log() const {
    return read_file(log_);
}

temp_dir::temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "onceproxy-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
        throw std::runtime_error("mkdtemp failed");
    }
    path_ = tmpl;
}

temp_dir::~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

std::string temp_dir::write(const std::string& name, const std::string& content) const {
    const auto p = file(name);
    std::ofstream(p, std::ios::binary) << content;
    return p;
}

std::string wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
    std::string text;
    eventually(
        [&] {
            text = read_file(path);
            return !text.empty();
        },
        timeout, std::chrono::milliseconds(10));
    return text;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out += c;
        }
    }
    return out + "'";
}

command_result run_command(const std::vector<std::string>& argv, const std::string& stderr_file) {
    std::string cmd = "timeout 60";
    for (const auto& a : argv) {
        cmd += ' ' + shell_quote(a);
    }
    cmd += stderr_file.empty() ? " 2>&1" : " 2>" + shell_quote(stderr_file);
    cmd += " </dev/null";
    command_result r;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) {
        return r;
    }
    std::array<char, 4096> buf{};
    while (const std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) {
        r.output.append(buf.data(), n);
    }
    const int st = ::pclose(pipe);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

unsigned short free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

std::string unique_key(std::string_view suite, std::string_view tag) {
    static std::atomic<unsigned> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    return std::string(suite) + "-" + std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
           std::to_string(now) + "-" + std::to_string(counter.fetch_add(1));
}

} // namespace onceproxy::test
