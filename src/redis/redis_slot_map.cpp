// The pure part of Redis Cluster support: hash slots, redirect replies, slot maps out of
// CLUSTER SHARDS / CLUSTER SLOTS replies. No I/O (the fuzz build compiles it on its own).
#include "onceproxy/redis/redis_cluster.hpp"

#include <algorithm>
#include <array>
#include <charconv>

namespace onceproxy::redis {

namespace {

// CRC16-XMODEM (polynomial 0x1021, initial value 0), the one of the Redis Cluster spec, a byte
// at a time from a table built at compile time (bit by bit, the data-dependent branches cost
// about 2 us per store key).
constexpr std::array<std::uint16_t, 256> crc16_table = [] {
    std::array<std::uint16_t, 256> t{};
    for (unsigned b = 0; b < 256; ++b) {
        auto crc = static_cast<std::uint16_t>(b << 8);
        for (int i = 0; i < 8; ++i) {
            crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                      : static_cast<std::uint16_t>(crc << 1);
        }
        t[b] = crc;
    }
    return t;
}();

std::uint16_t crc16(std::string_view data) noexcept {
    std::uint16_t crc = 0;
    for (const char ch : data) {
        const auto index = static_cast<unsigned char>((crc >> 8) ^ static_cast<unsigned char>(ch));
        crc = static_cast<std::uint16_t>((crc << 8) ^ crc16_table[index]);
    }
    return crc;
}

template <class T>
bool parse_number(std::string_view text, T& out) {
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc{} && ptr == text.data() + text.size();
}

// "host:port" (the host may hold colons: IPv6); nothing if malformed.
std::optional<redis_node_address> parse_address(std::string_view text) {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
        return std::nullopt;
    }
    unsigned port = 0;
    if (!parse_number(text.substr(colon + 1), port) || port == 0 || port > 65535) {
        return std::nullopt;
    }
    redis_node_address out;
    out.host = std::string(text.substr(0, colon));
    out.port = static_cast<std::uint16_t>(port);
    return out;
}

// An integer element (RESP2 integer, or a string of digits as some proxies send).
std::optional<long long> as_integer(const redis_reply& r) {
    if (r.type == redis_reply::kind::integer) {
        return r.integer;
    }
    long long v = 0;
    if (r.type == redis_reply::kind::string && parse_number(std::string_view(r.str), v)) {
        return v;
    }
    return std::nullopt;
}

// The value of `name` in a RESP2 flat key/value array, or nullptr.
const redis_reply* field(const redis_reply& map, std::string_view name) {
    if (map.type != redis_reply::kind::array) {
        return nullptr;
    }
    for (std::size_t i = 0; i + 1 < map.elements.size(); i += 2) {
        if (map.elements[i].str == name) {
            return &map.elements[i + 1];
        }
    }
    return nullptr;
}

bool assign(redis_slot_map& map, long long from, long long to, int owner) {
    if (from < 0 || to < from || to >= static_cast<long long>(redis_cluster_slots)) {
        return false;
    }
    for (auto s = from; s <= to; ++s) {
        map.owner[static_cast<std::size_t>(s)] = owner;
    }
    return true;
}

std::string known_host(const std::string& host, const redis_node_address& asked) {
    return host.empty() || host == "?" ? asked.host : host;
}

} // namespace

std::uint16_t redis_key_slot(std::string_view key) noexcept {
    const auto open = key.find('{');
    if (open != std::string_view::npos) {
        const auto close = key.find('}', open + 1);
        if (close != std::string_view::npos && close > open + 1) {
            key = key.substr(open + 1, close - open - 1);
        }
    }
    return static_cast<std::uint16_t>(crc16(key) & (redis_cluster_slots - 1));
}

std::optional<redis_redirect> parse_redirect(const redis_reply& reply) {
    redis_redirect out;
    std::size_t prefix = 0; // "MOVED " or "ASK ": the word and one space
    if (reply.is_error("MOVED")) {
        out.type = redis_redirect::kind::moved;
        prefix = 6;
    } else if (reply.is_error("ASK")) {
        out.type = redis_redirect::kind::ask;
        prefix = 4;
    } else {
        return std::nullopt;
    }
    const std::string_view text(reply.str);
    if (text.size() <= prefix || text[prefix - 1] != ' ') {
        return std::nullopt; // a bare "-ASK" or "-MOVED" (no slot, no address) is malformed
    }
    const std::string_view rest = text.substr(prefix);
    const auto space = rest.find(' ');
    unsigned slot = 0;
    if (space == std::string_view::npos || !parse_number(rest.substr(0, space), slot) ||
        slot >= redis_cluster_slots) {
        return std::nullopt;
    }
    auto target = parse_address(rest.substr(space + 1));
    if (!target) {
        return std::nullopt;
    }
    out.slot = static_cast<std::uint16_t>(slot);
    out.target = std::move(*target);
    return out;
}

int redis_slot_map::add_master(const redis_node_address& a) {
    auto it = std::find(masters.begin(), masters.end(), a);
    if (it != masters.end()) {
        return static_cast<int>(it - masters.begin());
    }
    masters.push_back(a);
    return static_cast<int>(masters.size() - 1);
}

std::size_t redis_slot_map::covered() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(owner.begin(), owner.end(), [](int o) { return o >= 0; }));
}

void redis_slot_map::keep_known(const redis_slot_map& before) {
    for (std::size_t slot = 0; slot < owner.size(); ++slot) {
        const int was = before.owner[slot];
        if (owner[slot] < 0 && was >= 0 && static_cast<std::size_t>(was) < before.masters.size()) {
            owner[slot] = add_master(before.masters[static_cast<std::size_t>(was)]);
        }
    }
}

std::optional<redis_slot_map> parse_cluster_shards(const redis_reply& reply,
                                                   const redis_node_address& asked, bool tls) {
    if (reply.type != redis_reply::kind::array) {
        return std::nullopt;
    }
    redis_slot_map map;
    for (const auto& shard : reply.elements) {
        const redis_reply* slots = field(shard, "slots");
        const redis_reply* nodes = field(shard, "nodes");
        if (slots == nullptr || nodes == nullptr || slots->type != redis_reply::kind::array ||
            nodes->type != redis_reply::kind::array || slots->elements.size() % 2 != 0) {
            return std::nullopt;
        }
        if (slots->elements.empty()) {
            continue; // a shard without slots (a fresh or emptied master)
        }
        std::optional<redis_node_address> master;
        for (const auto& node : nodes->elements) {
            const redis_reply* role = field(node, "role");
            if (role == nullptr || role->str != "master") {
                continue;
            }
            // After a failover, Redis 7.2+ and Valkey keep the failed old master in its shard,
            // still with role master: the promoted replica is the one to use.
            const redis_reply* health = field(node, "health");
            if (health != nullptr && health->str == "fail") {
                continue;
            }
            const redis_reply* endpoint = field(node, "endpoint");
            const redis_reply* ip = field(node, "ip");
            const redis_reply* port = field(node, tls ? "tls-port" : "port");
            const auto port_value = port != nullptr ? as_integer(*port) : std::nullopt;
            if (!port_value || *port_value <= 0 || *port_value > 65535) {
                return std::nullopt;
            }
            redis_node_address a;
            a.host = known_host(
                endpoint != nullptr ? endpoint->str : (ip != nullptr ? ip->str : ""), asked);
            a.port = static_cast<std::uint16_t>(*port_value);
            master = std::move(a);
            break;
        }
        if (!master) {
            continue; // no master known for these slots right now (failover under way)
        }
        const int owner = map.add_master(*master);
        for (std::size_t i = 0; i < slots->elements.size(); i += 2) {
            const auto from = as_integer(slots->elements[i]);
            const auto to = as_integer(slots->elements[i + 1]);
            if (!from || !to || !assign(map, *from, *to, owner)) {
                return std::nullopt;
            }
        }
    }
    return map;
}

std::optional<redis_slot_map> parse_cluster_slots(const redis_reply& reply,
                                                  const redis_node_address& asked) {
    if (reply.type != redis_reply::kind::array) {
        return std::nullopt;
    }
    redis_slot_map map;
    for (const auto& range : reply.elements) {
        if (range.type != redis_reply::kind::array || range.elements.size() < 3) {
            return std::nullopt;
        }
        const auto from = as_integer(range.elements[0]);
        const auto to = as_integer(range.elements[1]);
        const auto& node = range.elements[2];
        if (!from || !to || node.type != redis_reply::kind::array || node.elements.size() < 2) {
            return std::nullopt;
        }
        const auto port = as_integer(node.elements[1]);
        if (!port || *port <= 0 || *port > 65535) {
            return std::nullopt;
        }
        redis_node_address a;
        a.host = known_host(node.elements[0].str, asked);
        a.port = static_cast<std::uint16_t>(*port);
        if (!assign(map, *from, *to, map.add_master(a))) {
            return std::nullopt;
        }
    }
    return map;
}

} // namespace onceproxy::redis
