#pragma once
// Operational failures of a store (SPEC §5), as boost::system error codes in the store category.
// Domain outcomes (in flight, mismatch, not owner) are values in store.hpp, never errors.

#include <boost/system/error_code.hpp>

#include <string>
#include <type_traits>

namespace onceproxy::store {

/// Error codes returned by store operations.
enum class errc {
    /// The memory store's byte budget is exhausted by live leases and records: nothing was changed.
    store_full = 1,

    /// The store could not be reached (connection refused, closed, or not yet established).
    unavailable,

    /// The store did not answer within the command timeout; the operation may have taken effect.
    timeout,

    /// The store answered something that is not a valid reply to the command (protocol error).
    protocol,

    /// The store refused the credentials (AUTH / ACL user).
    auth_failed,

    /// A server-side script is unknown to the store and could not be loaded (NOSCRIPT).
    script_missing,

    /// The TLS session with a reachable store could not be set up (certificate not trusted,
    /// name mismatch, CA file unreadable): a setting to fix, not an outage.
    tls_failed,

    /// durability replicated: fewer replicas than required acknowledged a write within
    /// wait_timeout (WAIT). The write stands on the master but may be lost in a failover.
    not_replicated,

    /// The memory store's bound for one holder (max_bytes_per_holder) is reached by its live
    /// leases and 2xx records: nothing was changed; other holders are not affected.
    holder_full,
};

namespace detail {

class store_category final : public boost::system::error_category {
public:
    const char* name() const noexcept override { return "onceproxy.store"; }

    std::string message(int ev) const override {
        switch (static_cast<errc>(ev)) {
        case errc::store_full:
            return "store memory budget exhausted";
        case errc::unavailable:
            return "store unavailable";
        case errc::timeout:
            return "store command timed out";
        case errc::protocol:
            return "store protocol error";
        case errc::auth_failed:
            return "store authentication failed";
        case errc::script_missing:
            return "store script missing";
        case errc::tls_failed:
            return "store TLS setup failed";
        case errc::not_replicated:
            return "store write not acknowledged by enough replicas";
        case errc::holder_full:
            return "store memory budget of this holder exhausted";
        }
        return "onceproxy.store error";
    }
};

} // namespace detail

/// The category of every errc value (one instance per program).
inline const boost::system::error_category& store_category() noexcept {
    static const detail::store_category category;
    return category;
}

inline boost::system::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), store_category()};
}

} // namespace onceproxy::store

template <>
struct boost::system::is_error_code_enum<onceproxy::store::errc> : std::true_type {};
