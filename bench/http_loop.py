#!/usr/bin/env python3
"""Sequential POSTs with Idempotency-Key over one keep-alive connection (stdlib only).

Used by bench/run.sh to record the replay key pool before the replay load, and to send the
N replays / N first executions that --commandstats divides Redis's command counts by.

  http_loop.py --port P --path /pay/replay --prefix KEYPREFIX --count N [--expect stored]

Keys are KEYPREFIX1 .. KEYPREFIX<N> (the same names bench/lua/replay.lua uses). Prints one
summary line (HTTP statuses and Idempotency-Status values seen) and exits 1 when --expect is
given and any answer does not carry that Idempotency-Status, or when the time bound runs out.
"""
import argparse
import collections
import http.client
import sys
import time

BODY = b'{"amount":1000,"currency":"eur","note":"bench"}'


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/pay/replay")
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--expect", default="", help="required Idempotency-Status value")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds")
    args = ap.parse_args()

    deadline = time.monotonic() + args.time_limit
    statuses: collections.Counter = collections.Counter()
    marks: collections.Counter = collections.Counter()
    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=10)
    sent = 0
    for i in range(1, args.count + 1):
        if time.monotonic() > deadline:
            print(f"time limit of {args.time_limit}s reached after {sent} requests", file=sys.stderr)
            return 1
        headers = {"Content-Type": "application/json", "Idempotency-Key": f"{args.prefix}{i}"}
        try:
            conn.request("POST", args.path, body=BODY, headers=headers)
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            # One reconnect per failure; a server that is gone fails the next attempt too.
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=10)
            conn.request("POST", args.path, body=BODY, headers=headers)
            resp = conn.getresponse()
            resp.read()
        sent += 1
        statuses[resp.status] += 1
        marks[resp.getheader("Idempotency-Status", "-")] += 1
    conn.close()
    print(f"sent={sent} http={dict(sorted(statuses.items()))} "
          f"idempotency_status={dict(sorted(marks.items()))}")
    if args.expect and marks.get(args.expect, 0) != sent:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
