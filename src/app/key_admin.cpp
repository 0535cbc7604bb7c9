#include "app/key_admin.hpp"

#include "onceproxy/core/record_cipher.hpp"
#include "onceproxy/core/request_facts.hpp"
#include "onceproxy/core/response_record.hpp"
#include "onceproxy/log/log.hpp"
#include "onceproxy/text/ows.hpp"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <cstdio>
#include <ctime>
#include <optional>
#include <utility>

namespace onceproxy::app {

namespace {

/// RFC 3339 in UTC with milliseconds, e.g. "2026-11-23T17:30:00.000Z".
std::string rfc3339(std::chrono::system_clock::time_point t) {
    const auto ms = std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch()).count();
    const std::time_t secs = static_cast<std::time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
    const long long frac = ms - static_cast<long long>(secs) * 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[40];
    const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    char out[64];
    std::snprintf(out, sizeof out, "%.*s.%03lldZ", static_cast<int>(n), buf, frac);
    return out;
}

const char* state_name(store::key_state s) noexcept {
    switch (s) {
    case store::key_state::absent:
        return "absent";
    case store::key_state::in_flight:
        return "in_flight";
    case store::key_state::completed:
        return "completed";
    }
    return "absent";
}

} // namespace

std::variant<resolved_key, std::string> resolve_key(const config::config& cfg,
                                                    const key_address& a) {
    const config::route_config* route = nullptr;
    for (const auto& r : cfg.routes) {
        if (r.name == a.route) {
            route = &r;
            break;
        }
    }
    if (a.route.empty()) {
        return std::string("route is required (a route name of the config)");
    }
    if (route == nullptr) {
        return "no route named '" + a.route + "' in the config";
    }
    const auto& policy = route->idempotency;
    if (a.key.empty()) {
        return std::string("key is required (the idempotency key as the client sends it)");
    }
    if (a.key.size() > policy.key.max_length) {
        return "key is longer than the route's key.max_length (" +
               std::to_string(policy.key.max_length) + ")";
    }
    // The principal as the request's scope headers (and, on a client_cert route, the
    // certificate subject): the same hashing as the request path.
    const bool by_cert = policy.principal == config::principal_source::client_cert;
    std::optional<std::string_view> subject;
    std::vector<core::header_view> headers;
    for (const auto& p : a.principal) {
        const std::string_view entry(p);
        const auto colon = entry.find(':');
        bool named = false;
        if (colon != std::string_view::npos) {
            const auto name = text::trim_ows(entry.substr(0, colon));
            for (const auto& h : policy.scope_headers) {
                if (core::ascii_iequals(h, name)) {
                    headers.emplace_back(h, text::trim_ows(entry.substr(colon + 1)));
                    named = true;
                    break;
                }
            }
        }
        if (!named && by_cert) {
            if (subject) {
                return "route '" + a.route +
                       "' scopes keys by client certificate: give its subject once (other "
                       "principal entries name a scope header, 'Header-Name: value')";
            }
            subject = text::trim_ows(entry);
        } else if (!named) {
            if (policy.scope_headers.empty()) {
                return "route '" + a.route +
                       "' has no scope headers: every caller shares one "
                       "principal, so give no principal";
            }
            headers.emplace_back(policy.scope_headers.front(), text::trim_ows(entry));
        }
    }
    core::request_view view;
    view.headers = headers;
    view.client_cert_subject = subject.value_or(std::string_view{});
    resolved_key out;
    out.route = route;
    out.store_key = core::scoped_store_key(policy, route->name, view, a.key);
    return out;
}

std::string describe_key(const resolved_key& k, const store::key_info& info,
                         std::chrono::system_clock::time_point now,
                         const config::encryption_config& encryption) {
    boost::json::object o;
    o["route"] = k.route->name;
    o["key_hash"] = k.store_key;
    o["state"] = state_name(info.state);
    if (info.state == store::key_state::in_flight) {
        o["lease_left_ms"] = info.remaining.count();
        if (info.owner_age.count() >= 0) {
            o["owner_age_ms"] = info.owner_age.count();
        } else {
            o["owner_age_ms"] = nullptr; // a lease taken by a version that did not note it
        }
    } else if (info.state == store::key_state::completed) {
        const auto expires = now + info.remaining;
        // The record was kept for the route's ttl from its completion.
        o["recorded_at"] = rfc3339(expires - k.route->idempotency.ttl);
        o["expires_at"] = rfc3339(expires);
        o["expires_in_ms"] = info.remaining.count();
        // Opened and decoded as the replay path does: what a retry would get.
        std::optional<core::record_cipher> cipher;
        if (!encryption.keys.empty()) {
            std::vector<core::record_key> keys;
            for (const auto& key : encryption.keys) {
                keys.push_back({key.id, key.bytes});
            }
            cipher.emplace(std::move(keys));
        }
        const core::record_binding bound{k.store_key, info.fingerprint, info.created_ms};
        const auto rec =
            core::decode_stored_record(info.record, cipher ? &*cipher : nullptr, bound);
        o["readable"] = rec.has_value();
        if (rec) {
            o["status"] = rec->status;
            o["body_bytes"] = rec->body.size();
            o["replayable"] = rec->replayable;
        } else {
            o["replayable"] = false;
        }
    }
    return boost::json::serialize(o);
}

std::string describe_purge(const resolved_key& k, store::purge_status result, bool force) {
    boost::json::object o;
    o["route"] = k.route->name;
    o["key_hash"] = k.store_key;
    o["force"] = force;
    switch (result) {
    case store::purge_status::absent:
        o["purged"] = false;
        o["was"] = "absent";
        break;
    case store::purge_status::purged_record:
        o["purged"] = true;
        o["was"] = "completed";
        break;
    case store::purge_status::purged_lease:
        o["purged"] = true;
        o["was"] = "in_flight";
        o["owner_fenced"] = true;
        break;
    case store::purge_status::in_flight:
        o["purged"] = false;
        o["was"] = "in_flight";
        break;
    }
    return boost::json::serialize(o);
}

void note_purge(const resolved_key& k, store::purge_status result, std::string_view via,
                metrics::registry* reg) {
    if (result != store::purge_status::purged_record &&
        result != store::purge_status::purged_lease) {
        return;
    }
    const bool forced = result == store::purge_status::purged_lease;
    if (reg != nullptr) {
        reg->route_named(k.route->name).counter(metrics::family::keys_purged, forced).inc();
    }
    log::warn("admin",
              forced ? "idempotency key purged while in flight: its owner is fenced, a retry "
                       "executes again"
                     : "idempotency key purged: a retry executes again",
              {{"route", k.route->name},
               {"key_hash", k.store_key},
               {"was", forced ? "in_flight" : "completed"},
               {"forced", forced},
               {"via", via}});
}

} // namespace onceproxy::app
