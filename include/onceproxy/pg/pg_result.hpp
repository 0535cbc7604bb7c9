#pragma once
// Values in and out of a PostgreSQL statement: parameters, and a result copied out of libpq's
// PGresult (so nothing of libpq leaks out of src/pg/).

#include <boost/system/error_code.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace onceproxy::pg {

/// Wire format of a parameter or of a result's values.
enum class pg_format {
    text = 0,   ///< PostgreSQL's text representation (e.g. "42", "t", "\x0102" for bytea)
    binary = 1, ///< the type's binary send/recv form (raw bytes for bytea, big-endian int8)
};

/// One statement parameter: a value (null when empty) in text or binary format.
struct pg_param {
    std::optional<std::string> value;
    pg_format format = pg_format::text;

    static pg_param null() { return {}; }
    static pg_param text(std::string v) { return {std::move(v), pg_format::text}; }
    /// Raw bytes, e.g. for a bytea parameter of a prepared statement.
    static pg_param binary(std::string v) { return {std::move(v), pg_format::binary}; }
};

/// One row: its values in column order, std::nullopt for SQL NULL.
using pg_row = std::vector<std::optional<std::string>>;

/// Outcome of one statement.
struct pg_result {
    /// Empty on success. Otherwise an errc (error.hpp): not_connected, connection_lost,
    /// timeout, send_failed, protocol, or a server error (server_error, unique_violation,
    /// serialization_failure, deadlock_detected, query_canceled) with `sqlstate` set.
    boost::system::error_code ec;
    std::string sqlstate;             ///< five characters for a server error, else empty
    std::string message;              ///< the server's or libpq's message for a failure, else empty
    std::vector<std::string> columns; ///< column names (statements returning rows)
    std::vector<pg_row> rows;         ///< in the server's order
    std::uint64_t affected = 0;       ///< rows inserted, updated, deleted, selected (PQcmdTuples)
    /// True once the statement may have reached the server (it was handed to libpq on an open
    /// connection). A failure with sent == false certainly had no effect.
    bool sent = false;
};

} // namespace onceproxy::pg
