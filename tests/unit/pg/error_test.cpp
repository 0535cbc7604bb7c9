#include "onceproxy/pg/error.hpp"

#include <doctest/doctest.h>

namespace pg = onceproxy::pg;

TEST_SUITE("unit.pg") {

    TEST_CASE("the SQLSTATEs a caller acts on have their own code; others are server_error") {
        CHECK(pg::errc_of_sqlstate("23505") == pg::errc::unique_violation);
        CHECK(pg::errc_of_sqlstate("40001") == pg::errc::serialization_failure);
        CHECK(pg::errc_of_sqlstate("40P01") == pg::errc::deadlock_detected);
        CHECK(pg::errc_of_sqlstate("57014") == pg::errc::query_canceled);
        CHECK(pg::errc_of_sqlstate("42P01") == pg::errc::server_error);
        // The server ending the session is a lost connection (the store answers unavailable
        // and retries an idempotent statement elsewhere), not an error of the statement.
        CHECK(pg::errc_of_sqlstate("57P01") == pg::errc::connection_lost); // shutdown
        CHECK(pg::errc_of_sqlstate("57P02") == pg::errc::connection_lost); // crash
        CHECK(pg::errc_of_sqlstate("57P03") == pg::errc::connection_lost); // cannot connect now
        CHECK(pg::errc_of_sqlstate("08006") == pg::errc::connection_lost);
        CHECK(pg::errc_of_sqlstate("57P04") == pg::errc::server_error); // database dropped
        CHECK(pg::errc_of_sqlstate("") == pg::errc::server_error);
    }

    TEST_CASE("codes are in the onceproxy.pg category with a message each") {
        const boost::system::error_code ec = pg::errc::connection_lost;
        CHECK(ec.category().name() == std::string("onceproxy.pg"));
        CHECK(ec == pg::errc::connection_lost);
        CHECK(ec != pg::errc::timeout);
        for (int v = 1; v <= static_cast<int>(pg::errc::query_canceled); ++v) {
            CHECK(pg::pg_category().message(v) != "onceproxy.pg error");
        }
    }
}
