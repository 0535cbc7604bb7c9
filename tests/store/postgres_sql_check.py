#!/usr/bin/env python3
"""Checks the PostgreSQL store's SQL (src/store/postgres_sql.hpp) against a real server.

Reads the statements out of the header (the very texts the store will prepare), starts a scratch
PostgreSQL 15 cluster (initdb as the `postgres` user, a free loopback port, the socket in the
scratch folder), and walks the store contract of tests/conformance/store_suite.hpp through psql:
PREPARE each statement as the driver would, EXECUTE it, check the rows. The cluster is torn down
at the end, pass or fail.

    tests/store/postgres_sql_check.py             # the contract cases (20 to 40 s)
    tests/store/postgres_sql_check.py --measure   # also: table size per million rows, sweep cost

Needs: postgresql-15 (Debian's /usr/lib/postgresql/15/bin), psql, root (to run the server as
`postgres` with runuser) or running as an unprivileged user already. Exit status 0: all passed.
"""

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(ROOT, "src", "store", "postgres_sql.hpp")
PGBIN = "/usr/lib/postgresql/15/bin"

ACQUIRED, IN_FLIGHT, COMPLETED, MISMATCH = 0, 1, 2, 3
P_ABSENT, P_RECORD, P_LEASE, P_IN_FLIGHT = 0, 1, 2, 3


# --- the statements ------------------------------------------------------------------------------

def load_statements(path=HEADER):
    text = open(path, encoding="utf-8").read()
    found = re.findall(
        r'inline constexpr std::string_view (\w+)_sql = R"sql\((.*?)\)sql";', text, re.S)
    if not found:
        sys.exit(f"no statements found in {path}")
    return {name: body.strip() for name, body in found}


def quote_ident(part):
    if not part or len(part.encode()) > 63 or "\0" in part:
        raise ValueError(f"bad name part: {part!r}")
    return '"' + part.replace('"', '""') + '"'


def quote_literal(s):
    return "'" + s.replace("'", "''") + "'"


def names_for(table):
    """The template substitutions for `store.postgres.table` = table, as the header describes."""
    if table.count(".") > 1:
        raise ValueError(f"more than one dot in {table!r}")
    schema, dot, name = table.partition(".")
    if not dot:
        schema, name = "", table
    prefix = quote_ident(schema) + "." if schema else ""
    return {
        "{table}": prefix + quote_ident(name),
        "{schema_table}": prefix + quote_ident("onceproxy_schema"),
        "{expiry_index}": quote_ident(name + "_expiry"),
        "{table_literal}": quote_literal(table),
    }


def render(sql, table):
    for k, v in names_for(table).items():
        sql = sql.replace(k, v)
    return sql


def prepare_all(stmts, table):
    """PREPARE every runtime statement under its own name (no type list: the casts decide)."""
    out = []
    for name in ("claim", "lookup", "complete", "release", "extend", "inspect", "purge", "sweep",
                 "ping"):
        out.append(f"PREPARE {name} AS {render(stmts[name], table)};")
    return "\n".join(out) + "\n"


# --- a scratch cluster ---------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, settings=()):
        self.dir = tempfile.mkdtemp(prefix="onceproxy-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.settings = list(settings)
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        os.chmod(self.dir, 0o755)

    def start(self):
        subprocess.run(self.as_user + [f"{PGBIN}/initdb", "-D", self.data, "-U", "postgres",
                                       "--auth=trust", "--no-sync", "-E", "UTF8",
                                       "--locale=C.UTF-8"],
                       check=True, stdout=subprocess.DEVNULL)
        opts = " ".join([f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                         f"-c unix_socket_directories={self.dir}"] +
                        [f"-c {s}" for s in self.settings])
        subprocess.run(self.as_user + [f"{PGBIN}/pg_ctl", "-D", self.data, "-o", opts,
                                       "-l", os.path.join(self.dir, "log"), "-w", "start"],
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            subprocess.run(self.as_user + [f"{PGBIN}/pg_ctl", "-D", self.data, "-m", "immediate",
                                           "-w", "stop"], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def psql_args(self, user="postgres"):
        return ["psql", "-X", "-q", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1",
                "-h", "127.0.0.1", "-p", str(self.port), "-U", user, "-d", "postgres"]

    def psql(self, script, check=True, user="postgres", errors=None):
        """Runs `script` in one session as `user`; returns its output (stderr into `errors`)."""
        r = subprocess.run(self.psql_args(user), input=script, capture_output=True, text=True)
        if errors is not None:
            errors.append(r.stderr)
        if check and r.returncode != 0:
            raise RuntimeError(f"psql failed ({r.returncode}): {r.stderr}\n--- script:\n"
                               f"{script[:3000]}")
        return r.stdout

    def start_psql(self, script):
        p = subprocess.Popen(self.psql_args(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        p.stdin.write(script)
        p.stdin.close()
        return p

    @staticmethod
    def finish(p):
        """Waits for a session from start_psql; returns (stdout, stderr)."""
        out, err = p.stdout.read(), p.stderr.read()
        p.wait(timeout=60)
        return out, err


# --- a session of operations -----------------------------------------------------------------

SEP = "@@end@@"


def b(s):
    """A bytea literal for a Python str or bytes."""
    data = s.encode() if isinstance(s, str) else s
    return "'\\x" + data.hex() + "'::bytea"


class Ops:
    """Builds one psql script of operations; run() returns one list of rows per operation."""

    def __init__(self, stmts, table="onceproxy_records"):
        self.lines = [prepare_all(stmts, table)]
        self.labels = []

    def _op(self, label, sql):
        self.lines.append(f"{sql};\n\\echo {SEP}\n")
        self.labels.append(label)
        return self

    def claim(self, key, fp, owner, lease=300, created=0):
        return self._op("claim", f"EXECUTE claim({quote_literal(key)}, {b(fp)}, {b(owner)}, "
                                 f"{lease}, {created})")

    def lookup(self, key, fp, owner):
        return self._op("lookup", f"EXECUTE lookup({quote_literal(key)}, {b(fp)}, {b(owner)})")

    def complete(self, key, owner, record, ttl=600, kind=0, raw=False):
        rec = record if raw else b(record)
        return self._op("complete", f"EXECUTE complete({quote_literal(key)}, {b(owner)}, {rec}, "
                                    f"{ttl}, {kind})")

    def release(self, key, owner):
        return self._op("release", f"EXECUTE release({quote_literal(key)}, {b(owner)})")

    def extend(self, key, owner, lease=300):
        return self._op("extend", f"EXECUTE extend({quote_literal(key)}, {b(owner)}, {lease})")

    def inspect(self, key):
        return self._op("inspect", f"EXECUTE inspect({quote_literal(key)})")

    def purge(self, key, force):
        return self._op("purge", f"EXECUTE purge({quote_literal(key)}, {str(force).lower()})")

    def sweep(self, n=1000):
        # The count is the command tag's; psql shows it through ROW_COUNT.
        self.lines.append(f"EXECUTE sweep({n});\n\\echo :ROW_COUNT\n\\echo {SEP}\n")
        self.labels.append("sweep")
        return self

    def sql(self, text):
        return self._op("sql", text)

    def sleep(self, ms):
        self.lines.append(f"SELECT pg_sleep({ms / 1000.0}) \\g /dev/null\n")
        return self

    def run(self, cluster, user="postgres"):
        out = cluster.psql("".join(self.lines), user=user)
        chunks = out.split(SEP + "\n")
        results = []
        for chunk in chunks[: len(self.labels)]:
            rows = [line.split("|") for line in chunk.splitlines() if line != ""]
            results.append(rows)
        assert len(results) == len(self.labels), (len(results), len(self.labels), out[:500])
        return results


# --- checks ------------------------------------------------------------------------------------

class Checker:
    def __init__(self):
        self.passed = 0
        self.failed = []
        self.case = ""

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed.append(f"{self.case}: {what}")
            print(f"  FAIL {what}")


def claim_row(rows):
    assert len(rows) == 1, rows
    if len(rows[0]) == 4:  # lookup_sql: no `inserted`
        rows = [rows[0] + ["f"]]
    st, remaining, record, created, inserted = rows[0]
    return {"status": int(st), "remaining": int(remaining),
            "record": bytes.fromhex(record[2:]) if record else None,
            "created_ms": int(created), "inserted": inserted == "t"}


def fenced(rows):
    return "ok" if rows == [["t"]] else ("not_owner" if rows == [] else rows)


def inspect_row(rows):
    if not rows:
        return {"state": "absent"}
    completed, remaining, age, record, fp, created = rows[0]
    return {"state": "completed" if completed == "t" else "in_flight",
            "remaining": int(remaining), "owner_age": int(age),
            "record": bytes.fromhex(record[2:]) if record else None,
            "fingerprint": bytes.fromhex(fp[2:]) if fp else None, "created_ms": int(created)}


def case(check, name):
    check.case = name
    print(f"- {name}")


def contract(cluster, stmts, check):
    o = Ops
    case(check, "schema: migrate v1 creates, records version 1, and is a no-op when run again")
    migrate = render(stmts["migrate_v1"], "onceproxy_records")
    cluster.psql(migrate)
    cluster.psql(migrate)
    v = cluster.psql(render(stmts["schema_version"], "onceproxy_records") + ";")
    check(v.strip() == "1", f"schema version 1, got {v!r}")
    idx = cluster.psql("SELECT indexdef FROM pg_indexes WHERE tablename = 'onceproxy_records' "
                       "ORDER BY indexname;")
    check("(expires_at)" in idx and "(key)" in idx, f"primary key and expiry index: {idx!r}")
    none = cluster.psql(render(stmts["schema_version"], "other_records") + ";")
    check(none.strip() == "0", f"version 0 for a table never migrated, got {none!r}")

    case(check, "schema: a schema-qualified name with odd characters is quoted safely")
    odd = 'app.Idem"; DROP TABLE x; --'
    cluster.psql('CREATE SCHEMA app;')
    cluster.psql(render(stmts["migrate_v1"], odd))
    r = Ops(stmts, odd).claim("k", "fp", "o1").claim("k", "fp", "o2").run(cluster)
    check([claim_row(x)["status"] for x in r] == [ACQUIRED, IN_FLIGHT], f"claims on {odd!r}: {r}")
    t = cluster.psql("SELECT schemaname || '.' || tablename FROM pg_tables "
                     "WHERE schemaname = 'app' ORDER BY 1;")
    check(t.splitlines() == ['app.Idem"; DROP TABLE x; --', "app.onceproxy_schema"],
          f"tables in schema app: {t!r}")
    v = cluster.psql(render(stmts["schema_version"], odd) + ";")
    check(v.strip() == "1", f"its version recorded under its own name: {v!r}")

    case(check, "claim on a free key acquires it; a duplicate sees the lease; the lease shrinks")
    r = (o(stmts).claim("c1", "fp-1", "owner-a").claim("c1", "fp-1", "owner-b")
         .sleep(150).claim("c1", "fp-1", "owner-c").run(cluster))
    first, second, third = map(claim_row, r)
    check(first["status"] == ACQUIRED and first["inserted"], f"first acquires (insert): {first}")
    check(second["status"] == IN_FLIGHT, f"second in flight: {second}")
    check(0 < second["remaining"] <= 300, f"remaining in (0, 300]: {second['remaining']}")
    check(second["record"] is None, "no record in flight")
    check(not second["inserted"], "second found a row")
    check(third["status"] == IN_FLIGHT and 0 < third["remaining"] <= 150,
          f"half a lease later, remaining <= 150: {third}")

    case(check, "a different fingerprint is a mismatch, in flight and completed")
    r = (o(stmts).claim("m1", "fp-1", "owner-a").claim("m1", "fp-2", "owner-b")
         .complete("m1", "owner-a", "recorded").claim("m1", "fp-2", "owner-c")
         .claim("m1", "fp-1", "owner-d").run(cluster))
    check(claim_row(r[1])["status"] == MISMATCH and claim_row(r[1])["record"] is None,
          f"in flight: mismatch, no record: {r[1]}")
    check(fenced(r[2]) == "ok", "owner completes")
    check(claim_row(r[3])["status"] == MISMATCH and claim_row(r[3])["record"] is None,
          f"completed: mismatch, record not shipped: {r[3]}")
    c = claim_row(r[4])
    check(c["status"] == COMPLETED and c["record"] == b"recorded", f"replay unchanged: {c}")

    case(check, "a completed record is returned byte for byte (NULs, 1 MiB, empty)")
    nul = b"a\0b\0\0c\xff\x01\r\n"
    mib = bytes(((i * 131 + 7) & 0xFF) for i in range(1024 * 1024))
    r = (o(stmts).claim("p1", "fp", "owner-a").complete("p1", "owner-a", nul)
         .claim("p1", "fp", "owner-b")
         .claim("p2", "fp", "owner-a").complete("p2", "owner-a", mib)
         .claim("p2", "fp", "owner-b")
         .claim("p3", "fp", "owner-a").complete("p3", "owner-a", b"")
         .claim("p3", "fp", "owner-b").run(cluster))
    check(claim_row(r[2])["record"] == nul, "binary payload with NULs")
    big = claim_row(r[5])
    check(big["status"] == COMPLETED and big["record"] == mib, "1 MiB payload")
    empty = claim_row(r[8])
    check(empty["status"] == COMPLETED and empty["record"] == b"", f"empty payload: {empty}")

    case(check, "a wrong owner can neither complete, release nor extend; a retried completion "
                "by the owner is ok and keeps the record")
    r = (o(stmts).claim("w1", "fp", "owner-a")
         .complete("w1", "owner-x", "intruder").release("w1", "owner-x")
         .extend("w1", "owner-x", 600000)
         .claim("w1", "fp", "owner-b")
         .complete("w1", "owner-a", "mine").claim("w1", "fp", "owner-b")
         .complete("w1", "owner-x", "intruder").release("w1", "owner-x")
         .release("w1", "owner-a").extend("w1", "owner-a")
         .complete("w1", "owner-a", "second try").claim("w1", "fp", "owner-c")
         .complete("w-unknown", "owner-a", "x").release("w-unknown", "owner-a")
         .extend("w-unknown", "owner-a").claim("w-unknown", "fp", "owner-b").run(cluster))
    check([fenced(x) for x in r[1:4]] == ["not_owner"] * 3, f"intruder fenced: {r[1:4]}")
    seen = claim_row(r[4])
    check(seen["status"] == IN_FLIGHT and seen["remaining"] <= 300, f"lease untouched: {seen}")
    check(fenced(r[5]) == "ok", "real owner completes")
    check(claim_row(r[6])["record"] == b"mine", "replay 'mine'")
    check([fenced(x) for x in r[7:11]] == ["not_owner"] * 4,
          f"completed record out of reach of fenced ops: {r[7:11]}")
    check(fenced(r[11]) == "ok", "retried completion by its owner: ok")
    check(claim_row(r[12])["record"] == b"mine", "... and the record kept")
    check([fenced(x) for x in r[13:16]] == ["not_owner"] * 3, "never-claimed key: fenced")
    check(claim_row(r[16])["status"] == ACQUIRED, "never-claimed key: still free")

    case(check, "release frees the key for the next claim")
    r = (o(stmts).claim("r1", "fp-1", "owner-a").release("r1", "owner-a")
         .release("r1", "owner-a").claim("r1", "fp-2", "owner-b")
         .complete("r1", "owner-a", "late").complete("r1", "owner-b", "new")
         .claim("r1", "fp-2", "owner-c").run(cluster))
    check([fenced(r[1]), fenced(r[2])] == ["ok", "not_owner"], "released once, then fenced")
    check(claim_row(r[3])["status"] == ACQUIRED, "free for another fingerprint")
    check([fenced(r[4]), fenced(r[5])] == ["not_owner", "ok"], "old owner fenced, new completes")
    check(claim_row(r[6])["record"] == b"new", "replay 'new'")

    case(check, "an expired lease frees the key; the old owner is fenced off")
    r = (o(stmts).claim("e1", "fp-1", "owner-a").claim("e2", "fp-1", "owner-a").sleep(400)
         # untaken: late operations fail and resurrect nothing
         .extend("e1", "owner-a").complete("e1", "owner-a", "late").release("e1", "owner-a")
         .claim("e1", "fp-1", "owner-b")
         # taken over by another fingerprint
         .claim("e2", "fp-2", "owner-b").complete("e2", "owner-a", "stale")
         .extend("e2", "owner-a").release("e2", "owner-a").claim("e2", "fp-2", "owner-c")
         .complete("e2", "owner-b", "fresh").complete("e2", "owner-a", "stale")
         .claim("e2", "fp-2", "owner-c").run(cluster))
    check([fenced(x) for x in r[2:5]] == ["not_owner"] * 3, f"late ops fenced: {r[2:5]}")
    a = claim_row(r[5])
    check(a["status"] == ACQUIRED and not a["inserted"], f"expired lease taken over: {a}")
    check(claim_row(r[6])["status"] == ACQUIRED, "taken over by another fingerprint")
    check([fenced(x) for x in r[7:10]] == ["not_owner"] * 3, "old owner fenced")
    check(claim_row(r[10])["status"] == IN_FLIGHT, "the new lease intact")
    check([fenced(r[11]), fenced(r[12])] == ["ok", "not_owner"], "new completes, old cannot")
    check(claim_row(r[13])["record"] == b"fresh", "replay 'fresh'")

    case(check, "extend pushes the lease expiry; an extended lease still expires")
    r = (o(stmts).claim("x1", "fp", "owner-a").sleep(200).extend("x1", "owner-a").sleep(200)
         .claim("x1", "fp", "owner-b").extend("x1", "owner-a").complete("x1", "owner-a", "done")
         .claim("x1", "fp", "owner-b")
         .claim("x2", "fp", "owner-a").sleep(100).extend("x2", "owner-a").sleep(400)
         .claim("x2", "fp", "owner-b").extend("x2", "owner-a").run(cluster))
    check(fenced(r[1]) == "ok", "extend ok")
    s = claim_row(r[2])
    check(s["status"] == IN_FLIGHT and 0 < s["remaining"] <= 200,
          f"past the first expiry, still held, remaining <= 200: {s}")
    check([fenced(r[3]), fenced(r[4])] == ["ok", "ok"], "extend and complete by the owner")
    check(claim_row(r[5])["record"] == b"done", "replay 'done'")
    check(claim_row(r[8])["status"] == ACQUIRED, "extended lease expired: acquired")
    check(fenced(r[9]) == "not_owner", "old owner cannot extend")

    case(check, "a record lives for its TTL (from completion), then the key is free")
    r = (o(stmts).claim("t1", "fp-1", "owner-a").sleep(200).complete("t1", "owner-a", "rec")
         .sleep(500).claim("t1", "fp-1", "owner-b").sleep(200)
         .complete("t1", "owner-a", "rec").claim("t1", "fp-2", "owner-c").run(cluster))
    c = claim_row(r[2])
    check(c["status"] == COMPLETED and c["record"] == b"rec" and 0 < c["remaining"] <= 100,
          f"still there near the end of its ttl: {c}")
    check(fenced(r[3]) == "not_owner", "expired record: the retried completion refused")
    check(claim_row(r[4])["status"] == ACQUIRED, "expired record: free for any fingerprint")

    case(check, "inspect reports absent, in flight and completed, changing nothing")
    r = (o(stmts).inspect("i1").claim("i1", "fp-1", "owner-a", created=1764086400123)
         .sleep(150).inspect("i1").extend("i1", "owner-a")
         .complete("i1", "owner-a", b"rec\0orded").inspect("i1")
         .claim("i1", "fp-1", "owner-b").run(cluster))
    check(inspect_row(r[0])["state"] == "absent", "absent")
    check(claim_row(r[1])["status"] == ACQUIRED, "looking created nothing")
    i = inspect_row(r[2])
    check(i["state"] == "in_flight" and 0 < i["remaining"] <= 150 and
          150 <= i["owner_age"] < 600 and i["record"] is None,
          f"in flight, remaining <= 150, owner_age >= 150: {i}")
    check(fenced(r[3]) == "ok", "the lease untouched: the owner extends it")
    i = inspect_row(r[5])
    check(i["state"] == "completed" and i["record"] == b"rec\0orded" and
          0 < i["remaining"] <= 600 and i["fingerprint"] == b"fp-1" and
          i["created_ms"] == 1764086400123 and i["owner_age"] == -1,
          f"completed, with record, fingerprint and created_ms: {i}")
    c = claim_row(r[6])
    check(c["status"] == COMPLETED and c["created_ms"] == 1764086400123,
          f"replay carries the claim's created_ms: {c}")

    case(check, "lookup (read only) answers as the claim would, or nothing when nothing is live")
    r = (o(stmts).lookup("q1", "fp-1", "owner-a").claim("q1", "fp-1", "owner-a", lease=300)
         .lookup("q1", "fp-1", "owner-a").lookup("q1", "fp-1", "owner-b")
         .lookup("q1", "fp-2", "owner-b").complete("q1", "owner-a", "rec", ttl=300)
         .sql("SELECT xmin, ctid FROM onceproxy_records WHERE key = 'q1'")
         .lookup("q1", "fp-1", "owner-b").lookup("q1", "fp-2", "owner-b")
         .sql("SELECT xmin, ctid FROM onceproxy_records WHERE key = 'q1'")
         .sleep(400).lookup("q1", "fp-1", "owner-b").run(cluster))
    check(r[0] == [], f"absent: no row: {r[0]}")
    check(claim_row(r[2])["status"] == ACQUIRED, "the owner's own lease: acquired")
    s = claim_row(r[3])
    check(s["status"] == IN_FLIGHT and 0 < s["remaining"] <= 300, f"in flight: {s}")
    check(claim_row(r[4])["status"] == MISMATCH, "in flight, other fingerprint: mismatch")
    c = claim_row(r[7])
    check(c["status"] == COMPLETED and c["record"] == b"rec", f"completed: {c}")
    m = claim_row(r[8])
    check(m["status"] == MISMATCH and m["record"] is None, f"completed, mismatch: {m}")
    check(r[6] == r[9], f"the look-ups wrote nothing (same row version): {r[6]} {r[9]}")
    check(r[10] == [], f"expired: no row: {r[10]}")

    case(check, "created_ms 0 is the server's clock")
    r = o(stmts).claim("cm1", "fp", "owner-a").sql(
        "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").run(cluster)
    got, now_ms = claim_row(r[0])["created_ms"], int(r[1][0][0])
    check(0 <= now_ms - got < 5000, f"created_ms {got} near the server's now {now_ms}")

    case(check, "purge deletes a record; the next claim executes again")
    r = (o(stmts).purge("u1", False).purge("u1", True).claim("u1", "fp-1", "owner-a")
         .complete("u1", "owner-a", "first").purge("u1", False).inspect("u1")
         .purge("u1", False).complete("u1", "owner-a", "first").inspect("u1")
         .claim("u1", "fp-2", "owner-b").run(cluster))
    check(r[0] == [[str(P_ABSENT)]] and r[1] == [[str(P_ABSENT)]], f"absent twice: {r[:2]}")
    check(r[4] == [[str(P_RECORD)]], f"purged_record: {r[4]}")
    check(inspect_row(r[5])["state"] == "absent" and r[6] == [[str(P_ABSENT)]], "gone")
    check(fenced(r[7]) == "not_owner" and inspect_row(r[8])["state"] == "absent",
          "a repeated completion does not bring it back")
    check(claim_row(r[9])["status"] == ACQUIRED, "free for any fingerprint")

    case(check, "purge refuses a held lease unless forced; a forced purge fences the owner")
    r = (o(stmts).claim("f1", "fp-1", "owner-a").purge("f1", False).inspect("f1")
         .extend("f1", "owner-a").purge("f1", True).inspect("f1")
         .extend("f1", "owner-a").complete("f1", "owner-a", "late").release("f1", "owner-a")
         .inspect("f1").claim("f1", "fp-1", "owner-b").complete("f1", "owner-a", "late")
         .complete("f1", "owner-b", "second").claim("f1", "fp-1", "owner-c").run(cluster))
    check(r[1] == [[str(P_IN_FLIGHT)]], f"refused: {r[1]}")
    check(inspect_row(r[2])["state"] == "in_flight" and fenced(r[3]) == "ok", "nothing changed")
    check(r[4] == [[str(P_LEASE)]], f"purged_lease: {r[4]}")
    check(inspect_row(r[5])["state"] == "absent", "absent after the forced purge")
    check([fenced(x) for x in r[6:9]] == ["not_owner"] * 3, "the owner is fenced")
    check(inspect_row(r[9])["state"] == "absent", "nothing re-created")
    check(claim_row(r[10])["status"] == ACQUIRED, "a retry executes again")
    check([fenced(r[11]), fenced(r[12])] == ["not_owner", "ok"], "fenced owner cannot overwrite")
    check(claim_row(r[13])["record"] == b"second", "replay 'second'")

    case(check, "the record kind is stored; either kind replays alike")
    r = (o(stmts).claim("k1", "fp-1", "owner-a").claim("k2", "fp-2", "owner-b")
         .complete("k1", "owner-a", "two hundred", kind=0)
         .complete("k2", "owner-b", "four hundred", kind=1)
         .claim("k2", "fp-2", "owner-c").claim("k1", "fp-1", "owner-d")
         .sql("SELECT key, kind FROM onceproxy_records WHERE key IN ('k1', 'k2') ORDER BY key")
         .run(cluster))
    check(claim_row(r[4])["record"] == b"four hundred", "evictable replays")
    check(claim_row(r[5])["record"] == b"two hundred", "kept replays")
    check(r[6] == [["k1", "0"], ["k2", "1"]], f"kinds 0 and 1: {r[6]}")

    case(check, "a claim whose reply was lost, sent again by the same owner, acquires again")
    r = (o(stmts).claim("l1", "fp", "owner-a", lease=1000).sleep(100)
         .claim("l1", "fp", "owner-a", lease=1000).run(cluster))
    again = claim_row(r[1])
    check(again["status"] == ACQUIRED and again["remaining"] <= 900,
          f"acquired, lease not renewed by the retry: {again}")

    case(check, "an expired record is ignored by claims and inspect, and removed by the sweep")
    cluster.psql("DELETE FROM onceproxy_records;")
    r = (o(stmts).claim("s1", "fp-1", "owner-a").complete("s1", "owner-a", "old", ttl=100)
         .claim("s2", "fp-1", "owner-a").complete("s2", "owner-a", "old", ttl=100)
         .claim("s-live", "fp-1", "owner-a").complete("s-live", "owner-a", "live", ttl=60000)
         .claim("s-lease", "fp-1", "owner-a", lease=60000)
         .sleep(200).inspect("s1").claim("s1", "fp-2", "owner-b")
         .sweep().sql("SELECT key FROM onceproxy_records ORDER BY key").sweep()
         .run(cluster))
    check(inspect_row(r[7])["state"] == "absent", "inspect: absent")
    check(claim_row(r[8])["status"] == ACQUIRED, "claim: acquired with another fingerprint")
    check(r[9] == [["1"]], f"sweep deleted the one expired row left (s2): {r[9]}")
    check(r[10] == [["s-lease"], ["s-live"], ["s1"]], f"live rows kept: {r[10]}")
    check(r[11] == [["0"]], f"nothing more to sweep: {r[11]}")

    case(check, "the sweep is bounded: 2500 expired rows go in batches of 1000")
    cluster.psql("DELETE FROM onceproxy_records;\n"
                 "INSERT INTO onceproxy_records SELECT 'b' || i, '\\x01', '\\x02', true, 0, "
                 "'\\x03', now(), 0, now() - interval '1 minute' "
                 "FROM generate_series(1, 2500) i;")
    r = o(stmts).sweep().sweep().sweep().sweep().run(cluster)
    check(r == [[["1000"]], [["1000"]], [["500"]], [["0"]]], f"1000, 1000, 500, 0: {r}")
    plan = cluster.psql(prepare_all(stmts, "onceproxy_records") +
                        "SET plan_cache_mode = force_generic_plan;\n"
                        "EXPLAIN (COSTS OFF) EXECUTE sweep(1000);")
    check("onceproxy_records_expiry" in plan and "Tid Scan" in plan,
          f"the sweep reads the expiry index and deletes by ctid: {plan}")

    case(check, "ping answers")
    r = o(stmts).sql("EXECUTE ping").run(cluster)
    check(r[0] == [["1"]], f"one row: {r[0]}")


def grants(cluster, stmts, check):
    case(check, "the documented roles: an owner migrates, the proxy's role only reads and writes")
    table = "idem.onceproxy_records"
    cluster.psql("""
CREATE ROLE onceproxy_owner NOLOGIN;
CREATE ROLE onceproxy_migrator LOGIN IN ROLE onceproxy_owner;
CREATE ROLE onceproxy LOGIN;
CREATE SCHEMA idem AUTHORIZATION onceproxy_owner;
GRANT CONNECT ON DATABASE postgres TO onceproxy;
GRANT USAGE ON SCHEMA idem TO onceproxy;
""")
    err = []
    cluster.psql(render(stmts["migrate_v1"], table), user="onceproxy", check=False, errors=err)
    check("permission denied for schema idem" in err[0],
          f"the proxy's role cannot create the table (migrate: auto needs more): {err[0]!r}")
    v = cluster.psql(render(stmts["schema_version"], table) + ";", user="onceproxy",
                     check=False, errors=err)
    check(v == "" and "does not exist" in err[1],
          f"migrate: check, before the migration: the version table is missing: {err[1]!r}")
    cluster.psql("SET ROLE onceproxy_owner;\n" + render(stmts["migrate_v1"], table) + """;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem.onceproxy_records TO onceproxy;
GRANT SELECT ON idem.onceproxy_schema TO onceproxy;
""", user="onceproxy_migrator")
    v = cluster.psql(render(stmts["schema_version"], table) + ";", user="onceproxy")
    check(v.strip() == "1", f"migrate: check, after it: version 1 ({v!r})")
    owner = cluster.psql("SELECT tableowner FROM pg_tables WHERE schemaname = 'idem' "
                         "ORDER BY tablename;").split()
    check(owner == ["onceproxy_owner"] * 2, f"the tables belong to the owner role: {owner}")
    r = (Ops(stmts, table).claim("g1", "fp", "owner-a").claim("g2", "fp", "owner-a")
         .extend("g1", "owner-a").complete("g1", "owner-a", "rec").lookup("g1", "fp", "o")
         .inspect("g1").release("g2", "owner-a").purge("g1", False).sweep().sql("EXECUTE ping")
         .run(cluster, user="onceproxy"))
    check(claim_row(r[0])["status"] == ACQUIRED and fenced(r[3]) == "ok" and
          claim_row(r[4])["record"] == b"rec" and r[7] == [[str(P_RECORD)]],
          f"every runtime statement runs with SELECT, INSERT, UPDATE, DELETE: {r}")
    for stmt in (f"TRUNCATE {table}", f"DROP TABLE {table}",
                 "UPDATE idem.onceproxy_schema SET version = 0"):
        cluster.psql(stmt + ";", user="onceproxy", check=False, errors=err)
        check("must be owner" in err[-1] or "permission denied" in err[-1],
              f"refused to the proxy's role: {stmt}: {err[-1]!r}")


def concurrency(cluster, stmts, check):
    prep = prepare_all(stmts, "onceproxy_records")

    def claim_line(key, owner):
        return f"EXECUTE claim('{key}', {b('fp')}, {b(owner)}, 30000, 0);\n"

    for end, want in (("COMMIT", IN_FLIGHT), ("ROLLBACK", ACQUIRED)):
        case(check, f"a claim waits for a concurrent uncommitted claim ({end}): "
                    f"{'in flight' if want == IN_FLIGHT else 'acquired'}")
        key = f"cc-{end}"
        holder = cluster.start_psql(prep + "BEGIN;\n" + claim_line(key, "owner-a") +
                                    "SELECT pg_sleep(1.5) \\g /dev/null\n" + end + ";\n")
        time.sleep(0.5)
        t0 = time.monotonic()
        second = cluster.psql(prep + claim_line(key, "owner-b"))
        waited = time.monotonic() - t0
        out, err = cluster.finish(holder)
        check(holder.returncode == 0, f"holder session ok: {err}")
        check(claim_row([out.strip().split("|")])["status"] == ACQUIRED, "holder acquired")
        got = claim_row([second.strip().split("|")])
        check(got["status"] == want, f"second claim: {got}")
        check(waited > 0.5, f"the second claim waited for the first ({waited:.2f} s)")

    case(check, "for contrast: ON CONFLICT DO NOTHING + SELECT in one statement misses the row")
    naive = ("PREPARE naive AS WITH ins AS (INSERT INTO onceproxy_records AS r (key, owner, "
             "fingerprint, completed, claimed_at, created_ms, expires_at) VALUES ($1::text, "
             "$2::bytea, '\\x00', false, now(), 0, now() + interval '30 s') ON CONFLICT (key) "
             "DO NOTHING RETURNING true AS acquired) SELECT acquired FROM ins UNION ALL "
             "SELECT false FROM onceproxy_records WHERE key = $1::text "
             "AND NOT EXISTS (SELECT FROM ins);\n")
    holder = cluster.start_psql(naive + "BEGIN;\nEXECUTE naive('cc-naive', '\\x01');\n"
                                "SELECT pg_sleep(1.5) \\g /dev/null\nCOMMIT;\n")
    time.sleep(0.5)
    second = cluster.psql(naive + "EXECUTE naive('cc-naive', '\\x02');\n")
    cluster.finish(holder)
    check(second.strip() == "",
          f"the naive statement returns no row at all (neither acquired nor found): {second!r}")

    case(check, "the sweep skips an expired row a claim is taking over, without waiting")
    cluster.psql(prep + "EXECUTE claim('sw1', " + b("fp") + ", " + b("old") + ", 1, 0);\n"
                 "SELECT pg_sleep(0.05);\n")
    holder = cluster.start_psql(prep + "BEGIN;\n" + claim_line("sw1", "owner-a") +
                                "SELECT pg_sleep(1.5) \\g /dev/null\nCOMMIT;\n")
    time.sleep(0.5)
    t0 = time.monotonic()
    swept = cluster.psql(prep + "EXECUTE sweep(1000);\n\\echo :ROW_COUNT\n").strip()
    waited = time.monotonic() - t0
    out, _ = cluster.finish(holder)
    check(claim_row([out.strip().split("|")])["status"] == ACQUIRED, "the claim took it over")
    check(swept == "0" and waited < 0.9, f"the sweep skipped it at once: {swept} ({waited:.2f} s)")
    r = Ops(stmts).inspect("sw1").run(cluster)
    check(inspect_row(r[0])["state"] == "in_flight", "the new lease is there")

    case(check, "a claim waiting on a row the sweep deletes acquires the key")
    cluster.psql(prep + "EXECUTE claim('sw2', " + b("fp") + ", " + b("old") + ", 1, 0);\n"
                 "SELECT pg_sleep(0.05);\n")
    sweeper = cluster.start_psql(prep + "BEGIN;\nEXECUTE sweep(1000);\n\\echo :ROW_COUNT\n"
                                 "SELECT pg_sleep(1.5) \\g /dev/null\nCOMMIT;\n")
    time.sleep(0.5)
    second = cluster.psql(prep + claim_line("sw2", "owner-b"))
    out, _ = cluster.finish(sweeper)
    got = claim_row([second.strip().split("|")])
    check(out.strip() == "1", f"the sweep deleted it: {out!r}")
    check(got["status"] == ACQUIRED and got["inserted"], f"then the claim inserted: {got}")

    n = 32
    case(check, f"{n} sessions started together claim one free key: exactly one acquires")
    procs = [cluster.start_psql(prep + claim_line("cc-many", f"owner-{i}")) for i in range(n)]
    statuses = []
    for p in procs:
        out, err = cluster.finish(p)
        check(p.returncode == 0, f"session ok: {err}")
        statuses.append(claim_row([out.strip().split("|")])["status"])
    check(statuses.count(ACQUIRED) == 1 and statuses.count(IN_FLIGHT) == n - 1,
          f"1 acquired, {n - 1} in flight: {statuses}")

    case(check, f"{n} sessions started together take over one expired lease: exactly one")
    cluster.psql(prep + "EXECUTE claim('cc-expired', " + b("fp") + ", " + b("old") +
                 ", 1, 0);\nSELECT pg_sleep(0.05);\n")
    procs = [cluster.start_psql(prep + claim_line("cc-expired", f"owner-{i}")) for i in range(n)]
    statuses = []
    for p in procs:
        out, _ = cluster.finish(p)
        statuses.append(claim_row([out.strip().split("|")])["status"])
    check(statuses.count(ACQUIRED) == 1 and statuses.count(IN_FLIGHT) == n - 1,
          f"1 acquired, {n - 1} in flight: {statuses}")


# --- measurements ----------------------------------------------------------------------------

def timed_runs(cluster, prep, statements):
    """Runs `statements` (one per line) in one session with \\timing; the server-side times, ms."""
    out = cluster.psql(prep + "\\timing on\n" + "".join(s + "\n" for s in statements))
    return [float(m) for m in re.findall(r"Time: ([0-9.]+) ms", out)]


def summary(times):
    t = sorted(times)
    return f"median {t[len(t) // 2]:.2f} ms, min {t[0]:.2f}, max {t[-1]:.2f} ({len(t)} runs)"


def measure(cluster, stmts):
    print("\n== measurements ==")
    table = "onceproxy_records"
    rows = 1_000_000
    mib = 1024 * 1024
    cluster.psql("DROP TABLE IF EXISTS onceproxy_records; DELETE FROM onceproxy_schema;")
    cluster.psql(render(stmts["migrate_v1"], table))
    prep = prepare_all(stmts, table)
    # The shape of a real record: key = prefix + 64 hex digits (74 B), owner = 32 hex digits,
    # fingerprint = 32 raw bytes (SHA-256), a 1 KiB record. Rows of 1 KiB stay in line (TOAST
    # starts near 2 KiB), so the record's bytes need not be random. Expiries: 1 row in 50
    # (20000) expired, spread over the whole table (the sweep's worst case: one page per row);
    # the other rows of 1..25000 (24500) expired in insertion order (the common case: one ttl,
    # so expiry follows insertion); the rest live for up to a day (distinct expiries).
    t0 = time.monotonic()
    cluster.psql(
        "INSERT INTO onceproxy_records "
        "SELECT 'onceproxy:' || encode(sha256(int8send(i)), 'hex'), "
        "convert_to(md5((-i)::text), 'UTF8'), sha256(int8send(i * 7)), true, 0, "
        "decode(repeat(md5(i::text), 64), 'hex'), now(), 0, "
        "CASE WHEN i % 50 = 0 THEN now() - interval '2 hours' + i * interval '1 ms' "
        "     WHEN i <= 25000 THEN now() - interval '1 hour' + i * interval '1 ms' "
        "     ELSE now() + i * interval '80 ms' END "
        f"FROM generate_series(1, {rows}) i;\nVACUUM ANALYZE onceproxy_records;")
    load = time.monotonic() - t0
    out = cluster.psql(
        "SELECT pg_relation_size('onceproxy_records'), "
        "pg_total_relation_size(reltoastrelid), "
        "pg_relation_size('onceproxy_records_pkey'), "
        "pg_relation_size('onceproxy_records_expiry'), "
        "pg_total_relation_size('onceproxy_records'), "
        "(SELECT avg(pg_column_size(r.*))::int FROM onceproxy_records r) "
        "FROM pg_class WHERE oid = 'onceproxy_records'::regclass;")
    heap, toast, pkey, expiry, total, avg = map(int, out.strip().split("|"))
    print(f"{rows} completed records (key 74 B, owner 32 B, fingerprint 32 B, record 1 KiB), "
          f"loaded in {load:.0f} s:")
    print(f"  heap {heap / mib:.0f} MiB, toast {toast / mib:.1f} MiB, primary key "
          f"{pkey / mib:.0f} MiB, expiry index {expiry / mib:.0f} MiB; "
          f"pg_total_relation_size {total / mib:.0f} MiB; average row {avg} B")

    cluster.psql("CREATE TABLE ff90 (LIKE onceproxy_records INCLUDING ALL) "
                 "WITH (fillfactor = 90);\n"
                 "INSERT INTO ff90 SELECT * FROM onceproxy_records;")
    ff = int(cluster.psql("SELECT pg_relation_size('ff90');").strip())
    cluster.psql("DROP TABLE ff90;")
    print(f"  the same heap at fillfactor 90: {ff / mib:.0f} MiB")

    runs = 20
    t = timed_runs(cluster, prep, ["EXECUTE sweep(1000);"] * runs)
    print(f"sweep, expired rows spread over the table (one heap page each): {summary(t)} "
          "per 1000 rows")
    t = timed_runs(cluster, prep, ["EXECUTE sweep(1000);"] * runs)
    print(f"sweep, expired rows in insertion order: {summary(t)} per 1000 rows")
    wal = cluster.psql(prep + "SELECT pg_current_wal_lsn() AS before \\gset\n"
                       "EXECUTE sweep(1000);\n"
                       "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :'before');")
    print(f"  WAL written by one sweep of 1000 rows: {int(float(wal.strip())) // 1024} KiB")
    left = cluster.psql(prep + "EXECUTE sweep(100000);\n\\echo :ROW_COUNT\n").strip()
    t = timed_runs(cluster, prep, ["EXECUTE sweep(1000);"] * 5)
    print(f"sweep finding nothing, {left} rows after the last batch, before a vacuum "
          f"(dead index entries): {summary(t)}")
    cluster.psql("VACUUM onceproxy_records;")
    t = timed_runs(cluster, prep, ["EXECUTE sweep(1000);"] * 5)
    print(f"sweep finding nothing, after a vacuum: {summary(t)}")
    out = cluster.psql("SELECT pg_relation_size('onceproxy_records'), "
                       "pg_relation_size('onceproxy_records_expiry'), count(*) "
                       "FROM onceproxy_records;")
    heap, expiry, count = map(int, out.strip().split("|"))
    print(f"  after sweeping: {count} rows; heap {heap / mib:.0f} MiB (space reused, not "
          f"returned), expiry index {expiry / mib:.0f} MiB")

    # Claims, one session, n statements each: a new key; a replay of a completed record (the
    # unchanged write-back); the same keys read with a plain SELECT, for comparison.
    n = 2000
    live = cluster.psql("SELECT key, encode(fingerprint, 'hex') FROM onceproxy_records "
                        f"WHERE expires_at > now() ORDER BY key LIMIT {n};").split()
    pairs = [x.split("|") for x in live]
    cluster.psql("SELECT pg_stat_reset();")
    for label, lines in (
            ("claim, a new key (insert)",
             [f"EXECUTE claim('bench-{i}', '\\x01', '\\x02', 30000, 0);" for i in range(n)]),
            ("claim, a replay (a record found, 1 KiB shipped)",
             [f"EXECUTE claim('{k}', '\\x{fp}', '\\x02', 30000, 0);" for k, fp in pairs]),
            ("SELECT record by key (no claim, for comparison)",
             [f"SELECT record FROM onceproxy_records WHERE key = '{k}';" for k, _ in pairs])):
        print(f"{label}: {summary(timed_runs(cluster, prep, lines))}")
    time.sleep(1)  # statistics are sent at the end of a session
    hot = cluster.psql("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                       "WHERE relid = 'public.onceproxy_records'::regclass;").strip()
    print(f"  replays' updates (all, HOT): {hot}")

    # Throughput with 8 sessions (pgbench, prepared): replays of live records through the claim
    # statement against plain SELECTs of the same rows. The key and fingerprint are computed in
    # the statement from pgbench's random id, the rest is claim_sql as is.
    key = "'onceproxy:' || encode(sha256(int8send(:id::bigint)), 'hex')"
    claim = (render(stmts["claim"], table)
             .replace("$1::text", f"({key})")
             .replace("$2::bytea", "sha256(int8send(:id::bigint * 7))")
             .replace("$3::bytea", "'\\x02'::bytea").replace("$4::bigint", "30000")
             .replace("$5::bigint", "0"))
    pick = "\\set id 50 * random(2000, 19999) + 1\n"
    lookup = (render(stmts["lookup"], table).replace("$1::text", f"({key})")
              .replace("$2::bytea", "sha256(int8send(:id::bigint * 7))")
              .replace("$3::bytea", "'\\x02'::bytea"))
    for label, body in (("claim, replay", claim), ("lookup, replay", lookup),
                        ("SELECT record by key", f"SELECT record FROM {table} WHERE key = {key}")):
        path = os.path.join(cluster.dir, "bench.sql")
        with open(path, "w") as f:
            f.write(pick + " ".join(body.split()) + ";\n")
        r = subprocess.run([f"{PGBIN}/pgbench", "-n", "-M", "prepared", "-c", "8", "-j", "2",
                            "-T", "10", "-f", path, "-h", "127.0.0.1", "-p", str(cluster.port),
                            "-U", "postgres", "postgres"], capture_output=True, text=True)
        tps = re.search(r"tps = ([0-9.]+)", r.stdout)
        lat = re.search(r"latency average = ([0-9.]+) ms", r.stdout)
        print(f"pgbench, 8 sessions, {label}: "
              f"{tps.group(1) if tps else r.stderr[-300:]} per second, "
              f"latency {lat.group(1) if lat else '?'} ms")

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", action="store_true", help="also measure size and sweep cost")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running (debugging)")
    ap.add_argument("--header", default=HEADER, help="read the statements from this file")
    args = ap.parse_args()
    stmts = load_statements(args.header)
    started = time.monotonic()
    cluster = Cluster()
    check = Checker()
    try:
        cluster.start()
        print(f"PostgreSQL 15 on 127.0.0.1:{cluster.port}, data in {cluster.dir}")
        contract(cluster, stmts, check)
        grants(cluster, stmts, check)
        concurrency(cluster, stmts, check)
        if args.measure:
            measure(cluster, stmts)
    finally:
        if args.keep:
            print(f"kept: {cluster.dir} (port {cluster.port})")
        else:
            cluster.stop()
    print(f"\n{check.passed} checks passed, {len(check.failed)} failed "
          f"({time.monotonic() - started:.1f} s)")
    for f in check.failed:
        print(f"  FAILED {f}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
