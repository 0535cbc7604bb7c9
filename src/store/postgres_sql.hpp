#pragma once
// The SQL of the PostgreSQL store (issue 30): the schema, its migration, and every statement the
// store runs. String constants only, no I/O; tests/store/postgres_sql_check.py runs these very
// texts (it reads them out of this file) against a real server and checks the store contract
// (tests/conformance/store_suite.hpp) on them.
//
// ONE ROW PER KEY. A lease and the record it becomes are one row of the records table:
//
//   key          text COLLATE "C"  the store key (key prefix + 64 hex digits), primary key
//   owner        bytea             owner token of the attempt that claimed it (fencing)
//   fingerprint  bytea             request fingerprint
//   completed    boolean           false: a lease is held; true: a record is kept
//   kind         smallint          completed: record_kind (0 kept, 1 evictable); else NULL
//   record       bytea             completed: the payload given to complete(); else NULL
//   claimed_at   timestamptz       when the lease was taken (server clock): owner_age
//   created_ms   bigint            claim_request::created_ms (the claiming proxy's clock, or the
//                                  server's when 0), bound into a sealed record
//   expires_at   timestamptz       lease expiry while in flight, record expiry once completed
//
// EXPIRY. A row whose expires_at has passed is absent for every statement: claims take it over,
// fenced writes and inspect ignore it. Nothing depends on the sweep having run; the sweep (a
// bounded DELETE, run in the background) only keeps the table small.
//
// TIME. Every statement reads one clock, the server's, once: statement_timestamp() (the time the
// server received the statement). One clock for all proxies means no skew between replicas can
// shorten or stretch a lease, and one reading per statement means a comparison and the expiry
// it writes agree. statement_timestamp() rather than now(): now() is the transaction's start,
// which stays put if a driver ever sends several statements in one implicit transaction (a
// pipeline with one Sync); rather than clock_timestamp(): that changes within a statement.
// A statement that waits for a row lock still compares with its start time, so an expiry that
// passes during the wait is seen up to that wait late (bounded by statement_timeout); fencing
// does not depend on it (a takeover changes the owner, which the waiting statement re-checks).
//
// TEMPLATES. The names are substituted once, at start, into every text below:
//
//   {table}          the records table, quoted: "onceproxy_records" or "billing"."idem"
//   {schema_table}   the version table, in the same schema: "onceproxy_schema" or
//                    "billing"."onceproxy_schema"
//   {expiry_index}   the sweep index's name, unqualified and quoted:
//                    "onceproxy_records_expiry" (CREATE INDEX puts it in the table's schema)
//   {table_literal}  the configured table name as an SQL string literal: 'billing.idem'
//
// `store.postgres.table` is `[schema.]table`: at most one dot (more is a config error), each
// part 1 to 63 bytes, no NUL. Each part is quoted as an identifier (wrapped in ", an embedded "
// doubled), so names are taken literally: case and any character kept, nothing in a name can end
// the identifier. The index name is the table part + "_expiry" (cut to 63 bytes by the server),
// quoted the same way ({table_literal}: the whole name with ' doubled, in '...'). Unqualified names
// follow the connection's search_path.
//
// PARAMETERS. $1, $2, ... carry an explicit type cast in the text, so a statement can be
// prepared without a type list (PQprepare with paramTypes = NULL). bytea parameters are
// best sent in binary format (raw bytes, NULs included); text and integers in text format.
// Milliseconds are bigint; a lease or ttl below 1 ms counts as 1 ms (as memory_store does).
//
// TRANSACTIONS. Each runtime statement is one implicit transaction of its own (autocommit; in
// pipeline mode, a Sync after each), at READ COMMITTED. Each is safe at that level as written:
// the claim because INSERT ... ON CONFLICT DO UPDATE always returns the current row version,
// never a snapshot's view (see claim_sql). A serialization failure (40001) or deadlock (40P01)
// cannot come from these statements at READ COMMITTED, so the driver sets that level on its
// sessions (default_transaction_isolation, a startup option) whatever the database's default;
// where a stricter level is imposed anyway, a 40001 or 40P01 is retried as is.

#include <string_view>

namespace onceproxy::store::postgres_sql {

/// The schema version this build writes and expects.
inline constexpr int schema_version = 1;

/// Default `store.postgres.table`.
inline constexpr std::string_view default_table = "onceproxy_records";

/// Suffix of the sweep index's name, after the table part.
inline constexpr std::string_view expiry_index_suffix = "_expiry";

/// Claim statuses as the claim returns them: the order of store::claim_status.
inline constexpr int status_acquired = 0;
inline constexpr int status_in_flight = 1;
inline constexpr int status_completed = 2;
inline constexpr int status_mismatch = 3;

/// Purge outcomes as purge_sql returns them: the order of store::purge_status.
inline constexpr int purge_absent = 0;
inline constexpr int purge_purged_record = 1;
inline constexpr int purge_purged_lease = 2;
inline constexpr int purge_in_flight = 3;

/// Rows one sweep run deletes at most ($1 of sweep_sql).
inline constexpr int sweep_batch = 1000;

// --- schema -------------------------------------------------------------------------------

/// Schema version of {table}, for `migrate: check` and before a migration. No parameters.
/// Returns one row, one int column: the version recorded, 0 when none. Fails with SQLSTATE
/// 42P01 (undefined_table) when the version table does not exist: version 0 as well.
inline constexpr std::string_view schema_version_sql = R"sql(
SELECT coalesce(max(version), 0)::int AS version
  FROM {schema_table}
 WHERE table_name = {table_literal}
)sql";

/// Migration to version 1, for `migrate: auto`: ONE statement (a DO block, so it runs as one
/// transaction through the pipelined driver, which sends one statement per call), no parameters.
/// Replicas starting together are serialised by a transaction-level advisory lock on the table's
/// name; each step is a no-op when its object exists, so running it on a migrated table changes
/// nothing. The block's quote tag is $migrate$: a table name containing it is refused at start.
/// The records table:
///   - primary key on key (the claim's ON CONFLICT target, and every other statement's look-up);
///   - {expiry_index} on expires_at, for the sweep (its ORDER BY expires_at LIMIT n reads the
///     oldest expired rows off the index, never the whole table);
///   - the default fillfactor (100): a claim that finds a live row writes it back unchanged
///     (claim_sql), a HOT update only where its page has room; with lookup_sql in front, few
///     claims find a row, and fillfactor 90 would cost a fifth more heap for 1 KiB records
///     (docs/stores.md). A DBA may still set it (ALTER TABLE ... SET (fillfactor = 90));
///   - record keeps the default storage (compressed, then moved out of line, once a row
///     passes about 2 KiB): a JSON answer shrinks; an encrypted or already compressed one is
///     stored as is (pglz gives up on its first KiB).
inline constexpr std::string_view migrate_v1_sql = R"sql(
DO $migrate$
BEGIN
PERFORM pg_advisory_xact_lock(hashtextextended('onceproxy migrate ' || {table_literal}, 0));
CREATE TABLE IF NOT EXISTS {schema_table} (
    table_name  text        PRIMARY KEY,
    version     integer     NOT NULL,
    migrated_at timestamptz NOT NULL DEFAULT statement_timestamp()
);
CREATE TABLE IF NOT EXISTS {table} (
    key         text COLLATE "C" PRIMARY KEY,
    owner       bytea       NOT NULL,
    fingerprint bytea       NOT NULL,
    completed   boolean     NOT NULL,
    kind        smallint,
    record      bytea,
    claimed_at  timestamptz NOT NULL,
    created_ms  bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    CHECK (completed = (record IS NOT NULL) AND completed = (kind IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS {expiry_index} ON {table} (expires_at);
INSERT INTO {schema_table} AS s (table_name, version) VALUES ({table_literal}, 1)
    ON CONFLICT (table_name) DO UPDATE SET version = greatest(s.version, 1);
END
$migrate$
)sql";

// --- runtime ------------------------------------------------------------------------------

/// Claim-or-get, one statement (store::async_claim).
///   $1 key text, $2 fingerprint bytea, $3 owner bytea, $4 lease ms bigint,
///   $5 created_ms bigint (0: the server's clock).
/// Returns exactly one row:
///   status        int     status_acquired / _in_flight / _completed / _mismatch
///   remaining_ms  bigint  in flight: lease left (rounded up, > 0); completed: record's time left
///   record        bytea   completed: the payload; NULL otherwise (nothing shipped on a mismatch)
///   created_ms    bigint  the row's created_ms
///   inserted      boolean true: the key had no row (insert); false: a row was there (taken over
///                         when status is acquired, else left as it was). Informational.
/// How: INSERT a fresh lease; ON CONFLICT on the key, the existing row is locked and UPDATEd
/// with a CASE per column that takes it over only when it has expired (lease or record) and
/// otherwise writes it back unchanged. RETURNING then shows the row as it now is, whichever way:
/// at READ COMMITTED, ON CONFLICT sees (or waits for) the latest committed version, where a
/// DO NOTHING followed by a SELECT in the same statement reads the statement's snapshot and
/// misses a row committed meanwhile (zero rows back). The owner decides the answer: our token
/// in a lease means we hold it (taken now, or by this attempt's earlier claim whose reply was
/// lost: acquired again, with the lease's remaining time unchanged).
/// Cost of the unchanged write-back: a claim that finds a live row writes a new row version
/// (HOT when its page has room: no index entry; vacuumed later). Its commit is a write, so with
/// synchronous replication the record it replays has reached the standby before it is replayed.
inline constexpr std::string_view claim_sql = R"sql(
INSERT INTO {table} AS r
       (key, owner, fingerprint, completed, kind, record, claimed_at, created_ms, expires_at)
VALUES ($1::text, $3::bytea, $2::bytea, false, NULL, NULL, statement_timestamp(),
        coalesce(nullif($5::bigint, 0),
                 floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint),
        statement_timestamp() + greatest($4::bigint, 1) * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE SET
    owner       = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN excluded.owner ELSE r.owner END,
    fingerprint = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN excluded.fingerprint ELSE r.fingerprint END,
    completed   = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN false ELSE r.completed END,
    kind        = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN NULL ELSE r.kind END,
    record      = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN NULL ELSE r.record END,
    claimed_at  = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN excluded.claimed_at ELSE r.claimed_at END,
    created_ms  = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN excluded.created_ms ELSE r.created_ms END,
    expires_at  = CASE WHEN r.expires_at <= statement_timestamp()
                       THEN excluded.expires_at ELSE r.expires_at END
RETURNING
    CASE WHEN r.owner = $3::bytea AND NOT r.completed THEN 0
         WHEN r.fingerprint <> $2::bytea THEN 3
         WHEN r.completed THEN 2
         ELSE 1 END::int AS status,
    ceil(extract(epoch FROM r.expires_at - statement_timestamp()) * 1000)::bigint
        AS remaining_ms,
    CASE WHEN r.completed AND r.fingerprint = $2::bytea THEN r.record END AS record,
    r.created_ms,
    (r.xmax = 0) AS inserted
)sql";

/// Read-only look-up before the claim, optional: the fast path of a replay. Same parameters as
/// the claim's first three: $1 key text, $2 fingerprint bytea, $3 owner bytea. No row: nothing
/// live under the key, run claim_sql. One row: the answer, with claim_sql's columns (status,
/// remaining_ms, record, created_ms; no `inserted`), status never acquired except for a lease
/// this owner already holds. Why: claim_sql writes the row back even when it only finds it, so
/// every replay is a commit that waits for its WAL flush (and for a synchronous standby);
/// measured on one server (docs/stores.md), replays through claim_sql run at about a fifth of
/// the rate of this read. The price: a first execution takes two round trips, and a replay read
/// here may show a record whose commit reached the primary but (its writer's wait for the
/// standby cancelled) not yet the standby. A driver that does not want that reads with
/// claim_sql alone. Seen in flight or completed here, the answer is final: it is what claim_sql
/// would answer now, without the write.
inline constexpr std::string_view lookup_sql = R"sql(
SELECT CASE WHEN r.owner = $3::bytea AND NOT r.completed THEN 0
            WHEN r.fingerprint <> $2::bytea THEN 3
            WHEN r.completed THEN 2
            ELSE 1 END::int AS status,
       ceil(extract(epoch FROM r.expires_at - statement_timestamp()) * 1000)::bigint
           AS remaining_ms,
       CASE WHEN r.completed AND r.fingerprint = $2::bytea THEN r.record END AS record,
       r.created_ms
  FROM {table} AS r
 WHERE r.key = $1::text
   AND r.expires_at > statement_timestamp()
)sql";

/// Fenced complete (store::async_complete): the caller's live lease becomes a record kept for
/// the ttl. $1 key text, $2 owner bytea, $3 record bytea, $4 ttl ms bigint, $5 kind smallint
/// (0 kept, 1 evictable). One row back: ok (the caller owned the lease); none: not_owner,
/// nothing changed. A row this owner completed already (a retry whose first reply was lost)
/// answers ok and keeps its record, kind and expiry; it is still written (unchanged), so the
/// retry's commit waits for a synchronous standby as the lost first one may not have.
inline constexpr std::string_view complete_sql = R"sql(
UPDATE {table} AS r SET
    completed  = true,
    record     = CASE WHEN r.completed THEN r.record ELSE $3::bytea END,
    kind       = CASE WHEN r.completed THEN r.kind ELSE $5::smallint END,
    expires_at = CASE WHEN r.completed THEN r.expires_at
                      ELSE statement_timestamp()
                           + greatest($4::bigint, 1) * interval '1 millisecond' END
 WHERE r.key = $1::text
   AND r.owner = $2::bytea
   AND r.expires_at > statement_timestamp()
RETURNING true AS ok
)sql";

/// Fenced release (store::async_release): deletes the caller's live lease so a retry may execute.
/// $1 key text, $2 owner bytea. One row back: ok; none: not_owner (no lease of this owner, or
/// already a record, which a release never deletes).
inline constexpr std::string_view release_sql = R"sql(
DELETE FROM {table} AS r
 WHERE r.key = $1::text
   AND r.owner = $2::bytea
   AND NOT r.completed
   AND r.expires_at > statement_timestamp()
RETURNING true AS ok
)sql";

/// Fenced lease extension (store::async_extend): expiry = now + lease.
/// $1 key text, $2 owner bytea, $3 lease ms bigint. One row back: ok; none: not_owner.
inline constexpr std::string_view extend_sql = R"sql(
UPDATE {table} AS r
   SET expires_at = statement_timestamp() + greatest($3::bigint, 1) * interval '1 millisecond'
 WHERE r.key = $1::text
   AND r.owner = $2::bytea
   AND NOT r.completed
   AND r.expires_at > statement_timestamp()
RETURNING true AS ok
)sql";

/// Inspect (store::async_inspect), read only. $1 key text. No row: absent (or expired). One row:
///   completed     boolean  false: in flight; true: completed
///   remaining_ms  bigint   time until the lease lapses or the record expires (rounded up)
///   owner_age_ms  bigint   in flight: time since the lease was taken (rounded down); else -1
///   record        bytea    completed: the payload; NULL otherwise
///   fingerprint   bytea    completed: the fingerprint; NULL otherwise
///   created_ms    bigint   completed: the claim's created_ms; 0 otherwise
inline constexpr std::string_view inspect_sql = R"sql(
SELECT r.completed,
       ceil(extract(epoch FROM r.expires_at - statement_timestamp()) * 1000)::bigint
           AS remaining_ms,
       CASE WHEN r.completed THEN -1
            ELSE floor(extract(epoch FROM statement_timestamp() - r.claimed_at) * 1000)::bigint
       END AS owner_age_ms,
       r.record,
       CASE WHEN r.completed THEN r.fingerprint END AS fingerprint,
       CASE WHEN r.completed THEN r.created_ms ELSE 0 END AS created_ms
  FROM {table} AS r
 WHERE r.key = $1::text
   AND r.expires_at > statement_timestamp()
)sql";

/// Purge (store::async_purge), one statement. $1 key text, $2 force boolean. One row, one int
/// column `outcome`: purge_absent (nothing live), purge_purged_record, purge_purged_lease
/// (forced: the owner's token goes with the row, so its later complete/extend/release find
/// nothing: fenced), purge_in_flight (a lease is held and not forced: nothing changed).
/// The live row is locked first (FOR UPDATE: a concurrent complete is waited for and its result
/// judged), then deleted if allowed.
inline constexpr std::string_view purge_sql = R"sql(
WITH target AS (
    SELECT r.key, r.completed
      FROM {table} AS r
     WHERE r.key = $1::text
       AND r.expires_at > statement_timestamp()
       FOR UPDATE
), deleted AS (
    DELETE FROM {table} AS d
     USING target
     WHERE d.key = target.key
       AND (target.completed OR $2::boolean)
    RETURNING target.completed
)
SELECT CASE WHEN NOT EXISTS (SELECT FROM target) THEN 0
            WHEN EXISTS (SELECT FROM deleted WHERE completed) THEN 1
            WHEN EXISTS (SELECT FROM deleted) THEN 2
            ELSE 3 END::int AS outcome
)sql";

/// Bounded expiry sweep (background; one proxy or all of them may run it). $1 batch size int
/// (sweep_batch). Deletes at most $1 expired rows, oldest expiry first, read off {expiry_index}
/// and deleted by ctid; rows locked by a claim taking them over are skipped (SKIP LOCKED), and
/// the expiry is checked again on the row deleted. Returns nothing; the command tag's count
/// (PQcmdTuples) is the rows deleted: run again at once while it equals $1, else wait for the
/// next period.
inline constexpr std::string_view sweep_sql = R"sql(
DELETE FROM {table} AS r
 WHERE r.ctid = ANY (ARRAY(
           SELECT e.ctid
             FROM {table} AS e
            WHERE e.expires_at <= statement_timestamp()
            ORDER BY e.expires_at
            LIMIT $1::int
              FOR UPDATE SKIP LOCKED))
   AND r.expires_at <= statement_timestamp()
)sql";

/// Health probe (store::async_ping) and the start-up check that the table is reachable with the
/// role's rights: reads no row. No parameters; one row back.
inline constexpr std::string_view ping_sql = R"sql(
SELECT 1 FROM {table} WHERE false UNION ALL SELECT 1
)sql";

} // namespace onceproxy::store::postgres_sql
