#include "support/redis_cluster.hpp"

#include <chrono>
#include <sstream>
#include <stdexcept>

namespace onceproxy::test {

namespace {

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') {
            line.pop_back();
        }
        out.push_back(line);
    }
    return out;
}

std::vector<std::string> words(const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    std::string w;
    while (in >> w) {
        out.push_back(w);
    }
    return out;
}

// The port of a CLUSTER NODES address "ip:port@cport[,hostname]".
std::uint16_t port_of(const std::string& address) {
    const auto colon = address.rfind(':', address.find('@'));
    return static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1)));
}

} // namespace

redis_cluster::redis_cluster(std::size_t masters, std::size_t replicas_per_master) {
    const std::size_t count = masters * (1 + replicas_per_master);
    for (std::size_t i = 0; i < count; ++i) {
        redis_server_options o;
        o.extra_args = {
            "--cluster-enabled",      "yes",  "--cluster-config-file",           "nodes.conf",
            "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"};
        // The bus port is given: the default (port + 10000) may be taken, or past 65535.
        o.extra_args.insert(o.extra_args.end(), {"--cluster-port", std::to_string(free_port())});
        nodes_.push_back(std::make_unique<redis_server>(o));
    }
    std::vector<std::string> args{"--cluster", "create"};
    for (const auto& a : addresses()) {
        args.push_back(a);
    }
    args.insert(args.end(),
                {"--cluster-replicas", std::to_string(replicas_per_master), "--cluster-yes"});
    nodes_.front()->cli(args);
    wait_until_stable();
}

redis_cluster::~redis_cluster() = default; // each redis_server: SIGKILL + reap

std::vector<redis_server*> redis_cluster::nodes() {
    std::vector<redis_server*> out;
    for (auto& n : nodes_) {
        out.push_back(n.get());
    }
    return out;
}

std::vector<std::string> redis_cluster::addresses() const {
    std::vector<std::string> out;
    for (const auto& n : nodes_) {
        out.push_back("127.0.0.1:" + std::to_string(n->port()));
    }
    return out;
}

redis_server& redis_cluster::node(std::uint16_t port) {
    for (auto& n : nodes_) {
        if (n->port() == port) {
            return *n;
        }
    }
    throw std::runtime_error("no cluster node on port " + std::to_string(port));
}

std::string redis_cluster::cli(std::uint16_t port, const std::vector<std::string>& args) {
    return node(port).cli(args);
}

std::vector<std::uint16_t> redis_cluster::master_ports() {
    std::vector<std::uint16_t> out;
    for (const auto& line : lines(nodes_.front()->cli({"CLUSTER", "NODES"}))) {
        const auto w = words(line);
        // id addr flags master-id ping pong epoch link-state slot...
        if (w.size() >= 9 && w[2].find("master") != std::string::npos &&
            w[2].find("fail") == std::string::npos) {
            out.push_back(port_of(w[1]));
        }
    }
    return out;
}

std::uint16_t redis_cluster::master_of_slot(std::uint16_t slot) {
    for (const auto& line : lines(nodes_.front()->cli({"CLUSTER", "NODES"}))) {
        const auto w = words(line);
        if (w.size() < 9 || w[2].find("master") == std::string::npos) {
            continue;
        }
        for (std::size_t i = 8; i < w.size(); ++i) {
            if (w[i].front() == '[') {
                continue; // a migrating/importing marker
            }
            const auto dash = w[i].find('-');
            const int from = std::stoi(w[i].substr(0, dash));
            const int to = dash == std::string::npos ? from : std::stoi(w[i].substr(dash + 1));
            if (slot >= from && slot <= to) {
                return port_of(w[1]);
            }
        }
    }
    throw std::runtime_error("no master serves slot " + std::to_string(slot));
}

std::string redis_cluster::node_id(std::uint16_t port) {
    std::string id = node(port).cli({"CLUSTER", "MYID"});
    while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) {
        id.pop_back();
    }
    return id;
}

void redis_cluster::begin_migration(std::uint16_t slot, std::uint16_t from_port,
                                    std::uint16_t to_port) {
    const std::string s = std::to_string(slot);
    cli(to_port, {"CLUSTER", "SETSLOT", s, "IMPORTING", node_id(from_port)});
    cli(from_port, {"CLUSTER", "SETSLOT", s, "MIGRATING", node_id(to_port)});
}

void redis_cluster::migrate_keys(std::uint16_t slot, std::uint16_t from_port, std::uint16_t to_port,
                                 std::vector<std::string> keys) {
    if (keys.empty()) {
        for (const auto& line :
             lines(cli(from_port, {"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "1000"}))) {
            if (!line.empty()) {
                keys.push_back(line);
            }
        }
    }
    if (keys.empty()) {
        return;
    }
    std::vector<std::string> args{"MIGRATE", "127.0.0.1", std::to_string(to_port), "", "0",
                                  "5000",    "KEYS"};
    args.insert(args.end(), keys.begin(), keys.end());
    const auto out = cli(from_port, args);
    if (out.find("OK") == std::string::npos && out.find("NOKEY") == std::string::npos) {
        throw std::runtime_error("MIGRATE failed: " + out);
    }
}

void redis_cluster::finish_migration(std::uint16_t slot, std::uint16_t to_port) {
    const std::string id = node_id(to_port);
    // The target first, then the source, then the other masters (as redis-cli does).
    std::vector<std::uint16_t> order{to_port};
    for (const auto p : master_ports()) {
        if (p != to_port) {
            order.push_back(p);
        }
    }
    for (const auto p : order) {
        cli(p, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", id});
    }
}

void redis_cluster::wait_until_stable(std::chrono::milliseconds bound) {
    std::string last;
    const auto stable = [&] {
        for (auto& n : nodes_) {
            last = n->cli({"CLUSTER", "INFO"});
            if (last.find("cluster_state:ok") == std::string::npos) {
                return false;
            }
        }
        // Every node agrees on the configuration (redis-cli --cluster check says so).
        try {
            last = nodes_.front()->cli({"--cluster", "check", addresses().front()});
        } catch (const std::exception& e) {
            last = e.what();
            return false;
        }
        return last.find("[OK] All nodes agree about slots configuration.") != std::string::npos &&
               last.find("[OK] All 16384 slots covered.") != std::string::npos;
    };
    if (!eventually(stable, bound, std::chrono::milliseconds(100))) {
        throw std::runtime_error("the Redis Cluster did not become stable:\n" + last);
    }
}

} // namespace onceproxy::test
