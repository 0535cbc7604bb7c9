#include <onceproxy/core/request_facts.hpp>

#include <onceproxy/core/exchange_fsm.hpp>
#include <onceproxy/core/fingerprint.hpp>
#include <onceproxy/core/idempotency_key.hpp>

#include <array>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace onceproxy::core {

namespace {

/// The key of the request, or why there is none.
std::optional<std::string> find_key(const config::key_config& cfg, const request_view& req,
                                    key_presence& presence) {
    if (!cfg.json_pointer.empty()) {
        auto key = extract_json_pointer(req.body, cfg.json_pointer);
        if (!key) {
            presence = key_presence::missing;
        } else if (key->empty() || key->size() > cfg.max_length) {
            presence = key_presence::invalid;
        }
        return key;
    }
    // Two lines are as many as parsing looks at: more than one is never a key.
    std::array<std::string_view, 2> lines;
    std::size_t count = 0;
    for (const auto& [name, value] : req.headers) {
        if (ascii_iequals(name, cfg.header)) {
            lines[count++] = value;
            if (count == lines.size()) {
                break;
            }
        }
    }
    if (count == 0) {
        presence = key_presence::missing;
        return std::nullopt;
    }
    auto parsed = parse_idempotency_key(std::span(lines.data(), count), cfg.syntax, cfg.max_length);
    if (!parsed.ok()) {
        presence = key_presence::invalid;
    }
    return std::move(parsed.key);
}

/// The configured headers present in `req`, in configured order (repeated lines in arrival
/// order), named as configured; `skip` is left out.
std::vector<header_view> collect(const request_view& req, const std::vector<std::string>& names,
                                 std::string_view skip) {
    std::vector<header_view> out;
    for (const auto& n : names) {
        if (!skip.empty() && ascii_iequals(n, skip)) {
            continue;
        }
        for (const auto& [name, value] : req.headers) {
            if (ascii_iequals(name, n)) {
                out.emplace_back(n, value);
            }
        }
    }
    return out;
}

/// A key header the upstream never sees (key.forward: false) is not part of the request.
/// (Not a conditional expression: `cond ? header : ""` is a temporary std::string.)
std::string_view unforwarded_key_header(const config::idempotency_config& policy) {
    std::string_view skip;
    if (policy.key.json_pointer.empty() && !policy.key.forward) {
        skip = policy.key.header;
    }
    return skip;
}

/// The scope headers of `req`, with the certificate's subject when the policy scopes by it.
std::vector<header_view> scope_of(const config::idempotency_config& policy,
                                  const request_view& req) {
    auto scope = collect(req, policy.scope_headers, unforwarded_key_header(policy));
    if (policy.principal == config::principal_source::client_cert) {
        // A name no header can have: a header cannot pose as the certificate.
        scope.emplace_back(":client-certificate", req.client_cert_subject);
    }
    return scope;
}

/// No scope header and no client certificate: nothing names the caller (see
/// derived_request::holder).
bool anonymous(const config::idempotency_config& policy, const request_view& req,
               const std::vector<header_view>& scope) {
    if (policy.principal == config::principal_source::client_cert) {
        return req.client_cert_subject.empty() && scope.size() == 1;
    }
    return scope.empty();
}

/// `tag` followed by `s`.
std::string tagged(char tag, std::string_view s) {
    std::string out;
    out.reserve(1 + s.size());
    out += tag;
    out += s;
    return out;
}

} // namespace

std::string scoped_store_key(const config::idempotency_config& policy, std::string_view route_name,
                             const request_view& req, std::string_view key) {
    return store_key("", route_name, principal_hash(scope_of(policy, req)), key);
}

derived_request derive_request_facts(const config::idempotency_config& policy,
                                     std::string_view route_name, const request_view& req) {
    derived_request out;
    out.facts.guarded = guards_method(policy, req.method);
    out.facts.key = key_presence::present;
    const auto key = find_key(policy.key, req, out.facts.key);
    if (out.facts.key != key_presence::present) {
        return out;
    }
    const std::string_view skip = unforwarded_key_header(policy);
    const auto scope = scope_of(policy, req);
    // Nobody named (no scope configured, or none of its headers sent): the same hash for every
    // such request, computed once.
    static const std::string nobody = principal_hash({});
    std::string named;
    if (!scope.empty()) {
        named = principal_hash(scope);
    }
    const std::string& principal = scope.empty() ? nobody : named;
    out.store_key = store_key("", route_name, principal, *key);
    out.holder =
        anonymous(policy, req, scope) ? tagged('a', req.client_address) : tagged('p', principal);
    fingerprint_input fi;
    fi.method = req.method;
    fi.target = req.target;
    fi.headers = collect(req, policy.fingerprint_headers, skip);
    fi.content_type = req.value("Content-Type");
    fi.body = req.body;
    fi.json_canonical = policy.json_canonical;
    out.fingerprint = compute_fingerprint(fi);
    return out;
}

} // namespace onceproxy::core
