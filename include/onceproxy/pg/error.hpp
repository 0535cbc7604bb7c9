#pragma once
// Operational failures of the PostgreSQL driver, as boost::system error codes in the pg
// category. A server ERROR is a failure too (the statement did not take effect); its SQLSTATE
// is kept beside the code (pg_result::sqlstate), and the ones a caller acts on have their own
// value.

#include <boost/system/error_code.hpp>

#include <string>
#include <string_view>
#include <type_traits>

namespace onceproxy::pg {

/// Error codes returned by the driver.
enum class errc {
    /// No open connection: the statement was not sent and had no effect.
    not_connected = 1,

    /// The connection failed or was closed before the result arrived, or the server ended the
    /// session (SQLSTATE 57P01, 57P02, 57P03, 57P05, class 08); the statement may have taken
    /// effect.
    connection_lost,

    /// No result within the command timeout (the connection is closed then); the statement
    /// may have taken effect.
    timeout,

    /// A connection attempt failed: unreachable, refused, authentication, a read-only server
    /// when read-write was asked for, connect timeout, or a statement that did not prepare.
    connect_failed,

    /// libpq refused to send the statement (e.g. an unknown prepared statement name).
    send_failed,

    /// The server answered something the driver did not ask for (e.g. COPY).
    protocol,

    /// A server ERROR not listed below; pg_result::sqlstate says which.
    server_error,

    /// SQLSTATE 23505: a unique constraint was violated.
    unique_violation,

    /// SQLSTATE 40001: a serializable transaction failed; retrying it may succeed.
    serialization_failure,

    /// SQLSTATE 40P01: chosen as a deadlock victim; retrying may succeed.
    deadlock_detected,

    /// SQLSTATE 57014: canceled, by statement_timeout or a cancel request.
    query_canceled,
};

/// The code of a server error with SQLSTATE `sqlstate`.
inline errc errc_of_sqlstate(std::string_view sqlstate) noexcept {
    if (sqlstate == "23505") {
        return errc::unique_violation;
    }
    if (sqlstate == "40001") {
        return errc::serialization_failure;
    }
    if (sqlstate == "40P01") {
        return errc::deadlock_detected;
    }
    if (sqlstate == "57014") {
        return errc::query_canceled;
    }
    // The server ended the session: shut down (57P01), crashed (57P02), starting or stopping
    // (57P03), idle too long (57P05), or a connection exception (class 08). The connection goes
    // with it, as when the socket closes: not an error of the statement.
    if (sqlstate == "57P01" || sqlstate == "57P02" || sqlstate == "57P03" || sqlstate == "57P05" ||
        sqlstate.starts_with("08")) {
        return errc::connection_lost;
    }
    return errc::server_error;
}

namespace detail {

class pg_category final : public boost::system::error_category {
public:
    const char* name() const noexcept override { return "onceproxy.pg"; }

    std::string message(int ev) const override {
        switch (static_cast<errc>(ev)) {
        case errc::not_connected:
            return "PostgreSQL not connected";
        case errc::connection_lost:
            return "PostgreSQL connection lost";
        case errc::timeout:
            return "PostgreSQL command timed out";
        case errc::connect_failed:
            return "PostgreSQL connection attempt failed";
        case errc::send_failed:
            return "PostgreSQL statement could not be sent";
        case errc::protocol:
            return "PostgreSQL protocol error";
        case errc::server_error:
            return "PostgreSQL server error";
        case errc::unique_violation:
            return "PostgreSQL unique violation";
        case errc::serialization_failure:
            return "PostgreSQL serialization failure";
        case errc::deadlock_detected:
            return "PostgreSQL deadlock detected";
        case errc::query_canceled:
            return "PostgreSQL query canceled";
        }
        return "onceproxy.pg error";
    }
};

} // namespace detail

/// The category of every errc value (one instance per program).
inline const boost::system::error_category& pg_category() noexcept {
    static const detail::pg_category category;
    return category;
}

inline boost::system::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), pg_category()};
}

} // namespace onceproxy::pg

template <>
struct boost::system::is_error_code_enum<onceproxy::pg::errc> : std::true_type {};
