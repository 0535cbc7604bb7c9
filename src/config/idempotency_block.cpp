#include "config/idempotency_block.hpp"

namespace onceproxy::config {
namespace {

template <class T>
void inherit(std::optional<T>& out, const std::optional<T>& parent, const std::optional<T>& child) {
    out = child.has_value() ? child : parent;
}

template <class T>
void apply(T& out, const std::optional<T>& value) {
    if (value.has_value()) {
        out = *value;
    }
}

} // namespace

idempotency_block merge(const idempotency_block& parent, const idempotency_block& child) {
    idempotency_block out;
    inherit(out.mode, parent.mode, child.mode);
    inherit(out.methods, parent.methods, child.methods);
    if (child.key_header.has_value() || child.key_json_pointer.has_value()) {
        out.key_header = child.key_header;
        out.key_json_pointer = child.key_json_pointer;
    } else {
        out.key_header = parent.key_header;
        out.key_json_pointer = parent.key_json_pointer;
    }
    inherit(out.key_max_length, parent.key_max_length, child.key_max_length);
    inherit(out.key_syntax_value, parent.key_syntax_value, child.key_syntax_value);
    inherit(out.key_forward, parent.key_forward, child.key_forward);
    inherit(out.scope_headers, parent.scope_headers, child.scope_headers);
    inherit(out.principal, parent.principal, child.principal);
    inherit(out.fingerprint_headers, parent.fingerprint_headers, child.fingerprint_headers);
    inherit(out.json_canonical, parent.json_canonical, child.json_canonical);
    inherit(out.ttl, parent.ttl, child.ttl);
    inherit(out.lease, parent.lease, child.lease);
    inherit(out.concurrent, parent.concurrent, child.concurrent);
    inherit(out.wait_timeout, parent.wait_timeout, child.wait_timeout);
    inherit(out.mismatch_status, parent.mismatch_status, child.mismatch_status);
    inherit(out.record, parent.record, child.record);
    inherit(out.release, parent.release, child.release);
    inherit(out.grpc_record, parent.grpc_record, child.grpc_record);
    inherit(out.grpc_release, parent.grpc_release, child.grpc_release);
    inherit(out.on_upstream_uncertain, parent.on_upstream_uncertain, child.on_upstream_uncertain);
    inherit(out.on_store_error, parent.on_store_error, child.on_store_error);
    inherit(out.max_record_bytes, parent.max_record_bytes, child.max_record_bytes);
    inherit(out.stripe_compat, parent.stripe_compat, child.stripe_compat);
    inherit(out.exclude_headers, parent.exclude_headers, child.exclude_headers);
    inherit(out.record_set_cookie, parent.record_set_cookie, child.record_set_cookie);
    return out;
}

idempotency_config resolve(const idempotency_block& block) {
    idempotency_config out; // built-in defaults: config.hpp's member initialisers, nothing else
    apply(out.mode, block.mode);
    apply(out.methods, block.methods);
    apply(out.key.header, block.key_header);
    apply(out.key.json_pointer, block.key_json_pointer);
    apply(out.key.max_length, block.key_max_length);
    apply(out.key.syntax, block.key_syntax_value);
    apply(out.key.forward, block.key_forward);
    apply(out.scope_headers, block.scope_headers);
    apply(out.principal, block.principal);
    apply(out.fingerprint_headers, block.fingerprint_headers);
    apply(out.json_canonical, block.json_canonical);
    apply(out.ttl, block.ttl);
    apply(out.lease, block.lease);
    apply(out.concurrent, block.concurrent);
    apply(out.wait_timeout, block.wait_timeout);
    apply(out.mismatch_status, block.mismatch_status);
    apply(out.record, block.record);
    apply(out.release, block.release);
    apply(out.grpc_record, block.grpc_record);
    apply(out.grpc_release, block.grpc_release);
    apply(out.on_upstream_uncertain, block.on_upstream_uncertain);
    apply(out.on_store_error, block.on_store_error);
    apply(out.max_record_bytes, block.max_record_bytes);
    apply(out.stripe_compat, block.stripe_compat);
    apply(out.exclude_headers, block.exclude_headers);
    apply(out.record_set_cookie, block.record_set_cookie);
    return out;
}

} // namespace onceproxy::config
