#include "support/redis_sentinel_set.hpp"

#include <signal.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace onceproxy::test {

namespace {

using namespace std::chrono_literals;

std::string quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    return out + "'";
}

/// Runs a shell command; its stdout+stderr, or "" when it cannot run or fails.
std::string run_cli(const std::string& cmd) {
    FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
    if (pipe == nullptr) {
        return {};
    }
    std::string out;
    std::array<char, 4096> buf{};
    std::size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) {
        out.append(buf.data(), n);
    }
    return ::pclose(pipe) == 0 ? out : std::string{};
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        out.push_back(line);
    }
    return out;
}

/// The value after `field` in redis-cli's one-per-line output of a flat field/value reply.
std::string field_value(const std::string& text, const std::string& field) {
    const auto l = lines(text);
    for (std::size_t i = 0; i + 1 < l.size(); ++i) {
        if (l[i] == field) {
            return l[i + 1];
        }
    }
    return {};
}

} // namespace

redis_sentinel_set::redis_sentinel_set(redis_sentinel_set_options options)
    : options_(std::move(options)) {
    // A replica's first sync starts at once (not after the default 5 s of a diskless sync).
    redis_server_options mo;
    mo.extra_args = {"--repl-diskless-sync-delay", "0"};
    nodes_.push_back(std::make_unique<redis_server>(mo));
    const std::string master = std::to_string(nodes_.front()->port());
    for (int i = 0; i < 2; ++i) {
        redis_server_options o;
        o.extra_args = {"--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", master};
        nodes_.push_back(std::make_unique<redis_server>(o));
    }
    for (int i = 0; i < 3; ++i) {
        sentinel s;
        s.port = free_port();
        s.dir = std::make_unique<temp_dir>();
        std::string conf = "port " + std::to_string(s.port) +
                           "\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir " +
                           s.dir->path() + "\nsentinel monitor " + name_ + " 127.0.0.1 " + master +
                           " 2\nsentinel down-after-milliseconds " + name_ +
                           " 1000\nsentinel failover-timeout " + name_ +
                           " 4000\nsentinel parallel-syncs " + name_ + " 2\n";
        if (!options_.sentinel_password.empty()) {
            conf += "requirepass \"" + options_.sentinel_password + "\"\n";
        }
        const std::string file = s.dir->write("sentinel.conf", conf);
        s.proc = process({REDIS_SERVER_BIN, file, "--sentinel"}, s.dir->file("sentinel.log"));
        sentinels_.push_back(std::move(s));
    }
    if (!eventually([&] { return settled(nodes_.front()->port(), 2); }, 30s, 100ms)) {
        std::string logs;
        for (auto& s : sentinels_) {
            logs += s.proc.log();
        }
        throw std::runtime_error("the sentinel set did not settle within 30 s:\n" + logs);
    }
}

redis_sentinel_set::~redis_sentinel_set() {
    for (auto& s : sentinels_) {
        s.proc.signal(SIGKILL);
        s.proc.wait(5s);
    }
}

std::size_t redis_sentinel_set::sentinel_index(const std::string& node) const {
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
        if (node == "127.0.0.1:" + std::to_string(sentinels_[i].port)) {
            return i;
        }
    }
    throw std::runtime_error("no sentinel at " + node);
}

void redis_sentinel_set::kill_sentinel(std::size_t index) {
    auto& s = sentinels_.at(index);
    s.proc.signal(SIGKILL);
    s.proc.wait(5s);
    s.alive = false;
}

std::uint16_t redis_sentinel_set::new_master_after(std::uint16_t old,
                                                   std::chrono::milliseconds bound) {
    std::uint16_t now = 0;
    const bool moved = eventually(
        [&] {
            now = master_port();
            if (now == 0 || now == old) {
                return false;
            }
            try {
                return node(now).cli({"ROLE"}).rfind("master", 0) == 0;
            } catch (const std::exception&) {
                return false;
            }
        },
        bound, 100ms);
    return moved ? now : 0;
}

std::uint16_t redis_sentinel_set::switch_over(std::size_t via, std::chrono::milliseconds bound) {
    const auto until = std::chrono::steady_clock::now() + bound;
    const std::uint16_t old = master_port();
    std::string answer;
    const auto left = [&] {
        return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now()),
                        std::chrono::milliseconds(1));
    };
    // On a loaded machine a failover the sentinels accepted can still be aborted (the replica
    // they picked too slow to report its new role within failover-timeout): asked again then,
    // unless a new master was named meanwhile.
    std::uint16_t moved = 0;
    while (moved == 0 && std::chrono::steady_clock::now() < until) {
        // -NOGOODSLAVE while the replicas are not yet seen as healthy, -INPROGRESS while an
        // earlier failover ends: asked again.
        const bool accepted = eventually(
            [&] {
                const auto now = master_port();
                if (now != 0 && now != old) {
                    return true; // an earlier request went through after all
                }
                answer = sentinel_cli(via, {"SENTINEL", "FAILOVER", name_});
                return answer.rfind("OK", 0) == 0;
            },
            left(), 200ms);
        if (!accepted) {
            throw std::runtime_error("SENTINEL FAILOVER was refused: " + answer);
        }
        moved = new_master_after(old, std::min(left(), std::chrono::milliseconds(15'000)));
    }
    if (moved == 0) {
        throw std::runtime_error("no switch-over within the bound from the master on " +
                                 std::to_string(old));
    }
    // The old master is turned into a replica a few seconds later (the sentinels wait to see
    // it report the old role for a while): the set has settled once it has.
    if (!eventually([&] { return settled(master_port(), 2); }, left(), 100ms)) {
        throw std::runtime_error("the sentinel set did not settle after the switch-over");
    }
    return master_port();
}

std::vector<std::string> redis_sentinel_set::sentinel_nodes() const {
    std::vector<std::string> out;
    for (const auto& s : sentinels_) {
        out.push_back("127.0.0.1:" + std::to_string(s.port));
    }
    return out;
}

std::string redis_sentinel_set::sentinel_cli(std::size_t index,
                                             const std::vector<std::string>& args) const {
    std::string cmd =
        std::string(REDIS_CLI_BIN) + " -h 127.0.0.1 -p " + std::to_string(sentinels_[index].port);
    if (!options_.sentinel_password.empty()) {
        cmd += " --no-auth-warning -a " + quote(options_.sentinel_password);
    }
    for (const auto& a : args) {
        cmd += " " + quote(a);
    }
    return run_cli(cmd);
}

std::uint16_t redis_sentinel_set::master_port() const {
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
        const auto l = lines(sentinel_cli(i, {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", name_}));
        if (l.size() == 2) {
            try {
                return static_cast<std::uint16_t>(std::stoi(l[1]));
            } catch (const std::exception&) {
            }
        }
    }
    return 0;
}

std::vector<std::uint16_t> redis_sentinel_set::node_ports() const {
    std::vector<std::uint16_t> out;
    for (const auto& n : nodes_) {
        out.push_back(n->port());
    }
    return out;
}

redis_server& redis_sentinel_set::node(std::uint16_t port) {
    for (auto& n : nodes_) {
        if (n->port() == port) {
            return *n;
        }
    }
    throw std::runtime_error("no data node on port " + std::to_string(port));
}

bool redis_sentinel_set::settled(std::uint16_t master, std::size_t replicas) const {
    // Every sentinel names `master`, sees `replicas` replicas and the two other sentinels (the
    // quorum and the election of a failover need them).
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
        if (!sentinels_[i].alive) {
            continue;
        }
        const std::string info = sentinel_cli(i, {"SENTINEL", "MASTER", name_});
        if (field_value(info, "port") != std::to_string(master) ||
            field_value(info, "flags") != "master" ||
            field_value(info, "num-slaves") != std::to_string(replicas) ||
            field_value(info, "num-other-sentinels") != "2") {
            return false;
        }
    }
    for (const auto& n : nodes_) {
        if (n->port() == master) {
            try {
                // Synced, not only connected (WAIT counts online replicas only).
                const std::string info = n->cli({"INFO", "replication"});
                std::size_t online = 0;
                for (auto at = info.find("state=online"); at != std::string::npos;
                     at = info.find("state=online", at + 1)) {
                    ++online;
                }
                if (online != replicas) {
                    return false;
                }
            } catch (const std::exception&) {
                return false;
            }
        }
    }
    return true;
}

std::uint16_t redis_sentinel_set::fail_over(std::chrono::milliseconds bound) {
    const std::uint16_t old = master_port();
    redis_server& victim = node(old);
    victim.kill();
    const std::uint16_t now = new_master_after(old, bound);
    if (now == 0) {
        throw std::runtime_error("no failover within the bound after killing the master on " +
                                 std::to_string(old));
    }
    // Back as a replica (the sentinels reconfigure it), so the next failover has two again.
    victim.start();
    // Settled on whichever node the sentinels name by then (a slow node may be failed over
    // again meanwhile).
    eventually([&] { return settled(master_port(), 2); }, 30s, 100ms);
    return now;
}

} // namespace onceproxy::test
