#!/usr/bin/env python3
"""redis-server's CPU per first execution, the two commands alone: the claim (SET NX PX GET)
and the completion (EVALSHA of complete_lua), as src/store/redis_store.cpp sends them.

Starts a private redis-server on a free port and pipelines each row's commands (64 a write) on
one connection; a row's figure is redis-server's on-CPU time (/proc/PID/schedstat) per first
execution. Rows alternate, and each is repeated (--reps); the median and the minimum are
printed. Two datasets: `steady` overwrites the same --keys keys (no new memory is touched),
`growing` writes a new key per execution (page faults included).

The completion is measured as in the source (`complete`), and as in a git revision
(--base REV, e.g. main) when given. Three floors stand beside it: the completion without
fencing (a plain `SET … XX` of the same record, what a native compare-and-set would cost), a
script that only returns (what any script call costs with the same arguments), and complete's
fast path as a Redis Function (FCALL). Each is called as its own source calls it: the lease and
the record built by the proxy (a script that compares `v == ARGV[1]`), else the owner and the
payload. `complete_prefix` is the current script when complete is not given the claim's
fields (only its owner's prefix is sent): the script builds the record in Lua.

With --instructions, redis-server runs under valgrind's callgrind and each row's figure is its
instructions per first execution (the same from run to run, unlike CPU time on a busy machine;
give fewer --ops: valgrind is some fifty times slower).

    bench/redis_script.py --base main
    bench/redis_script.py --base main --instructions --ops 2000 --reps 1
"""

import argparse
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "src/store/redis_store.cpp"


def complete_script(text):
    m = re.search(r'complete_lua = R"lua\((.*?)\)lua"', text, re.S)
    if not m:
        sys.exit("no complete_lua in " + SOURCE)
    return m.group(1)


# complete_lua's fast path (the lease matches) as a Redis Function: FCALL against EVALSHA.
FUNCTIONS = """#!lua name=onceproxy_bench
redis.register_function('onceproxy_bench_complete', function(keys, args)
  local v = redis.call('GET', keys[1])
  if v == args[1] then
    redis.call('SET', keys[1], args[2], 'PX', args[3])
    return 1
  end
  return 0
end)
"""


def enc(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="also measure complete_lua of this git revision")
    ap.add_argument("--ops", type=int, default=20000, help="first executions per row and run")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--payload", type=int, default=450, help="payload bytes")
    ap.add_argument("--keys", type=int, default=2000, help="keys of the steady dataset")
    ap.add_argument("--datasets", default="steady,growing")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions under callgrind instead of CPU time")
    args = ap.parse_args()

    scripts = {"complete": complete_script(open(os.path.join(ROOT, SOURCE)).read())}
    if args.base:
        text = subprocess.run(["git", "-C", ROOT, "show", f"{args.base}:{SOURCE}"],
                              check=True, capture_output=True, text=True).stdout
        scripts["complete@" + args.base] = complete_script(text)

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="redis-script-")
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--logfile", os.path.join(tmp, "redis.log")]
    if args.instructions:
        command = ["valgrind", "--tool=callgrind", "--log-file=" + os.path.join(tmp, "vg.log"),
                   "--callgrind-out-file=" + os.path.join(tmp, "callgrind.out")] + command
    server = subprocess.Popen(command)
    try:
        for _ in range(400):
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
        else:
            sys.exit("redis-server did not start")
        run(conn, server.pid, scripts, args, tmp)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp)


def run(conn, pid, scripts, args, tmp):
    def cmd(*a):
        conn.sendall(enc(list(a)))
        return conn.recv(1 << 16)

    def cpu_seconds():
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def faults():
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(")")[1].split()[7])

    dumps = [0]

    def instructions():
        # Dumps callgrind's counters, which zeroes them: what ran since the last dump.
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        dumps[0] += 1
        with open(os.path.join(tmp, f"callgrind.out.{dumps[0]}")) as f:
            for line in f:
                if line.startswith("totals:"):
                    return int(line.split()[1])
        sys.exit("no totals in callgrind's dump")

    # A row's figure: CPU µs, or instructions (counted since the dump that starts the row).
    def figure_start():
        return instructions() if args.instructions else cpu_seconds()

    def figure_end(start, n):
        if args.instructions:
            return instructions() / n
        return (cpu_seconds() - start) / n * 1e6

    sha = {}
    for name, body in scripts.items():
        sha[name] = cmd("SCRIPT", "LOAD", body).split(b"\r\n")[1].decode()

    rnd = random.Random(1)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    payloads = ["".join(rnd.choice(alphabet) for _ in range(args.payload)) for _ in range(512)]
    owners = ["%032x" % rnd.getrandbits(128) for _ in range(509)]
    fingerprint = "%064x" % rnd.getrandbits(256)
    generation = [0]

    def lease(i):
        o = owners[i % len(owners)]
        return "2f%d:%s%d:%s%d;" % (len(o), o, len(fingerprint), fingerprint, 1764250000000 + i)

    def prefix(i):
        o = owners[i % len(owners)]
        return "2f%d:%s" % (len(o), o)

    def key(i, growing):
        return f"g{generation[0]}:{i}" if growing else f"k{i % args.keys}"

    def claim(i, g):
        # Overwrites (no NX) so that the steady dataset is claimed again and again.
        return enc(["SET", key(i, g), lease(i), "PX", "30000", "GET"])

    def complete(name, known=True):
        body = scripts[name]
        if "v == ARGV[1]" not in body:
            return lambda i, g: claim(i, g) + enc(
                ["EVALSHA", sha[name], "1", key(i, g), owners[i % len(owners)],
                 payloads[i % 512], "3600000"])

        def make(i, g):
            sent = lease(i) if known else prefix(i)
            record = "2c" + sent[2:] + payloads[i % 512]
            return claim(i, g) + enc(["EVALSHA", sha[name], "1", key(i, g), sent, record,
                                      "3600000"])
        return make

    def record(i):
        return "2c" + lease(i)[2:] + payloads[i % 512]

    # The floors: what a completion costs Redis without fencing (a plain SET of the record),
    # and what any script call costs whatever it does (a script that only returns, and a Redis
    # Function, given the completion's arguments).
    sha["noop"] = cmd("SCRIPT", "LOAD", "return 1").split(b"\r\n")[1].decode()
    cmd("FUNCTION", "LOAD", "REPLACE", FUNCTIONS)
    rows = {
        "claim": claim,
        "claim + SET payload": lambda i, g: claim(i, g) + enc(
            ["SET", key(i, g), payloads[i % 512], "PX", "3600000"]),
        "claim + SET record XX (unfenced)": lambda i, g: claim(i, g) + enc(
            ["SET", key(i, g), record(i), "XX", "PX", "3600000"]),
        "claim + script that only returns": lambda i, g: claim(i, g) + enc(
            ["EVALSHA", sha["noop"], "1", key(i, g), lease(i), record(i), "3600000"]),
        "claim + FCALL of complete's fast path": lambda i, g: claim(i, g) + enc(
            ["FCALL", "onceproxy_bench_complete", "1", key(i, g), lease(i), record(i),
             "3600000"]),
    }
    for name in scripts:
        rows["claim + " + name] = complete(name)
    rows["claim + complete_prefix"] = complete("complete", known=False)

    def send(writes):
        for w in writes:
            conn.sendall(w)
            data = b""
            while not data.endswith(b"+PONG\r\n"):
                data += conn.recv(1 << 20)
            if b"\r\n-" in data or data.startswith(b"-"):
                sys.exit("error reply: " + data[:300].decode(errors="replace"))

    def pipeline(make, growing, begin, end):
        return [b"".join(make(j, growing) for j in range(i, min(i + 64, end))) + enc(["PING"])
                for i in range(begin, end, 64)]

    def measure(make, growing, n):
        generation[0] += 1
        if not growing:
            # The steady keys hold what this row writes (their values' sizes) before it counts.
            send(pipeline(make, False, n, n + args.keys))
        writes = pipeline(make, growing, 0, n)
        t0, f0 = figure_start(), faults()
        send(writes)
        return figure_end(t0, n), (faults() - f0) / n

    datasets = args.datasets.split(",")
    results = {(r, d): [] for r in rows for d in datasets}
    names = list(rows)
    for rep in range(args.reps):
        for d in datasets:
            for r in names if rep % 2 == 0 else names[::-1]:
                results[(r, d)].append(measure(rows[r], d == "growing", args.ops))
        cmd("FLUSHALL")

    unit = "instructions" if args.instructions else "CPU µs"
    print(f"redis-server {unit} per first execution, {args.ops} per run, {args.reps} runs, "
          f"payload {args.payload} B")
    print(f"| row | {' | '.join(f'{d} median | {d} min | {d} faults' for d in datasets)} |")
    print("|---|" + "---|" * (3 * len(datasets)))
    for r in names:
        cells = []
        for d in datasets:
            us = [x[0] for x in results[(r, d)]]
            fl = [x[1] for x in results[(r, d)]]
            fmt = ".0f" if args.instructions else ".2f"
            cells += [f"{statistics.median(us):{fmt}}", f"{min(us):{fmt}}",
                      f"{statistics.median(fl):.3f}"]
        print(f"| {r} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
