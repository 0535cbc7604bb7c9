#pragma once
// The idempotency block as written in YAML, before inheritance: every field optional, so
// "unset" differs from "set to the built-in default". Resolution is the nginx merge_conf
// pattern in one explicit step: route block over `defaults` block over built-in defaults
// (config.hpp's member initialisers), field by field.

#include "onceproxy/config/config.hpp"

#include <optional>
#include <string>
#include <vector>

namespace onceproxy::config {

struct idempotency_block {
    std::optional<idempotency_mode> mode;
    std::optional<std::vector<std::string>> methods;
    // The key source is one field made of two: a block that names `header` or `json_pointer`
    // replaces the inherited source as a whole, so a route's `json_pointer` is not shadowed by a
    // `header` inherited from defaults.
    std::optional<std::string> key_header;
    std::optional<std::string> key_json_pointer;
    std::optional<std::size_t> key_max_length;
    std::optional<key_syntax> key_syntax_value;
    std::optional<bool> key_forward;
    std::optional<std::vector<std::string>> scope_headers;
    std::optional<principal_source> principal;
    std::optional<std::vector<std::string>> fingerprint_headers;
    std::optional<bool> json_canonical;
    std::optional<duration> ttl;
    std::optional<duration> lease;
    std::optional<concurrent_policy> concurrent;
    std::optional<duration> wait_timeout;
    std::optional<unsigned> mismatch_status;
    std::optional<status_set> record;
    std::optional<status_set> release;
    std::optional<grpc_status_set> grpc_record;
    std::optional<grpc_status_set> grpc_release;
    std::optional<uncertain_policy> on_upstream_uncertain;
    std::optional<store_error_policy> on_store_error;
    std::optional<std::size_t> max_record_bytes;
    std::optional<bool> stripe_compat;
    std::optional<std::vector<std::string>> exclude_headers;
    std::optional<bool> record_set_cookie;
};

/// `child` over `parent`, field by field (a set child field wins).
idempotency_block merge(const idempotency_block& parent, const idempotency_block& child);

/// Fills every unset field from the built-in defaults.
idempotency_config resolve(const idempotency_block& block);

} // namespace onceproxy::config
