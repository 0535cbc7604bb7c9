#pragma once
// What the engine learns from a guarded request before its exchange starts (SPEC §3.1, §3.3-
// §3.5): whether it carries a usable idempotency key (header or natural key), the scoped store
// key and the request fingerprint. Pure, over the neutral request_view.

#include <onceproxy/config/config.hpp>
#include <onceproxy/core/request_view.hpp>

#include <string>
#include <string_view>

namespace onceproxy::core {

/// Whether a key was found in the request.
enum class key_presence {
    missing, ///< no key (header absent, natural key absent)
    invalid, ///< malformed, too long, repeated, empty
    present, ///< a valid key; the scoped store key and fingerprint are computed
};

/// What the exchange needs to know about the request before it starts (exchange_fsm::start).
struct request_facts {
    bool guarded = true; ///< route mode is not off and the method is guarded (guards_method)
    key_presence key = key_presence::present;
};

/// The facts plus what identifies the request in the store.
struct derived_request {
    request_facts facts;
    std::string store_key;   ///< scoped store key (hex hash); empty unless the key is present
    std::string fingerprint; ///< 32 raw bytes (compute_fingerprint); empty unless present
    /// Who the record is charged to in the store (claim_request::holder): 'p' and the
    /// principal's hash, or, for an anonymous request (no scope header, no client
    /// certificate), 'a' and the client address. Empty unless the key is present.
    std::string holder;
};

/// Derives the request facts of `req` on the route named `route_name` with `policy`:
/// - the key from the JSON pointer of the body (policy.key.json_pointer set; 1..max_length
///   characters), else from every line of the key header (parse_idempotency_key);
/// - the principal from the scope headers present (default Authorization and Cookie), hashed;
/// - the store key from (route, principal, key) and the fingerprint from method, target,
///   the fingerprint headers, Content-Type and body.
/// When the key header is not forwarded (policy.key.forward false), the upstream never sees it,
/// so it takes no part in scope or fingerprint. Never fails; throws only what
/// compute_fingerprint may (OpenSSL without SHA-256).
[[nodiscard]] derived_request derive_request_facts(const config::idempotency_config& policy,
                                                   std::string_view route_name,
                                                   const request_view& req);

/// The scoped store key of idempotency key `key` (already parsed: unquoted, as the request path
/// derives it) on route `route_name`, for the principal named by the scope headers present in
/// `req` (only its headers are read). derive_request_facts uses it; key administration uses it
/// to find the record of a request it did not receive.
[[nodiscard]] std::string scoped_store_key(const config::idempotency_config& policy,
                                           std::string_view route_name, const request_view& req,
                                           std::string_view key);

} // namespace onceproxy::core
