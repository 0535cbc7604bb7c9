#!/usr/bin/env python3
"""Report step of bench/run.sh (stdlib only): parses wrk outputs, takes the median over rounds,
prints the table and the SPEC §7 ratios, and writes summary.json next to the inputs.

  report.py RESULTS_DIR

RESULTS_DIR holds r<round>-<scenario>.txt (wrk --latency output, h2load's for the HTTP/2
rows, onceproxy_grpc_load's JSON line for the gRPC rows, or h2load's with --grpc-load h2load),
meta.json (run parameters), engine-grpc.txt (as engine.txt, for the guarded gRPC route)
and, optionally, engine.txt (first line "available" or the reason the idempotency scenarios
were not measured), engine-cluster<N>.txt and metrics-cluster<N>.txt (the same for the
onceproxy of the Redis Cluster of N masters, whose loads are r<round>-first_cluster<N>.txt and
r<round>-replay_cluster<N>.txt), engine-pg-<variant>.txt, metrics-pg-<variant>.txt and
postgres-settings.txt (the PostgreSQL rows: onceproxy on a private PostgreSQL server, variant
claim or lookup; their loads' .postgres-cpu and .postgres-counters files hold the server's CPU
time and its next transaction id and WAL position before and after), the loads' .split,
.redis-split, .postgres-split and .upstream-split files (user ticks, system ticks, minor page
faults, voluntary context switches of their threads, ticks per second of the proxy, the store
server and the upstream during the load),
r<round>-bulk_<mode>_<target>.json (one large transfer each, from bulk.py)
and, with --commandstats, commandstats-{first,replay}.txt (INFO commandstats
after N sequential requests of each kind) or commandstats-unavailable.txt.
"""
import json
import math
import pathlib
import re
import statistics
import sys

SCENARIOS = [
    ("direct", "upstream directly, GET"),
    ("floor", "byte relay, no HTTP (the floor), GET"),
    ("nginx", "nginx proxy_pass, GET"),
    ("proxy", "onceproxy plain route, GET"),
    ("nginx_tls", "nginx terminating TLS, GET"),
    ("proxy_tls", "onceproxy terminating TLS, GET"),
    ("nginx_h2c", "nginx, h2c in, HTTP/1.1 out, GET"),
    ("proxy_h2c", "onceproxy, h2c in, HTTP/1.1 out, GET"),
    ("nginx_h2", "nginx, h2 (TLS) in, HTTP/1.1 out, GET"),
    ("proxy_h2", "onceproxy, h2 (TLS) in, HTTP/1.1 out, GET"),
    ("nginx_h2c_h2c", "nginx, h2c in, h2c out (grpc_pass), GET"),
    ("proxy_h2c_h2c", "onceproxy, h2c in, h2c out, GET"),
    ("nginx_grpc", "nginx grpc_pass, unary gRPC"),
    ("proxy_grpc", "onceproxy plain gRPC route, unary"),
    ("grpc_replay", "onceproxy guarded gRPC, replay"),
    ("grpc_first", "onceproxy guarded gRPC, first execution"),
    ("proxy_post", "onceproxy plain route, POST+key (Lua)"),
    ("replay", "onceproxy guarded, replay"),
    ("first", "onceproxy guarded, first execution"),
    ("floor_post", "byte relay (the floor), POST+key (Lua)"),
    ("floor_first", "the floor of a first execution (Redis)"),
    ("observe", "onceproxy observe mode, first execution"),
    ("pg_first", "PostgreSQL store, first execution"),
    ("pg_replay", "PostgreSQL store, replay"),
    ("pg_first_lookup", "PostgreSQL, look-up first, first exec."),
    ("pg_replay_lookup", "PostgreSQL, look-up first, replay"),
    ("half_direct", "upstream directly, GET, half load"),
    ("half_floor", "byte relay (the floor), GET, half load"),
    ("half_nginx", "nginx, GET, half load"),
    ("half_proxy", "onceproxy plain route, GET, half load"),
]
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def duration_seconds(text: str) -> float:
    """A config duration ("2s", "1h") in seconds."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text)
    if not m:
        raise ValueError(f"unknown duration '{text}'")
    return int(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def to_ms(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unknown latency '{text}'")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_wrk(text: str) -> dict:
    """Requests/sec, p50/p99 in ms, request count, non-2xx/3xx count, socket errors."""
    out = {}
    m = re.search(r"Requests/sec:\s+([0-9.]+)", text)
    if not m:
        raise ValueError("no Requests/sec line")
    out["rps"] = float(m.group(1))
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", text, re.M)
        out[f"p{pct}"] = to_ms(m.group(1)) if m else float("nan")
    m = re.search(r"(\d+) requests in", text)
    out["requests"] = int(m.group(1)) if m else 0
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["errors"] = sum(int(g) for g in m.groups()) if m else 0
    return out


def parse_h2load(text: str) -> dict:
    """The same figures from h2load's summary: it prints no percentiles, so p50/p99 are NaN
    and mean_ms is its mean time per request."""
    m = re.search(r"^finished in [0-9.]+\w+, ([0-9.]+) req/s", text, re.M)
    if not m:
        raise ValueError("no 'finished in ... req/s' line")
    out = {"rps": float(m.group(1)), "p50": float("nan"), "p99": float("nan")}
    m = re.search(r"^requests: \d+ total, \d+ started, (\d+) done, \d+ succeeded, (\d+) failed",
                  text, re.M)
    out["requests"] = int(m.group(1)) if m else 0
    out["errors"] = int(m.group(2)) if m else 0
    m = re.search(r"^status codes: \d+ 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx", text, re.M)
    out["non2xx"] = int(m.group(1)) + int(m.group(2)) if m else 0
    m = re.search(r"^time for request:\s+\S+\s+\S+\s+(\S+)", text, re.M)
    out["mean_ms"] = to_ms(m.group(1)) if m else float("nan")
    return out


def parse_grpc_load(text: str) -> dict:
    """onceproxy_grpc_load's JSON line: calls completed, calls/s, p50/p99 in ms; HTTP statuses
    other than 200 and grpc-status other than 0 count as non-2xx (a call can be both)."""
    r = json.loads(text.strip().splitlines()[-1])
    bad_http = sum(n for status, n in r["http_status"].items() if status != "200")
    bad_grpc = sum(n for status, n in r["grpc_status"].items() if status != "0")
    return {"rps": float(r["rps"]), "p50": float(r["p50_ms"]), "p99": float(r["p99_ms"]),
            "requests": int(r["calls"]), "errors": int(r["errors"]),
            "non2xx": max(bad_http, bad_grpc), "grpc_status": r["grpc_status"]}


def parse_load(text: str) -> dict:
    """A wrk, an h2load or an onceproxy_grpc_load output."""
    if text.lstrip().startswith("{"):
        return parse_grpc_load(text)
    if re.search(r"^finished in ", text, re.M):
        return parse_h2load(text)
    return parse_wrk(text)


# Commands that are not part of a request: connection set-up, health checks, this script's own.
NOT_PER_REQUEST = {"info", "config", "ping", "client", "hello", "select", "auth", "command"}


def parse_commandstats(text: str) -> dict:
    """INFO commandstats -> {command: calls}."""
    calls = {}
    for m in re.finditer(r"^cmdstat_([^:]+):calls=(\d+)", text, re.M):
        calls[m.group(1)] = int(m.group(2))
    return calls


def parse_monitor(text: str) -> dict:
    """MONITOR output -> {command: calls} for commands clients sent (not those scripts ran)."""
    calls: dict = {}
    for m in re.finditer(r'^[0-9.]+ \[\d+ ([^\]]+)\] "([^"]+)"', text, re.M):
        if m.group(1) == "lua":
            continue
        cmd = m.group(2).lower()
        calls[cmd] = calls.get(cmd, 0) + 1
    return calls


def commandstats(d: pathlib.Path, meta: dict, summary: dict) -> None:
    unavailable = d / "commandstats-unavailable.txt"
    if unavailable.exists():
        print()
        print(f"Redis commands per request: engine not available "
              f"({unavailable.read_text().strip()})")
        summary["commandstats"] = "engine not available"
        return
    n = meta["commandstats_requests"]
    rows = []
    for path, target in (("replay", 1), ("first", 2)):
        f = d / f"commandstats-{path}.txt"
        if not f.exists():
            return
        calls = parse_commandstats(f.read_text())
        mon = d / f"monitor-{path}.txt"
        top = parse_monitor(mon.read_text()) if mon.exists() else {}
        counted = {k: v for k, v in top.items() if k not in NOT_PER_REQUEST}
        per_request = sum(counted.values()) / n if n and mon.exists() else float("nan")
        summary.setdefault("commandstats", {})[path] = {
            "round_trips_per_request": per_request, "client_commands": top, "commandstats": calls}
        sent = ", ".join(f"{k} {v}" for k, v in sorted(counted.items())) or "none"
        detail = ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "none"
        rows.append(f"  {path:<7} {per_request:5.2f} round trips/request  [target {target}]  "
                    f"client commands: {sent}\n"
                    f"          INFO commandstats (script-internal calls included): {detail}")
    print()
    print(f"Redis round trips per request ({n} sequential requests per path; commands sent by "
          f"onceproxy, from MONITOR; info/config/ping/client not counted)")
    print("\n".join(rows))


BULK_TARGETS = (("direct", "upstream directly"), ("nginx", "nginx"), ("proxy", "onceproxy"))


def cluster_scenarios(meta: dict) -> list:
    """The rows of the Cluster scenarios, one pair per Cluster size of the run."""
    rows = []
    for n in meta.get("cluster_masters", []):
        masters = f"{n} master{'s' if n != 1 else ''}"
        rows.append((f"first_cluster{n}", f"Cluster ({masters}), first execution"))
        rows.append((f"replay_cluster{n}", f"Cluster ({masters}), replay"))
    return rows


def proxy_round_trips(d: pathlib.Path, summary: dict, name: str = "metrics",
                      label: str = "", route: str = "guarded", stored_target: int = 2) -> None:
    """Store round trips per request of a guarded route, from onceproxy's own /metrics
    (stored_target: 3 with PostgreSQL's look-up first, which reads before it claims)."""
    f = d / f"{name}.txt"
    if not f.exists():
        return
    series = {}
    for line in f.read_text().splitlines():
        m = re.match(r'(onceproxy_(?:requests|store_round_trips)_total)'
                     rf'\{{route="{route}",outcome="(\w+)"\}} (\d+)$', line)
        if m:
            series[(m.group(1), m.group(2))] = int(m.group(3))
    parts = []
    for outcome, target in (("replayed", 1), ("stored", stored_target)):
        n = series.get(("onceproxy_requests_total", outcome), 0)
        if n == 0 or ("onceproxy_store_round_trips_total", outcome) not in series:
            continue  # no such requests, or a onceproxy that does not count its round trips
        per = series.get(("onceproxy_store_round_trips_total", outcome), 0) / n
        key = "store_round_trips_per_request" + (f"_{name}" if name != "metrics" else "")
        key += f"_{route}" if route != "guarded" else ""
        summary.setdefault(key, {})[outcome] = per
        parts.append(f"{outcome} {per:.2f} [target {target}] over {n} requests")
    if parts:
        print(f"  store round trips per request{label} (onceproxy_store_round_trips_total / "
              "onceproxy_requests_total, whole run): " + ", ".join(parts))


def cluster_figures(d: pathlib.Path, meta: dict, med: dict, runs: dict, summary: dict) -> None:
    """Cluster / single-node ratios of the first-execution and replay paths, per Cluster size:
    of the medians, and of each round (the two loads ran in the same round, close in time)."""
    fig = summary["figures"]
    for n in meta.get("cluster_masters", []):
        engine_file = d / f"engine-cluster{n}.txt"
        engine = engine_file.read_text().strip() if engine_file.exists() else ""
        masters = f"{n} master{'s' if n != 1 else ''}"
        for path in ("first", "replay"):
            name = f"{path}_cluster{n}"
            if f"{path}_cluster" not in meta["scenarios"]:
                continue
            label = f"Cluster ({masters}) / single node, {path}"
            if engine and engine.splitlines()[0] != "available":
                print(f"  {label:<44} engine not available ({engine.splitlines()[0]})")
                fig[f"cluster{n}_{path}_vs_single"] = "engine not available"
                continue
            if name not in med or path not in med or med[path]["rps"] <= 0:
                print(f"  {label:<44} not measured")
                continue
            r = med[name]["rps"] / med[path]["rps"]
            single = {x["round"]: x["rps"] for x in runs[path]}
            per_round = [x["rps"] / single[x["round"]] for x in runs[name]
                         if single.get(x["round"], 0) > 0]
            fig[f"cluster{n}_{path}_vs_single"] = r
            target = ("[>= 0.9x: the per-master target]" if n == 1 else
                      "[whole Cluster against one node]")
            extra = ""
            if per_round:
                fig[f"cluster{n}_{path}_vs_single_per_round"] = per_round
                extra = (f"; per round " + " ".join(f"{x:.2f}" for x in per_round) +
                         f" (median {statistics.median(per_round):.2f})")
            if med[name]["cpu_us"] > 0 and med[path]["cpu_us"] > 0:
                cpu = med[path]["cpu_us"] / med[name]["cpu_us"]
                fig[f"cluster{n}_{path}_vs_single_cpu"] = cpu
                extra += (f"; by onceproxy CPU time per request {cpu:.2f}x "
                          f"({med[name]['cpu_us']:.1f} vs {med[path]['cpu_us']:.1f} us)")
            bad = med[name]["non2xx"] + med[name]["errors"]
            if bad > 0.01 * max(1.0, med[name]["rps"]):
                extra += f"  WARNING: {bad} non-2xx/errors, figure not meaningful"
            print(f"  {label:<44} {r:6.2f}x  {target}{extra}")


def bulk(d: pathlib.Path, meta: dict, summary: dict, problems: list) -> None:
    """The upload/download rows: MB/s (median over rounds) and the highest peak RSS seen."""
    runs: dict = {}
    for f in sorted(d.glob("r*-bulk_*.json")):
        m = re.fullmatch(r"r(\d+)-bulk_(upload|download)_(\w+)\.json", f.name)
        if not m:
            continue
        try:
            r = json.loads(f.read_text())
        except ValueError as e:
            problems.append(f"{f.name}: {e}")
            continue
        if not r.get("ok"):
            problems.append(f"{f.name}: transfer failed ({r.get('detail')})")
            continue
        runs.setdefault((m.group(2), m.group(3)), []).append(r)
    if not runs:
        return
    size = meta.get("bulk_bytes", 0)
    print()
    print(f"large transfers: {size / 2**30:.2f} GiB streamed per transfer (curl, one connection), "
          f"MB/s median over rounds, peak RSS of the process serving it (nginx: master + workers)")
    print(f"{'transfer':<34} {'MB/s':>8} {'peak RSS MiB':>13} {'RSS before MiB':>15}  MB/s per round")
    out = summary.setdefault("bulk", {})
    for mode in ("upload", "download"):
        for target, label in BULK_TARGETS:
            rs = runs.get((mode, target))
            if not rs:
                continue
            mbps = statistics.median(r["mb_per_s"] for r in rs)
            peak = max(r["peak_rss_kib"] for r in rs) / 1024
            before = min(r["rss_before_kib"] for r in rs) / 1024
            out[f"{mode}_{target}"] = {"mb_per_s": mbps, "peak_rss_mib": peak,
                                       "rss_before_mib": before}
            per_round = " ".join(f"{r['mb_per_s']:.0f}" for r in rs)
            print(f"{mode + ', ' + label:<34} {mbps:>8.0f} {peak:>13.1f} {before:>15.1f}  "
                  f"{per_round}")
        a, b = out.get(f"{mode}_proxy"), out.get(f"{mode}_nginx")
        if a and b and b["mb_per_s"] > 0:
            summary["figures"][f"{mode}_mbps_vs_nginx"] = a["mb_per_s"] / b["mb_per_s"]
            print(f"  {mode} throughput onceproxy/nginx {a['mb_per_s'] / b['mb_per_s']:.2f}x, "
                  f"onceproxy peak RSS {a['peak_rss_mib']:.1f} MiB "
                  f"(+{a['peak_rss_mib'] - a['rss_before_mib']:.1f} MiB during the transfer)")


def times_seconds(text: str) -> float:
    """User plus system seconds of the children line of bash's `times` ("0m0.231s 0m0.770s")."""
    lines = text.split("\n")
    if len(lines) < 2:
        return float("nan")
    total = 0.0
    for part in lines[1].split():
        m = re.fullmatch(r"(\d+)m([\d.]+)s", part)
        if not m:
            return float("nan")
        total += int(m.group(1)) * 60 + float(m.group(2))
    return total


def cpu_us(f: pathlib.Path, requests: int) -> float:
    """CPU time per request, us, from a "<ticks> <ticks per second>" file; NaN when missing."""
    if requests <= 0 or not f.exists():
        return float("nan")
    ticks, hz = (int(x) for x in f.read_text().split())
    return ticks * 1e6 / hz / requests


SPLIT_GROUPS = ("proxy", "store", "upstream")
SPLIT_FIELDS = ("user_us", "sys_us", "minflt", "sleeps")
SPLIT_KEYS = tuple(f"{g}_{k}" for g in SPLIT_GROUPS for k in SPLIT_FIELDS)


def split_share(f: pathlib.Path, requests: int, name: str) -> dict:
    """User and system CPU time per request, us, minor page faults and sleeps (voluntary context
    switches) per request, of the proxy, the store server (PostgreSQL for the pg_ rows, else
    Redis) and the upstream, from the "<user ticks> <system ticks> <minor faults> <sleeps>
    <ticks per second>" files (results from before the sleeps: four numbers); NaN when
    missing."""
    out = dict.fromkeys(SPLIT_KEYS, float("nan"))
    store = "postgres" if name.startswith("pg_") else "redis"
    for group, suffix in (("proxy", ".split"), ("store", f".{store}-split"),
                          ("upstream", ".upstream-split")):
        sf = f.with_name(f.name + suffix)
        if requests <= 0 or not sf.exists():
            continue
        values = [int(x) for x in sf.read_text().split()]
        user, system, faults, hz = values[0], values[1], values[2], values[-1]
        out[f"{group}_user_us"] = user * 1e6 / hz / requests
        out[f"{group}_sys_us"] = system * 1e6 / hz / requests
        out[f"{group}_minflt"] = faults / requests
        if len(values) == 5:
            out[f"{group}_sleeps"] = values[3] / requests
    return out


def split_table(meta: dict, med: dict) -> None:
    """The second table: where each process's CPU time per request goes (user or system time),
    the minor page faults per request that part of the system time pays for, and how often per
    request its threads went to sleep for want of work (each sleep ends in a wake-up that costs
    whoever sends it the work: a process slower than its peers leaves them idle, and pays for
    waking them)."""
    rows = [(n, label) for n, label in SCENARIOS + cluster_scenarios(meta) if n in med]
    if not any(not math.isnan(med[n]["proxy_user_us"]) for n, _ in rows):
        return  # a run without .split files
    print()
    print("user and system CPU time per request, us, minor page faults and sleeps per request "
          "(/proc/PID/stat utime, stime, minflt; voluntary context switches of its threads; "
          "median over rounds) of the proxy, the store server and the upstream")
    group_head = "".join(f"  {' ' + g + ' ':-^27}" for g in SPLIT_GROUPS)
    print(f"{'':<40}{group_head}")
    cols = "".join(f"  {'user':>6} {'sys':>6} {'minflt':>6} {'sleeps':>6}" for _ in SPLIT_GROUPS)
    print(f"{'scenario':<40}{cols}")
    for name, label in rows:
        r = med[name]
        cells = ""
        for g in SPLIT_GROUPS:
            user, system, faults, sleeps = (r[f"{g}_{k}"] for k in SPLIT_FIELDS)
            if g == "proxy" and name == "direct":
                user = system = faults = sleeps = float("nan")  # no proxy: that is the upstream
            cells += (f"  {fmt_us(user):>6} {fmt_us(system):>6} {fmt_flt(faults):>6}"
                      f" {fmt_flt(sleeps):>6}")
        print(f"{label:<40}{cells}")


SYSCALLS = ("recvfrom", "read", "sendto", "sendmsg", "writev", "write", "epoll_ctl", "epoll_wait")


def syscall_share(f: pathlib.Path, requests: int) -> dict:
    """System calls of the proxy per request, by call, from `perf stat -x,` output (--syscalls);
    empty when the run did not count them."""
    sf = f.with_name(f.name + ".syscalls")
    if requests <= 0 or not sf.exists():
        return {}
    out = {}
    for line in sf.read_text().splitlines():
        cells = line.split(",")
        if len(cells) > 2 and cells[2].startswith("syscalls:sys_enter_") and cells[0].isdigit():
            out[cells[2].removeprefix("syscalls:sys_enter_")] = int(cells[0]) / requests
    return {"syscalls": out} if out else {}


def syscall_table(meta: dict, runs: dict) -> None:
    """--syscalls: the proxy's system calls per request, by call (mean over rounds)."""
    rows = [(n, label) for n, label in SCENARIOS + cluster_scenarios(meta)
            if n in runs and all("syscalls" in r for r in runs[n])]
    if not rows:
        return
    print()
    print("system calls of the proxy per request (perf stat; mean over rounds)")
    print(f"{'scenario':<40}" + "".join(f" {c:>10}" for c in SYSCALLS) + f" {'all':>6}")
    for name, label in rows:
        rs = runs[name]
        per = {c: statistics.mean(r["syscalls"].get(c, 0.0) for r in rs) for c in SYSCALLS}
        print(f"{label:<40}" + "".join(f" {per[c]:>10.2f}" for c in SYSCALLS) +
              f" {sum(per.values()):>6.2f}")


def spread_share(f: pathlib.Path) -> dict:
    """With more than one worker: the client connections each worker held halfway through the
    load (run.sh sample_spread), worker after worker; empty when not sampled."""
    sf = f.with_name(f.name + ".spread")
    if not sf.exists():
        return {}
    counts = [int(x) for x in sf.read_text().split() if x.isdigit()]
    return {"spread": counts} if counts else {}


def spread_table(meta: dict, runs: dict) -> None:
    """How the kernel spread the load's connections over the workers (SO_REUSEPORT listeners,
    one per worker, in onceproxy and in nginx alike), one figure per round."""
    rows = [(n, label) for n, label in SCENARIOS if n in runs and any("spread" in r for r in runs[n])]
    if not rows:
        return
    print()
    print("client connections per worker halfway through the load, each round (busiest first; "
          "the kernel spreads them over the workers' SO_REUSEPORT listeners)")
    for name, label in rows:
        # --workers auto: one per CPU, as nginx's count is then.
        ours = int(meta["workers"]) if str(meta["workers"]).isdigit() else int(meta["nginx_workers"])
        workers = int(meta["nginx_workers"]) if name == "nginx" else ours
        rounds = []
        for r in runs[name]:
            counts = sorted(r.get("spread", []), reverse=True)
            counts += [0] * max(0, workers - len(counts))  # a worker ss listed none for
            rounds.append("/".join(str(c) for c in counts))
        print(f"{label:<40} {', '.join(rounds)}")


def syscall_cost_line(d: pathlib.Path) -> None:
    """What one system call costs on this machine (bench/onceproxy_syscall_cost)."""
    f = d / "syscall-cost.json"
    if not f.exists():
        return
    c = json.loads(f.read_text())
    print(f"one system call on this machine (onceproxy_syscall_cost): getppid "
          f"{c['getppid_ns'] / 1000:.2f} us, recv finding nothing {c['recv_eagain_ns'] / 1000:.2f} us, "
          f"epoll_ctl {c['epoll_ctl_mod_ns'] / 1000:.2f} us: the price of entering the kernel, "
          "paid on every read and write")


def machine_share(f: pathlib.Path, requests: int) -> dict:
    """The rest of the machine during one load: CPU time per request of the test upstream and
    of wrk, and the share of the CPUs left idle (NaN where a file is missing)."""
    out = {"upstream_us": float("nan"), "wrk_us": float("nan"), "idle": float("nan")}
    if requests <= 0:
        return out
    out["upstream_us"] = cpu_us(f.with_name(f.name + ".upstream-cpu"), requests)
    wt = f.with_name(f.name + ".wrk-times")
    if wt.exists():
        out["wrk_us"] = times_seconds(wt.read_text()) * 1e6 / requests
    mf = f.with_name(f.name + ".machine")
    if mf.exists():
        idle0, total0, idle1, total1 = (int(x) for x in mf.read_text().split())
        if total1 > total0:
            out["idle"] = (idle1 - idle0) / (total1 - total0)
    return out


def postgres_share(f: pathlib.Path, requests: int) -> dict:
    """The PostgreSQL server during one load (NaN where a file is missing): its CPU time per
    request (all its processes), and the write transactions and WAL bytes per request."""
    out = {"postgres_us": float("nan"), "xacts": float("nan"), "wal_bytes": float("nan")}
    if requests <= 0:
        return out
    out["postgres_us"] = cpu_us(f.with_name(f.name + ".postgres-cpu"), requests)
    counters = f.with_name(f.name + ".postgres-counters")
    if counters.exists():
        xid0, wal0, xid1, wal1 = (int(x) for x in counters.read_text().split())
        if xid0 > 0 and xid1 > 0:
            out["xacts"] = (xid1 - xid0) / requests
            out["wal_bytes"] = (wal1 - wal0) / requests
    return out


def budget(meta: dict, med: dict, fig: dict) -> None:
    """The most the first-execution throughput ratio could reach with every CPU busy: the ratio
    of the whole machine's CPU time per request (proxy, Redis, upstream and wrk share the cores;
    the per-process figures are the first table's)."""
    rows = [n for n in ("proxy", "proxy_post", "first", "replay") if n in med]
    if not rows or any(math.isnan(med[n]["upstream_us"]) for n in rows):
        return
    whole = {}
    for name in rows:
        r = med[name]
        redis = 0.0 if math.isnan(r["redis_us"]) else r["redis_us"]
        whole[name] = r["cpu_us"] + redis + r["upstream_us"] + r["wrk_us"]
    fig["cpu_per_request_all_processes"] = whole
    if "first" in whole and "proxy" in whole and whole["first"] > 0:
        bound = whole["proxy"] / whole["first"]
        fig["first_vs_plain_get_bound_all_cpus_busy"] = bound
        print(f"  first execution / plain GET, bounded by the whole machine's CPU per request: "
              f"at most {bound:.2f}x with every CPU busy")


def cpu_targets(med: dict, fig: dict) -> None:
    """The CPU-per-request targets: onceproxy against nginx on the plain path, the guarded paths
    against onceproxy's own plain GET, and Redis's share of a first execution."""
    rows = []
    if "proxy" in med and "nginx" in med and med["nginx"]["cpu_us"] > 0:
        rows.append(("plain GET, onceproxy / nginx", med["proxy"]["cpu_us"] / med["nginx"]["cpu_us"],
                     "x", 0.8))
    for name, target in (("first", 1.3), ("replay", 0.7)):
        if name in med and "proxy" in med and med["proxy"]["cpu_us"] > 0:
            rows.append((f"{name} / plain GET, onceproxy",
                         med[name]["cpu_us"] / med["proxy"]["cpu_us"], "x", target))
        # The same POST with the same key on the plain route: what the guard alone costs.
        if name in med and "proxy_post" in med and med["proxy_post"]["cpu_us"] > 0:
            rows.append((f"{name} / same POST unguarded, onceproxy",
                         med[name]["cpu_us"] / med["proxy_post"]["cpu_us"], "x", target))
    if "first" in med and not math.isnan(med["first"]["redis_us"]):
        rows.append(("Redis per first execution", med["first"]["redis_us"], " us", 12.0))
    if not rows:
        return
    print("  CPU time per request against its targets (lower is better):")
    for label, v, unit, target in rows:
        fig["cpu_target " + label] = {"value": v, "target": target, "met": v <= target}
        mark = "met" if v <= target else "NOT met"
        print(f"    {label:<40} {v:6.2f}{unit:<3} [<= {target}{unit.strip()}] {mark}")
    floor_budget(med, fig)
    first_floor_budget(med, fig)


def floor_budget(med: dict, fig: dict) -> None:
    """What the plain-path target leaves once the floor is paid: the byte relay's CPU per
    request (the same four system calls, no HTTP) is the least a proxy that reads and writes
    each message once spends here, so a proxy's CPU above it is its HTTP work; 0.8x nginx
    leaves that much for all of it."""
    if not all(n in med and med[n]["cpu_us"] > 0 for n in ("floor", "nginx", "proxy")):
        return
    floor, nginx, proxy = (med[n]["cpu_us"] for n in ("floor", "nginx", "proxy"))
    fig["floor_cpu_us"] = floor
    fig["floor_vs_nginx"] = floor / nginx
    print(f"  the floor (byte relay, no HTTP): {floor:.1f} us per request, {floor / nginx:.2f}x "
          f"nginx's CPU; above it nginx spends {nginx - floor:.1f} us, onceproxy "
          f"{proxy - floor:.1f} us; 0.8x nginx would leave {0.8 * nginx - floor:.1f} us")


def first_floor_budget(med: dict, fig: dict) -> None:
    """The same for the first execution: floor_first is the relay plus what a first execution
    through Redis cannot avoid (the hashes, a claim before forwarding, the record before
    answering, batched per round of events), against the relay's own POST. Its ratio is the
    least the first-execution target could be on this machine; onceproxy's CPU above each floor
    is its own work."""
    names = ("floor_post", "floor_first", "proxy_post", "first")
    if not all(n in med and med[n]["cpu_us"] > 0 for n in names):
        return
    fp, ff, post, first = (med[n]["cpu_us"] for n in names)
    fig["floor_first_cpu_us"] = ff
    fig["floor_first_vs_floor_post"] = ff / fp
    print(f"  the first execution's floor (the relay, SHA-256, claim and record in Redis, no "
          f"HTTP): {ff:.1f} us per request, {ff / fp:.2f}x the relay's POST ({fp:.1f} us); above "
          f"these floors onceproxy's first execution spends {first - ff:.1f} us, its POST "
          f"{post - fp:.1f} us; 1.3x the POST would leave {1.3 * post - ff:.1f} us")


PG_ROWS = (("first", "Redis store, first execution"), ("replay", "Redis store, replay"),
           ("pg_first", "PostgreSQL, first execution"), ("pg_replay", "PostgreSQL, replay"),
           ("pg_first_lookup", "PostgreSQL, look-up first, first exec."),
           ("pg_replay_lookup", "PostgreSQL, look-up first, replay"))


def postgres_figures(d: pathlib.Path, meta: dict, med: dict, runs: dict, summary: dict) -> None:
    """The PostgreSQL rows beside the Redis ones: CPU time per request of every process first
    (onceproxy, the store server, the upstream, wrk), then throughput and latency, the write
    transactions (commits) and WAL bytes per request; the ratios against plain GET and Redis."""
    names = meta["scenarios"].split(",")
    if not any(n.startswith("pg_") for n in names):
        return
    fig = summary["figures"]
    settings = d / "postgres-settings.txt"
    print()
    pool = meta.get("pg_pool", "default")
    print("PostgreSQL store (a private server on the same CPUs; onceproxy with store.postgres at "
          f"its defaults but the url{'' if pool == 'default' else f' and pool: {pool}'}; look-up "
          "first: lookup_before_claim: true)")
    if meta.get("pg_standby"):
        print("  with a synchronous standby on this machine (synchronous_standby_names): every "
              "commit also waits for its WAL flush there; its CPU time is counted in `store`")
    if meta.get("pg_settings"):
        print(f"  server settings given: {meta['pg_settings']} (the rest at the server's defaults)")
    if settings.exists():
        lines = settings.read_text().strip().splitlines()
        summary["postgres_settings"] = lines
        print("  server: " + "; ".join(lines))
    for v in ("claim", "lookup"):
        f = d / f"engine-pg-{v}.txt"
        if f.exists() and f.read_text().strip().splitlines()[0] != "available":
            print(f"  variant {v}: engine not available ({f.read_text().strip().splitlines()[0]})")
    print("CPU time per request, us (median over rounds): onceproxy, the store server (Redis: "
          "redis-server; PostgreSQL: postmaster and every backend and auxiliary process), the "
          "test upstream, wrk; then throughput, write transactions and WAL bytes per request")
    print(f"{'scenario':<40} {'proxy':>7} {'store':>7} {'upstream':>8} {'wrk':>6} {'req/s':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'xact/req':>8} {'WAL B/req':>9} {'non-2xx':>7} "
          f"{'errors':>6}")
    out = summary.setdefault("postgres", {})
    for name, label in PG_ROWS:
        if name not in med:
            continue
        r = med[name]
        store = r["postgres_us"] if name.startswith("pg_") else r["redis_us"]
        out[name] = {"proxy_us": r["cpu_us"], "store_us": store, "rps": r["rps"],
                     "p50_ms": r["p50"], "p99_ms": r["p99"], "xacts_per_request": r["xacts"],
                     "wal_bytes_per_request": r["wal_bytes"]}
        xacts = "" if math.isnan(r["xacts"]) else f"{r['xacts']:.2f}"
        wal = "" if math.isnan(r["wal_bytes"]) else f"{r['wal_bytes']:.0f}"
        print(f"{label:<40} {r['cpu_us']:>7.1f} {store:>7.1f} {r['upstream_us']:>8.1f} "
              f"{r['wrk_us']:>6.1f} {fmt(r['rps']):>9} {fmt_ms(r['p50']):>7} "
              f"{fmt_ms(r['p99']):>7} {xacts:>8} {wal:>9} {r['non2xx']:>7} {r['errors']:>6}")
    print("  xact/req: transactions that wrote (transaction ids assigned) per request; each one's "
          "commit waits for its WAL flush (synchronous_commit). Statements sent in one event-loop "
          "turn share one transaction, so it can be below the statements per request")

    def warn(name: str) -> str:
        bad = med[name]["non2xx"] + med[name]["errors"]
        return f"  WARNING: {bad} non-2xx/errors" if bad else ""

    def per_round(a: str, b: str) -> str:
        mine, base = med[a]["rps_by_round"], med[b]["rps_by_round"]
        pr = [mine[k] / base[k] for k in sorted(mine) if base.get(k, 0) > 0]
        return "; per round " + " ".join(f"{x:.2f}" for x in pr) if len(pr) > 1 else ""

    plain = med.get("proxy")
    for name in ("pg_replay", "pg_replay_lookup", "pg_first", "pg_first_lookup"):
        if name not in med or not plain or plain["rps"] <= 0 or med[name]["cpu_us"] <= 0:
            continue
        rps = med[name]["rps"] / plain["rps"]
        cpu = plain["cpu_us"] / med[name]["cpu_us"]
        fig[f"{name}_vs_plain_get"] = rps
        fig[f"{name}_vs_plain_get_cpu"] = cpu
        target = ""
        print(f"  {name} throughput / plain GET {rps:5.2f}x{target}{per_round(name, 'proxy')}; "
              f"by onceproxy CPU time per request {cpu:.2f}x ({med[name]['cpu_us']:.1f} vs "
              f"{plain['cpu_us']:.1f} us){warn(name)}")
    for pg, redis in (("pg_first", "first"), ("pg_replay", "replay")):
        if pg not in med or redis not in med or med[redis]["rps"] <= 0:
            continue
        a, b = med[pg], med[redis]
        rps = a["rps"] / b["rps"]
        fig[f"{pg}_vs_redis"] = rps
        print(f"  PostgreSQL / Redis, {redis}: throughput {rps:5.2f}x{per_round(pg, redis)}; "
              f"onceproxy {a['cpu_us']:.1f} vs {b['cpu_us']:.1f} us, store server "
              f"{a['postgres_us']:.1f} vs {b['redis_us']:.1f} us per request")
    for path in ("first", "replay"):
        a, b = f"pg_{path}_lookup", f"pg_{path}"
        if a not in med or b not in med or med[b]["rps"] <= 0:
            continue
        rps = med[a]["rps"] / med[b]["rps"]
        fig[f"{a}_vs_claim"] = rps
        print(f"  look-up first / claim alone, {path}: throughput {rps:5.2f}x{per_round(a, b)}; "
              f"PostgreSQL CPU {med[a]['postgres_us']:.1f} vs {med[b]['postgres_us']:.1f} us, "
              f"onceproxy {med[a]['cpu_us']:.1f} vs {med[b]['cpu_us']:.1f} us, write "
              f"transactions {med[a]['xacts']:.2f} vs {med[b]['xacts']:.2f} per request")
    proxy_round_trips(d, summary, "metrics-pg-claim", ", PostgreSQL")
    proxy_round_trips(d, summary, "metrics-pg-lookup", ", PostgreSQL with look-up first",
                      stored_target=3)


GRPC_ROWS = ("nginx_grpc", "proxy_grpc", "grpc_replay", "grpc_first")


def grpc_figures(d: pathlib.Path, meta: dict, med: dict, fig: dict) -> None:
    """The unary gRPC rows: CPU time per request of every process first (the proxy under test,
    the gRPC upstream nginx, Redis, the load generator), then throughput and latency; the
    onceproxy/nginx ratios of plain calls and the guarded paths against plain calls."""
    wanted = [n for n in GRPC_ROWS if n in meta["scenarios"].split(",")]
    if not wanted:
        return
    engine_file = d / "engine-grpc.txt"
    engine = engine_file.read_text().strip() if engine_file.exists() else ""
    labels = dict(SCENARIOS)
    print()
    print(f"gRPC unary calls: POST /bench.(Guarded)Payments/Charge, one {meta.get('grpc_message_bytes', '?')}"
          f"-byte message each way of about that size, h2c in and out; "
          f"{meta.get('h2_connections', '?')} connections x {meta.get('h2_streams', '?')} streams "
          f"({'h2load -t1, but grpc_first' if meta.get('grpc_load') == 'h2load' else 'every row'}: "
          f"onceproxy_grpc_load; grpc_first with a new idempotency-key per call)")
    print("CPU time per request, us (median over rounds): the proxy (nginx: master + workers), "
          "the gRPC upstream nginx, redis-server, the load generator; then throughput")
    print(f"{'scenario':<42} {'proxy':>7} {'upstream':>8} {'Redis':>7} {'loadgen':>7} "
          f"{'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'not OK':>7} {'errors':>6}")
    for name in wanted:
        if name not in med:
            if name in ("grpc_first", "grpc_replay") and engine and not engine.startswith("available"):
                why = engine.splitlines()[0]
                why = why if len(why) <= 160 else why[:157] + "..."
                print(f"{labels[name]:<42} engine not available ({why}; see engine-grpc.txt)")
            else:
                print(f"{labels[name]:<42} not measured")
            continue
        r = med[name]
        print(f"{labels[name]:<42} {r['cpu_us']:>7.1f} {r['upstream_us']:>8.1f} "
              f"{r['redis_us']:>7.1f} {r['wrk_us']:>7.1f} {fmt(r['rps']):>9} "
              f"{fmt_ms(r['p50']):>7} {fmt_ms(r['p99']):>7} {r['non2xx']:>7} {r['errors']:>6}")
    print("  not OK: calls answered with an HTTP status other than 200 or a grpc-status other than "
          "0, as onceproxy_grpc_load counts them; run.sh checked one call per target with grpcio "
          "before the loads (OK; stored then replayed on the guarded route)")
    if meta.get("grpc_load") == "h2load":
        print("  WARNING: the h2load rows count HTTP statuses only: a gRPC error (HTTP 200 with "
              "grpc-status) is not seen in them")

    def warn(*names: str) -> str:
        bad = sum(med[n]["non2xx"] + med[n]["errors"] for n in names)
        return f"  WARNING: {bad} not-OK answers/errors" if bad else ""

    p, n = med.get("proxy_grpc"), med.get("nginx_grpc")
    if p and n and n["cpu_us"] > 0 and n["rps"] > 0:
        cpu, rps = p["cpu_us"] / n["cpu_us"], p["rps"] / n["rps"]
        fig["grpc_cpu_per_request_vs_nginx"] = cpu
        fig["grpc_rps_vs_nginx"] = rps
        mine, theirs = p["rps_by_round"], n["rps_by_round"]
        per_round = [mine[k] / theirs[k] for k in sorted(mine) if theirs.get(k, 0) > 0]
        extra = ""
        if len(per_round) > 1:
            fig["grpc_rps_vs_nginx_per_round"] = per_round
            extra = "; per round " + " ".join(f"{x:.2f}" for x in per_round)
        print(f"  plain unary gRPC onceproxy/nginx: CPU time per request {cpu:5.2f}x "
              f"({p['cpu_us']:.1f} vs {n['cpu_us']:.1f} us; lower is better), throughput "
              f"{rps:5.2f}x ({p['rps']:,.0f} vs {n['rps']:,.0f} req/s) [>= 1.0x]{extra}"
              f"{warn('proxy_grpc', 'nginx_grpc')}")
    for name in ("grpc_replay", "grpc_first"):
        g = med.get(name)
        if not g or not p or p["rps"] <= 0 or g["cpu_us"] <= 0:
            continue
        what = name.split("_")[1]
        rps = g["rps"] / p["rps"]
        cpu = p["cpu_us"] / g["cpu_us"]
        fig[f"grpc_{what}_vs_plain"] = rps
        fig[f"grpc_{what}_vs_plain_cpu"] = cpu
        redis = 0.0 if math.isnan(g["redis_us"]) else g["redis_us"]
        print(f"  guarded gRPC {what} / plain gRPC call: throughput {rps:5.2f}x, by onceproxy CPU "
              f"time per request {cpu:5.2f}x ({g['cpu_us']:.1f} vs {p['cpu_us']:.1f} us; "
              f"+ Redis {redis:.1f} us), store {meta['store']}{warn(name)}")


def fmt(v: float, unit: str = "") -> str:
    if v != v:  # NaN
        return "n/a"
    return f"{v:.2f}{unit}" if unit else f"{v:,.0f}"


def fmt_us(v: float) -> str:
    return "-" if v != v else f"{v:.1f}"


def fmt_flt(v: float) -> str:
    return "-" if v != v else f"{v:.2f}"


def fmt_ms(v: float) -> str:
    return "n/a" if v != v else f"{v:.2f}"


def no_nan(v):
    """NaN (a figure not measured, e.g. Redis CPU with the memory store) as null: valid JSON."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: no_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [no_nan(x) for x in v]
    return v


def main() -> int:
    d = pathlib.Path(sys.argv[1])
    meta = json.loads((d / "meta.json").read_text())
    engine_file = d / "engine.txt"
    engine = engine_file.read_text().strip() if engine_file.exists() else "available"
    engine_ok = engine.splitlines()[0] == "available" if engine else False

    runs: dict = {}
    problems = []
    for f in sorted(d.glob("r*-*.txt")):
        m = re.fullmatch(r"r(\d+)-(\w+)\.txt", f.name)
        if not m:
            continue
        try:
            parsed = parse_load(f.read_text())
            parsed["cpu_us"] = cpu_us(f.with_name(f.name + ".cpu"), parsed["requests"])
            parsed["redis_us"] = cpu_us(f.with_name(f.name + ".redis-cpu"), parsed["requests"])
            parsed.update(postgres_share(f, parsed["requests"]))
            parsed.update(machine_share(f, parsed["requests"]))
            parsed.update(split_share(f, parsed["requests"], m.group(2)))
            parsed.update(syscall_share(f, parsed["requests"]))
            parsed.update(spread_share(f))
            parsed["round"] = int(m.group(1))
            runs.setdefault(m.group(2), []).append(parsed)
        except ValueError as e:
            problems.append(f"{f.name}: {e}")

    med = {}
    for name, rs in runs.items():
        med[name] = {k: statistics.median(r[k] for r in rs)
                     for k in ("rps", "p50", "p99", "cpu_us", "redis_us", "upstream_us", "wrk_us",
                               "idle", "postgres_us", "xacts", "wal_bytes") + SPLIT_KEYS}
        if "mean_ms" in rs[0]:
            med[name]["mean_ms"] = statistics.median(r["mean_ms"] for r in rs)
        med[name]["non2xx"] = sum(r["non2xx"] for r in rs)
        med[name]["errors"] = sum(r["errors"] for r in rs)
        med[name]["rounds_rps"] = [r["rps"] for r in rs]
        med[name]["rps_by_round"] = {r["round"]: r["rps"] for r in rs}

    print()
    print(f"onceproxy bench: {meta['rounds']} round(s) x {meta['duration']}s, wrk -t1 "
          f"-c{meta['connections']} (half load -c{meta['half_connections']}), "
          f"onceproxy workers={meta['workers']}, nginx worker_processes={meta['nginx_workers']}, "
          f"upstream threads={meta['upstream_threads']}, store={meta['store']}, "
          f"ttl={meta.get('ttl', '1h')}, {meta['cpus']} CPUs shared by everything")
    ttl = duration_seconds(meta.get("ttl", "1h"))
    loads = meta["duration"] * sum(len(rs) for rs in runs.values())
    if ttl < loads and any(n.startswith(("replay", "pg_replay", "grpc_replay")) for n in med):
        print(f"WARNING: the ttl is shorter than the run's loads ({loads}s): the replay rows' "
              "recorded keys expire during the run, so about one request per key per ttl is a "
              "first execution again")
    if any(n.endswith(("_h2", "_h2c")) for n in med):
        print(f"HTTP/2 rows: h2load -t1 -c{meta.get('h2_connections', '?')} "
              f"-m{meta.get('h2_streams', '?')} (streams per connection) -D{meta['duration']}; "
              "h2load gives no percentiles (p50/p99 n/a)")
    syscall_cost_line(d)
    if meta.get("load_start"):
        print(f"load average (1, 5, 15 min) at the start of the load {meta['load_start']}, "
              f"at the end {meta.get('load_end', '?')}")
    # CPU time per request first, for every process on the machine: on 2 shared cores the
    # throughput of one process is capped by the others, its CPU per request is not.
    print("CPU time per request, us, of each process (proxy: onceproxy, or nginx's workers; store: "
          "Redis or PostgreSQL; loadgen: wrk or h2load), then throughput and latency")
    print(f"{'scenario':<40} {'proxy':>6} {'store':>6} {'upstrm':>6} {'loadgen':>7} {'all':>6} "
          f"{'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'non-2xx':>7} {'errors':>6}  req/s per round")
    for name, label in SCENARIOS + cluster_scenarios(meta):
        if name in med:
            r = med[name]
            per_round = " ".join(fmt(x) for x in r["rounds_rps"])
            store = r["postgres_us"] if name.startswith("pg_") else r["redis_us"]
            proxy = float("nan") if name == "direct" else r["cpu_us"]
            parts = [x for x in (proxy, store, r["upstream_us"], r["wrk_us"]) if not math.isnan(x)]
            print(f"{label:<40} {fmt_us(proxy):>6} {fmt_us(store):>6} {fmt_us(r['upstream_us']):>6} "
                  f"{fmt_us(r['wrk_us']):>7} {fmt_us(sum(parts)):>6} {fmt(r['rps']):>9} "
                  f"{fmt_ms(r['p50']):>7} {fmt_ms(r['p99']):>7} {r['non2xx']:>7} {r['errors']:>6}  "
                  f"{per_round}")
        elif name in ("replay", "first", "observe") and not engine_ok and name in meta["scenarios"]:
            print(f"{label:<40} {'engine not available':>10}")
    split_table(meta, med)
    syscall_table(meta, runs)
    spread_table(meta, runs)

    summary: dict = {"meta": meta, "median": med, "engine": engine, "figures": {}}
    fig = summary["figures"]

    def ratio(a: str, b: str, key: str):
        if a in med and b in med and med[b][key] > 0:
            return med[a][key] / med[b][key]
        return None

    print()
    print("figures (median over rounds; SPEC section 7 targets in brackets)")
    r = ratio("proxy", "nginx", "rps")
    if r is not None:
        fig["plain_rps_vs_nginx"] = r
        print(f"  plain proxying throughput onceproxy/nginx    {r:6.2f}x  [>= 1.0x]")
    r = ratio("proxy", "nginx", "cpu_us")
    if r is not None:
        fig["plain_cpu_per_request_vs_nginx"] = r
        print(f"  plain proxying CPU time per request onceproxy/nginx {r:5.2f}x  (lower is better; "
              f"steadier than req/s on a shared machine)")
    r = ratio("proxy_tls", "nginx_tls", "rps")
    if r is not None:
        fig["tls_rps_vs_nginx"] = r
        print(f"  TLS termination throughput onceproxy/nginx   {r:6.2f}x  [>= 1.0x]")
    r = ratio("proxy_tls", "nginx_tls", "cpu_us")
    if r is not None:
        fig["tls_cpu_per_request_vs_nginx"] = r
        print(f"  TLS termination CPU time per request onceproxy/nginx {r:5.2f}x  (lower is better)")
    for name, what in (("h2c", "h2c in, HTTP/1.1 out"), ("h2", "h2 (TLS) in, HTTP/1.1 out"),
                       ("h2c_h2c", "h2c in, h2c out")):
        # CPU time per request first: req/s moves with the shared machine's noise.
        cpu = ratio(f"proxy_{name}", f"nginx_{name}", "cpu_us")
        rps = ratio(f"proxy_{name}", f"nginx_{name}", "rps")
        if cpu is None or rps is None:
            continue
        fig[f"{name}_cpu_per_request_vs_nginx"] = cpu
        fig[f"{name}_rps_vs_nginx"] = rps
        p, n = med[f"proxy_{name}"], med[f"nginx_{name}"]
        bad = p["non2xx"] + p["errors"] + n["non2xx"] + n["errors"]
        warn = f"  WARNING: {bad} non-2xx/errors" if bad else ""
        if name == "h2c_h2c":
            # The h2c upstream nginx's CPU time, counted for neither proxy.
            warn = (f"; the h2c upstream nginx's CPU time per request {p['upstream_us']:.1f} vs "
                    f"{n['upstream_us']:.1f} us (counted for neither){warn}")
        print(f"  HTTP/2, {what}: CPU time per request onceproxy/nginx {cpu:5.2f}x "
              f"({p['cpu_us']:.1f} vs {n['cpu_us']:.1f} us; lower is better), throughput "
              f"{rps:5.2f}x ({p['rps']:,.0f} vs {n['rps']:,.0f} req/s) [>= 1.0x, target 1.2x]; "
              f"mean time per request {p.get('mean_ms', float('nan')):.2f} vs "
              f"{n.get('mean_ms', float('nan')):.2f} ms{warn}")
    r = ratio("proxy", "nginx", "p99")
    if r is not None:
        fig["plain_p99_vs_nginx"] = r
        print(f"  plain proxying p99 onceproxy/nginx           {r:6.2f}x  (lower is better)")
    for name, target in (("replay", "0.8"), ("first", "0.6")):
        if name not in meta["scenarios"]:
            continue
        label = f"{name} path throughput / plain proxying"
        if not engine_ok:
            print(f"  {label:<44} engine not available ({engine.splitlines()[0]})")
            fig[f"{name}_vs_plain"] = "engine not available"
            continue
        r = ratio(name, "proxy", "rps")
        r2 = ratio(name, "proxy_post", "rps")
        if r is None:
            print(f"  {label:<44} not measured")
            continue
        fig[f"{name}_vs_plain_get"] = r
        extra = ""
        if r2 is not None:
            fig[f"{name}_vs_plain_post"] = r2
            extra = f", {r2:.2f}x vs the same POST on the plain route"
        # Each round runs every scenario back to back: the ratio within a round is less exposed
        # to a load that drifts between rounds than the ratio of medians.
        mine, plain = med[name]["rps_by_round"], med["proxy"]["rps_by_round"]
        pr = [mine[k] / plain[k] for k in sorted(mine) if plain.get(k, 0) > 0]
        if len(pr) > 1:
            fig[f"{name}_vs_plain_get_per_round"] = pr
            extra += ("; per round " + " ".join(f"{x:.2f}" for x in pr) +
                      f" (median {statistics.median(pr):.2f})")
        bad = med[name]["non2xx"] + med[name]["errors"]
        warn = ""
        if bad > 0.01 * max(1.0, med[name]["rps"]):
            warn = f"  WARNING: {bad} non-2xx/errors, figure not meaningful"
        cpu = ratio("proxy", name, "cpu_us")
        if cpu is not None:
            fig[f"{name}_vs_plain_get_cpu"] = cpu
            extra += f"; by CPU time per request {cpu:.2f}x"
        if "proxy_post" in med and meta["store"] == "redis":
            # Proxy plus Redis server CPU time per request, against the same POST unguarded:
            # what the throughput ratio tends to on a machine where everything shares the cores.
            both = med[name]["cpu_us"] + med[name]["redis_us"]
            base = med["proxy_post"]["cpu_us"] + med["proxy_post"]["redis_us"]
            if both > 0 and base > 0:
                fig[f"{name}_vs_plain_post_cpu_with_redis"] = base / both
                extra += (f"; by proxy+Redis CPU time per request vs the same POST "
                          f"{base / both:.2f}x ({both:.1f} against {base:.1f} us)")
        print(f"  {label:<44} {r:6.2f}x  [>= {target}x, store {meta['store']}]{extra}{warn}")
    cpu_targets(med, fig)
    r = ratio("observe", "first", "rps")
    if r is not None:
        fig["observe_vs_first_rps"] = r
        r2 = ratio("observe", "first", "cpu_us")
        extra = ""
        if r2 is not None:
            fig["observe_vs_first_cpu_per_request"] = r2
            extra = f", CPU time per request {r2:.2f}x"
        print(f"  observe mode throughput / first execution    {r:6.2f}x  [>= 0.9x]{extra}")
    if "half_direct" in med and "half_proxy" in med:
        added = med["half_proxy"]["p99"] - med["half_direct"]["p99"]
        fig["half_load_p99_added_ms"] = added
        print(f"  p99 added at half of peak load (paced, -c{meta['half_connections']}): direct "
              f"{med['half_direct']['p99']:.2f} ms, onceproxy {med['half_proxy']['p99']:.2f} ms, "
              f"added {added:.2f} ms  [<= 0.5 ms]")
        if meta.get("half_peak"):
            share = med["half_proxy"]["rps"] / meta["half_peak"]
            fig["half_load_share_of_peak"] = share
            print(f"    offered: onceproxy answered {med['half_proxy']['rps']:,.0f} req/s, "
                  f"{share:.0%} of its closed-loop peak of {meta['half_peak']:,} req/s")
        if "half_nginx" in med:
            ref = med["half_nginx"]["p99"] - med["half_direct"]["p99"]
            fig["half_load_p99_added_ms_nginx"] = ref
            print(f"    nginx at the same pacing: {med['half_nginx']['p99']:.2f} ms, "
                  f"added {ref:.2f} ms (the cost of any extra hop on this machine)")
        if "half_floor" in med:
            ref = med["half_floor"]["p99"] - med["half_direct"]["p99"]
            fig["half_load_p99_added_ms_floor"] = ref
            print(f"    the byte relay (the floor) at the same pacing: {med['half_floor']['p99']:.2f} "
                  f"ms, added {ref:.2f} ms (a hop that does nothing but move the bytes)")
    grpc_figures(d, meta, med, fig)
    budget(meta, med, fig)
    cluster_figures(d, meta, med, runs, summary)
    postgres_figures(d, meta, med, runs, summary)
    proxy_round_trips(d, summary)
    proxy_round_trips(d, summary, label=", guarded gRPC route", route="grpc_guarded")
    for n in meta.get("cluster_masters", []):
        proxy_round_trips(d, summary, f"metrics-cluster{n}",
                          f", Cluster of {n} master{'s' if n != 1 else ''}")
    commandstats(d, meta, summary)
    bulk(d, meta, summary, problems)
    for p in problems:
        print(f"  unparsable or failed result: {p}")
    (d / "summary.json").write_text(json.dumps(no_nan(summary), indent=2) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
