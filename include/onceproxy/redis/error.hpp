#pragma once
// Operational failures of the Redis driver, as boost::system error codes in the redis
// category. Replies, even error replies (-ERR, -MOVED), are values (redis_reply), never errors.

#include <boost/system/error_code.hpp>

#include <string>
#include <type_traits>

namespace onceproxy::redis {

/// Error codes returned by the driver (connection, cluster router, sentinel discovery).
enum class errc {
    /// Redis could not be reached (connection refused, closed, or not yet established).
    unavailable = 1,

    /// Redis did not answer within the command timeout; the command may have taken effect.
    timeout,

    /// Redis answered something that is not a valid reply to the command (protocol error).
    protocol,

    /// Redis refused the credentials (AUTH / ACL user).
    auth_failed,

    /// The TLS session with a reachable Redis could not be set up (certificate not trusted,
    /// name mismatch, CA file unreadable): a setting to fix, not an outage.
    tls_failed,
};

namespace detail {

class redis_category final : public boost::system::error_category {
public:
    const char* name() const noexcept override { return "onceproxy.redis"; }

    std::string message(int ev) const override {
        switch (static_cast<errc>(ev)) {
        case errc::unavailable:
            return "Redis unavailable";
        case errc::timeout:
            return "Redis command timed out";
        case errc::protocol:
            return "Redis protocol error";
        case errc::auth_failed:
            return "Redis authentication failed";
        case errc::tls_failed:
            return "Redis TLS setup failed";
        }
        return "onceproxy.redis error";
    }
};

} // namespace detail

/// The category of every errc value (one instance per program).
inline const boost::system::error_category& redis_category() noexcept {
    static const detail::redis_category category;
    return category;
}

inline boost::system::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), redis_category()};
}

} // namespace onceproxy::redis

template <>
struct boost::system::is_error_code_enum<onceproxy::redis::errc> : std::true_type {};
