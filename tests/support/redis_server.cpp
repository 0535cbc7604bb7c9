#include "support/redis_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace onceproxy::test {

namespace {

bool accepts_connections(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        return false;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
}

} // namespace

redis_server::redis_server(redis_server_options options)
    : options_(std::move(options)), port_(free_port()) {
    start();
}

redis_server::~redis_server() = default; // process: SIGKILL + reap

std::string redis_server::url() const {
    return std::string(options_.tls ? "rediss" : "redis") + "://127.0.0.1:" + std::to_string(port_);
}

void redis_server::start() {
    std::vector<std::string> argv{
        REDIS_SERVER_BIN, "--bind", "127.0.0.1",        "--dir", dir_.path(), "--save", "",
        "--daemonize",    "no",     "--protected-mode", "no"};
    const std::string port = std::to_string(port_);
    if (options_.tls) {
        argv.insert(argv.end(),
                    {"--port", "0", "--tls-port", port, "--tls-cert-file", options_.tls->cert_file,
                     "--tls-key-file", options_.tls->key_file, "--tls-ca-cert-file",
                     options_.tls->ca_file, "--tls-auth-clients", "no"});
    } else {
        argv.insert(argv.end(), {"--port", port});
    }
    argv.insert(argv.end(), {"--appendonly", options_.appendonly ? "yes" : "no"});
    if (!options_.requirepass.empty()) {
        argv.insert(argv.end(), {"--requirepass", options_.requirepass});
    }
    argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
    proc_ = process(argv, dir_.file("redis.log"));
    const bool up = eventually([&] { return accepts_connections(port_) || !proc_.running(); },
                               std::chrono::seconds(10), std::chrono::milliseconds(10));
    if (!proc_.running()) {
        throw std::runtime_error("redis-server (" REDIS_SERVER_BIN ") exited at start-up:\n" +
                                 proc_.log());
    }
    if (!up) {
        throw std::runtime_error("redis-server did not accept connections within 10 s:\n" +
                                 proc_.log());
    }
}

void redis_server::stop() {
    if (!proc_.running()) {
        return;
    }
    proc_.signal(SIGTERM);
    proc_.signal(SIGCONT); // a paused server handles SIGTERM only once it runs again
    if (proc_.wait(std::chrono::milliseconds(5'000)) == -1) {
        proc_.signal(SIGKILL);
        proc_.wait(std::chrono::milliseconds(5'000));
    }
}

void redis_server::pause() {
    if (proc_.running()) {
        proc_.signal(SIGSTOP);
    }
}

void redis_server::resume() {
    if (proc_.running()) {
        proc_.signal(SIGCONT);
    }
}

void redis_server::kill() {
    if (proc_.running()) {
        proc_.signal(SIGKILL);
        proc_.wait(std::chrono::milliseconds(5'000));
    }
}

std::string redis_server::cli(const std::vector<std::string>& args) const {
    std::string cmd = std::string(REDIS_CLI_BIN) + " -h 127.0.0.1 -p " + std::to_string(port_);
    if (!options_.requirepass.empty()) {
        cmd += " --no-auth-warning -a " + shell_quote(options_.requirepass);
    }
    if (options_.tls) {
        cmd += " --tls --cacert " + shell_quote(options_.tls->ca_file);
    }
    for (const auto& a : args) {
        cmd += " " + shell_quote(a);
    }
    cmd += " 2>&1";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) {
        throw std::runtime_error("cannot run " + cmd);
    }
    std::string out;
    std::array<char, 4096> buf{};
    std::size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) {
        out.append(buf.data(), n);
    }
    if (::pclose(pipe) != 0) {
        throw std::runtime_error("redis-cli failed: " + cmd + "\n" + out);
    }
    return out;
}

long long redis_server::command_calls(const std::string& command) const {
    const std::string stats = cli({"INFO", "commandstats"});
    const std::string needle = "cmdstat_" + command + ":calls=";
    const auto at = stats.find(needle);
    if (at == std::string::npos) {
        return 0;
    }
    return std::stoll(stats.substr(at + needle.size()));
}

} // namespace onceproxy::test
