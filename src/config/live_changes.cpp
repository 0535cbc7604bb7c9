#include "onceproxy/config/live_changes.hpp"

namespace onceproxy::config {

namespace {

/// What is bound at start: whether TLS is served, and where. The files, the client CAs and the
/// polling interval apply live (new connections get them; open ones keep theirs).
bool same_tls(const std::optional<tls_files>& a, const std::optional<tls_files>& b) {
    if (a.has_value() != b.has_value()) {
        return false;
    }
    return !a || a->listen == b->listen;
}

/// The readiness settings as written: the index of the checked upstream is left out (a reorder
/// of `upstreams` is no change; the upstream's own settings are compared by checked_upstream).
bool same_readiness(const readiness_config& a, const readiness_config& b) {
    if (a.require_store != b.require_store || a.upstream.has_value() != b.upstream.has_value()) {
        return false;
    }
    if (!a.upstream) {
        return true;
    }
    auto x = *a.upstream;
    x.upstream_index = b.upstream->upstream_index;
    return x == *b.upstream;
}

/// The upstream a readiness check probes; nullptr when there is no check.
const upstream_config* checked_upstream(const config& c) {
    const auto& check = c.admin.readiness.upstream;
    if (!check || check->upstream_index >= c.upstreams.size()) {
        return nullptr;
    }
    return &c.upstreams[check->upstream_index];
}

} // namespace

std::vector<std::string> changes_needing_restart(const config& running, const config& next) {
    std::vector<std::string> out;
    const auto changed = [&out](bool differs, const char* path) {
        if (differs) {
            out.emplace_back(path);
        }
    };
    changed(running.listen != next.listen, "listen");
    changed(!same_tls(running.tls, next.tls), "tls (on or off, tls.listen)");
    changed(running.admin.listen != next.admin.listen, "admin.listen");
    changed(running.http2 != next.http2, "http2");
    // The egress listener is bound at start; its routes, budget and breaker apply live.
    changed(running.egress.has_value() != next.egress.has_value() ||
                (running.egress && running.egress->listen != next.egress->listen),
            "egress (on or off, egress.listen)");
    changed(!same_readiness(running.admin.readiness, next.admin.readiness), "admin.readiness");
    changed(running.admin.keys_api != next.admin.keys_api, "admin.keys_api");
    changed(running.admin.max_connections != next.admin.max_connections ||
                running.admin.header_timeout != next.admin.header_timeout ||
                running.admin.idle_timeout != next.admin.idle_timeout,
            "admin.max_connections, admin.header_timeout, admin.idle_timeout");
    const auto* checked_before = checked_upstream(running);
    const auto* checked_after = checked_upstream(next);
    changed(checked_before != nullptr && checked_after != nullptr &&
                *checked_before != *checked_after,
            "admin.readiness.upstream (the settings of the upstream it checks)");
    changed(running.workers != next.workers, "workers");
    changed(running.store.type != next.store.type, "store.type");
    changed(running.store.memory != next.store.memory, "store.memory");
    const auto& a = running.store.redis;
    const auto& b = next.store.redis;
    changed(a.url != b.url, "store.redis.url");
    changed(a.sentinel != b.sentinel, "store.redis.sentinel");
    changed(a.durability != b.durability || a.replicas != b.replicas ||
                a.wait_timeout != b.wait_timeout,
            "store.redis.durability (replicas, wait_timeout)");
    changed(a.cluster != b.cluster, "store.redis.cluster");
    changed(a.key_prefix != b.key_prefix, "store.redis.key_prefix");
    changed(a.connect_timeout != b.connect_timeout, "store.redis.connect_timeout");
    changed(a.command_timeout != b.command_timeout, "store.redis.command_timeout");
    changed(a.connections_per_worker != b.connections_per_worker,
            "store.redis.connections_per_worker");
    changed(a.health_check_interval != b.health_check_interval,
            "store.redis.health_check_interval");
    changed(a.maxmemory_policy != b.maxmemory_policy, "store.redis.maxmemory_policy");
    changed(a.tls_ca_file != b.tls_ca_file, "store.redis.tls_ca_file");
    changed(a.username != b.username, "store.redis.username");
    changed(a.password_file != b.password_file, "store.redis.password_file");
    // The content of an unchanged password_file may change (a rotated Secret); a password
    // written in the config itself is bound at start like the URL.
    changed(a.password_file.empty() && a.password != b.password, "store.redis.password");
    const auto& pa = running.store.postgres;
    const auto& pb = next.store.postgres;
    changed(pa.url != pb.url, "store.postgres.url");
    changed(pa.password_file != pb.password_file, "store.postgres.password_file");
    // As for Redis: a rotated Secret behind an unchanged password_file is no restart.
    changed(pa.password_file.empty() && pa.password != pb.password, "store.postgres.password");
    changed(pa.sslmode != pb.sslmode, "store.postgres.sslmode");
    changed(pa.ssl_root_cert != pb.ssl_root_cert, "store.postgres.ssl_root_cert");
    changed(pa.table != pb.table, "store.postgres.table");
    changed(pa.key_prefix != pb.key_prefix, "store.postgres.key_prefix");
    changed(pa.pool != pb.pool, "store.postgres.pool");
    changed(pa.connect_timeout != pb.connect_timeout, "store.postgres.connect_timeout");
    changed(pa.statement_timeout != pb.statement_timeout, "store.postgres.statement_timeout");
    changed(pa.migrate != pb.migrate, "store.postgres.migrate");
    changed(pa.sweep_interval != pb.sweep_interval, "store.postgres.sweep_interval");
    changed(pa.lookup_before_claim != pb.lookup_before_claim, "store.postgres.lookup_before_claim");
    return out;
}

} // namespace onceproxy::config
