#!/usr/bin/env python3
"""Soak test: mixed traffic with faults through two onceproxy processes sharing one Redis.

Usage: tests/soak/soak.py [--build build/release] [--seconds N]   (Python 3 standard library only)
       tests/soak/soak.py --failover async|replicated|postgres ...   (tests/soak/README.md)
Environment: SOAK_SECONDS (default 600), SOAK_FAULT_INTERVAL (seconds between scheduled faults,
default 15), SOAK_CLIENTS (client threads, default 6), SOAK_KEEP=1 keeps the work directory.

It starts a test upstream, a redis-server (append-only file, fsync on every write, so a restart
loses nothing it acknowledged) and two onceproxy processes (A and B, one worker each, lease 2 s,
upstream timeout 1 s), all on 127.0.0.1, then for SOAK_SECONDS drives:

  plain      GET and POST on an unguarded route
  first      a guarded POST with a new key (routes /pay/hold: on_upstream_uncertain hold,
             /pay/strict: on_upstream_uncertain fail), then the client's retry on the other proxy
  conflict   the same new key sent concurrently to A and B
  mismatch   a used key sent again with another body (422 expected, never an execution)
  download   GET of 8 MiB (X-Test-Body-Bytes), content checked byte for byte
  upload     POST of 3 MiB, the upstream's byte count and FNV-1a checked

and injects faults: on a schedule, SIGKILL of proxy A or B (restarted at once) and Redis restarts
(SIGTERM or SIGKILL, alternately; back on the same port after ~0.5 s); per request, at random,
upstream resets after the request was sent (X-Test-Drop, X-Test-Drop-After-Ms), stalls beyond the
upstream timeout (X-Test-Delay-Ms), malformed answers (X-Test-Malformed) and released 500s.

After the load it stops the faults, waits for the leases to lapse, and retries every guarded key
until it gets a final answer (as a client would), then asserts (exit 1 on any violation):

1. At most once (SPEC §8, §2). For each key, the upstream's execution count (GET /__counts) is at
   most 1 + U, where U is the number of attempts for that key, made before its first `stored`
   answer, whose outcome the contract leaves unknown and after which one more execution is legal:
     - the proxy serving it was SIGKILLed during the attempt (the lease lapses, one retry runs);
     - on a `hold` route: 502/504 upstream.* (reset/stall/bad answer after sending: held, then one
       retry may run);
     - a 5xx from the upstream itself (released by the `release` list: a retry runs again);
     - `Idempotency-Status: unrecorded` (the record may never land: `record_failed`).
   On the `fail` route an upstream reset or stall is NOT an exemption: it must be recorded as
   502 upstream.outcome_unknown and never run again. A connection error from a proxy that was not
   killed is not an exemption either (the proxy must still record or release, SPEC §1.7).
   Keys that only ever got conclusive answers (stored, replayed, 409, 422, 503 store_unavailable,
   502 upstream.unavailable before sending) must have executed at most once. A mismatch never
   executes.
2. No record lost. Every key whose first answer was `stored` replays afterwards, from both A and
   B, with the same status and the same `execution_id`; no key is ever answered `stored` twice.
3. RSS flat. VmRSS of each proxy is sampled every 0.5 s from /proc/PID/status; a restarted proxy
   starts a new series. For each series with at least RSS_MIN_SAMPLES samples after a warm-up of
   RSS_WARMUP seconds, the mean of its last quarter must not exceed the mean of its first quarter
   by more than RSS_MARGIN (10 %) + RSS_SLACK_KIB (4 MiB): allocator noise, pool and buffer
   growth to the steady state, not a leak (a leak grows with the number of requests).
4. Nothing crashed: every process that was not killed on purpose is alive at the end, and every
   plain, download and upload answer that did not cross a fault was correct.
"""

import argparse
import hashlib
import http.client
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEASE_S = 2.0
UPSTREAM_TIMEOUT_S = 1.0
CLIENT_TIMEOUT_S = 15.0
DOWNLOAD_BYTES = 8 << 20
UPLOAD_BYTES = 3 << 20
RSS_WARMUP = 5.0
RSS_MIN_SAMPLES = 20
RSS_MARGIN = 0.10
RSS_SLACK_KIB = 4096

CONFIG = """\
# onceproxy configuration of tests/soak/soak.py (written per run).
listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
workers: 1
access_log: false
upstreams:
  app:
    url: http://127.0.0.1:{upstream_port}
    connect_timeout: 500ms
    timeout: 1s
store:
  type: redis
  redis:
    url: "redis://127.0.0.1:{redis_port}/0"
    connect_timeout: 500ms
    command_timeout: 250ms
defaults:
  ttl: 1h
  lease: 2s
routes:
  - name: hold
    match: {{ methods: [POST], prefix: /pay/hold }}
    upstream: app
    idempotency: {{ mode: required, on_upstream_uncertain: hold }}
  - name: strict
    match: {{ methods: [POST], prefix: /pay/strict }}
    upstream: app
    idempotency: {{ mode: required, on_upstream_uncertain: fail }}
  - name: bulk
    match: {{ prefix: /bulk/ }}
    upstream: app
    limits: {{ max_request_bytes: none, max_response_bytes: none }}
  - name: plain
    match: {{ prefix: / }}
    upstream: app
"""


def log(msg):
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready within {timeout} s")


def tcp_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Answer:
    """One HTTP exchange as the client saw it."""

    __slots__ = ("status", "headers", "body", "error", "t0", "t1", "proxy")

    def __init__(self):
        self.status = None
        self.headers = {}
        self.body = b""
        self.error = None
        self.t0 = self.t1 = 0.0
        self.proxy = None

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def code(self):
        j = self.json()
        return j.get("code") if isinstance(j, dict) else None

    def execution_id(self):
        j = self.json()
        return j.get("execution_id") if isinstance(j, dict) else None


def fetch(port, method, path, headers=None, body=None, timeout=CLIENT_TIMEOUT_S, read_limit=None):
    a = Answer()
    a.t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        a.status = r.status
        a.headers = {k.lower(): v for k, v in r.getheaders()}
        a.body = r.read() if read_limit is None else r.read(read_limit)
    except (OSError, http.client.HTTPException) as e:
        a.status = None
        a.error = type(e).__name__
    finally:
        conn.close()
        a.t1 = time.monotonic()
    return a


# ---------------------------------------------------------------------------------------------
# Processes


class Processes:
    def __init__(self, build, work):
        self.work = work
        self.proxy_bin = os.path.join(build, "src", "onceproxy")
        self.upstream_bin = os.path.join(build, "tools", "test_upstream", "onceproxy_test_upstream")
        for b in (self.proxy_bin, self.upstream_bin):
            if not os.access(b, os.X_OK):
                raise SystemExit(f"[soak] no {b}: build it (make build)")
        if not shutil.which("redis-server"):
            raise SystemExit("[soak] redis-server is not installed (scripts/install-deps.sh)")
        self.lock = threading.Lock()
        self.upstream = None
        self.upstream_port = None
        self.redis = None
        self.redis_port = free_port()
        self.proxies = {}  # name -> Popen
        self.ports = {}  # name -> (port, admin)
        self.kill_windows = defaultdict(list)  # name -> [(t_begin, t_end)]
        self.expected_exit = set()  # Popen objects stopped on purpose
        self.logs = []
        self.spawned = []  # every process started, so that stop_all() leaves none behind

    def _spawn(self, argv, logname):
        f = open(os.path.join(self.work, logname), "ab")
        self.logs.append(f)
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with self.lock:
            self.spawned.append(p)
        return p

    def start_upstream(self):
        pf = os.path.join(self.work, "upstream.port")
        self.upstream = self._spawn([self.upstream_bin, "--listen", "127.0.0.1:0", "--threads", "2",
                                     "--port-file", pf], "upstream.log")
        wait_until(lambda: os.path.exists(pf) and os.path.getsize(pf) > 0, 10, "test upstream")
        self.upstream_port = int(open(pf).read().split()[0])
        wait_until(lambda: tcp_open(self.upstream_port), 10, "test upstream")

    def start_redis(self):
        p = self._spawn(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", self.work,
             "--logfile", os.path.join(self.work, "redis.log")], "redis.stdout")
        with self.lock:
            self.redis = p
        wait_until(lambda: tcp_open(self.redis_port), 10, "redis-server")

    def restart_redis(self, sig):
        with self.lock:
            old = self.redis
            self.expected_exit.add(old)
            old.send_signal(sig)
        try:
            old.wait(timeout=10)
        except subprocess.TimeoutExpired:
            old.kill()
            old.wait(timeout=5)
        time.sleep(0.5)
        self.start_redis()

    def write_config(self):
        path = os.path.join(self.work, "onceproxy.yaml")
        with open(path, "w") as f:
            f.write(CONFIG.format(upstream_port=self.upstream_port, redis_port=self.redis_port))
        return path

    def start_proxy(self, name):
        pf = os.path.join(self.work, f"proxy-{name}.port")
        if os.path.exists(pf):
            os.unlink(pf)
        p = self._spawn([self.proxy_bin, "--config", os.path.join(self.work, "onceproxy.yaml"),
                         "--port-file", pf], f"proxy-{name}.log")
        wait_until(lambda: (os.path.exists(pf) and os.path.getsize(pf) > 0) or p.poll() is not None,
                   10, f"onceproxy {name}")
        if p.poll() is not None:
            raise RuntimeError(f"onceproxy {name} exited at start-up (see {self.work})")
        port, admin = (int(x) for x in open(pf).read().split()[:2])
        wait_until(lambda: tcp_open(port), 10, f"onceproxy {name}")
        with self.lock:
            self.proxies[name] = p
            self.ports[name] = (port, admin)
        return p

    def wait_store_ready(self, name, timeout=10):
        admin = self.ports[name][1]
        wait_until(lambda: b"store: answering" in fetch(admin, "GET", "/readyz", timeout=1).body,
                   timeout, f"onceproxy {name} store")

    def kill_proxy(self, name):
        # The window is open (ends at +inf) until the new process listens, so an attempt that
        # fails while the restart is under way is already known to have crossed the kill.
        with self.lock:
            window = [time.monotonic(), float("inf")]
            self.kill_windows[name].append(window)
            p = self.proxies[name]
            self.expected_exit.add(p)
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        self.start_proxy(name)
        with self.lock:
            window[1] = time.monotonic()

    def port(self, name):
        with self.lock:
            return self.ports[name][0]

    def pid(self, name):
        with self.lock:
            return self.proxies[name].pid

    def killed_during(self, name, t0, t1):
        with self.lock:
            return any(b <= t1 and e >= t0 for b, e in self.kill_windows[name])

    def unexpected_deaths(self):
        out = []
        with self.lock:
            procs = [("upstream", self.upstream), ("redis", self.redis)] + list(self.proxies.items())
            for what, p in procs:
                if p.poll() is not None and p not in self.expected_exit:
                    out.append(f"{what} (pid {p.pid}) exited with {p.returncode}")
        return out

    def stop_all(self):
        # Everything _spawn started (the Sentinel set's nodes and sentinels too), not only the
        # processes this class names.
        with self.lock:
            procs = [self.upstream, self.redis] + list(self.proxies.values())
            procs += [p for p in self.spawned if p not in procs]
        for p in procs:
            if p is not None and p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in procs:
            if p is None:
                continue
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for f in self.logs:
            f.close()


# ---------------------------------------------------------------------------------------------
# Bookkeeping


class Ledger:
    """Every guarded attempt per key, the outcomes, the faults, the violations."""

    def __init__(self):
        self.lock = threading.Lock()
        self.keys = {}  # key -> dict(path, body, route)
        self.attempts = defaultdict(list)  # key -> [(t0, t1, proxy, label, answer-summary)]
        self.outcomes = Counter()
        self.faults = Counter()
        self.violations = []
        self.anomalies = Counter()

    def new_key(self, key, route, path, body):
        with self.lock:
            self.keys[key] = {"route": route, "path": path, "body": body}

    def add(self, key, a, label, mismatch=False):
        with self.lock:
            self.outcomes[label] += 1
            if key is not None:
                self.attempts[key].append({"t0": a.t0, "t1": a.t1, "proxy": a.proxy, "label": label,
                                           "status": a.status, "eid": a.execution_id()
                                           if a.status else None, "mismatch": mismatch,
                                           "body": hashlib.sha256(a.body).hexdigest()})

    def count(self, label):
        with self.lock:
            self.outcomes[label] += 1

    def fault(self, what):
        with self.lock:
            self.faults[what] += 1

    def violation(self, msg):
        with self.lock:
            self.violations.append(msg)
        log("VIOLATION: " + msg)


def classify(a, procs, route):
    """Label of a guarded answer, and whether it leaves the outcome unknown (an exemption)."""
    if a.status is None:
        if procs.killed_during(a.proxy, a.t0, a.t1):
            return "proxy_killed", True
        if a.error == "ConnectionRefusedError":
            return "refused", False
        return "transport_error:" + str(a.error), False
    st = a.header("idempotency-status")
    code = a.code()
    if st == "unrecorded":
        return "unrecorded", True
    if st in ("stored", "replayed"):
        return st, False
    if a.status == 409 and code == "idempotency.in_progress":
        return "in_progress", False
    if a.status == 422 and code == "idempotency.payload_mismatch":
        return "mismatch", False
    if a.status == 503 and code == "idempotency.store_unavailable":
        return "store_unavailable", False
    if a.status == 502 and code == "upstream.outcome_unknown":
        return "outcome_unknown", False
    if a.status in (502, 504) and code and code.startswith("upstream."):
        # Before sending (connect failure) nothing ran; after sending the outcome is unknown.
        # On a `hold` route the key is held and one retry may run after the lease.
        return code, route == "hold"
    if a.status >= 500 and (a.header("x-execution-id") or a.execution_id()):
        return f"released_{a.status}", True
    return f"other_{a.status}:{code}", False


# ---------------------------------------------------------------------------------------------
# Load


class Load:
    def __init__(self, procs, ledger, seed):
        self.procs = procs
        self.ledger = ledger
        self.stop = threading.Event()
        self.seq = 0
        self.seq_lock = threading.Lock()
        self.rng_seed = seed
        self.plain = Counter()

    def next_key(self, route):
        with self.seq_lock:
            self.seq += 1
            n = self.seq
        return f"soak-{self.rng_seed}-{route}-{n}"

    def guarded(self, key, proxy, extra=None, body=None):
        info = self.ledger.keys[key]
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        if extra:
            headers.update(extra)
        a = fetch(self.procs.port(proxy), "POST", info["path"], headers,
                 (body or info["body"]).encode())
        a.proxy = proxy
        return a

    def record(self, key, a, mismatch=False):
        route = self.ledger.keys[key]["route"]
        label, _ = classify(a, self.procs, route)
        if mismatch:
            label = "mismatch_attempt:" + label
            if a.status is not None and label.endswith(("stored", "replayed")):
                self.ledger.violation(f"key {key}: a different body was answered {label}")
        self.ledger.add(key, a, label, mismatch)
        if label.startswith("transport_error") or label.startswith("other_"):
            self.ledger.count("anomaly " + label)
        return label

    def fault_headers(self, rng):
        x = rng.random()
        if x < 0.03:
            self.ledger.fault("upstream reset after send (X-Test-Drop)")
            return {"X-Test-Drop": "1"}
        if x < 0.05:
            self.ledger.fault("upstream reset after 200 ms (X-Test-Drop-After-Ms)")
            return {"X-Test-Drop-After-Ms": "200"}
        if x < 0.07:
            self.ledger.fault("upstream stall beyond timeout (X-Test-Delay-Ms 1500)")
            return {"X-Test-Delay-Ms": "1500"}
        if x < 0.08:
            self.ledger.fault("upstream malformed answer (X-Test-Malformed)")
            return {"X-Test-Malformed": "1"}
        if x < 0.10:
            self.ledger.fault("upstream 500 (released)")
            return {"X-Test-Status": "500"}
        return None

    def scenario_first(self, rng):
        route = rng.choice(["hold", "strict"])
        key = self.next_key(route)
        body = json.dumps({"amount": rng.randint(1, 10000), "currency": "EUR", "k": key})
        self.ledger.new_key(key, route, f"/pay/{route}/{rng.randint(1, 50)}", body)
        a, b = rng.sample(["A", "B"], 2)
        l1 = self.record(key, self.guarded(key, a, self.fault_headers(rng)))
        # The client's retry, on the other proxy, without any fault header.
        l2 = self.record(key, self.guarded(key, b))
        # Another body under a key that is recorded: 422, never an execution.
        if rng.random() < 0.3 and {l1, l2} & {"stored", "replayed"}:
            mb = json.dumps({"amount": -1, "currency": "USD", "k": key})
            self.record(key, self.guarded(key, rng.choice("AB"), body=mb), mismatch=True)

    def scenario_conflict(self, rng):
        route = rng.choice(["hold", "strict"])
        key = self.next_key(route)
        body = json.dumps({"amount": rng.randint(1, 10000), "currency": "EUR", "k": key})
        self.ledger.new_key(key, route, f"/pay/{route}/c", body)
        extra = {"X-Test-Delay-Ms": "100"}  # widen the window so the duplicates overlap
        answers = [None] * 4
        def go(i):
            answers[i] = self.guarded(key, "AB"[i % 2], extra)
        ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(CLIENT_TIMEOUT_S + 5)
        labels = [self.record(key, x) for x in answers if x is not None]
        if labels.count("stored") > 1:
            self.ledger.violation(f"key {key}: {labels.count('stored')} concurrent duplicates stored")

    def scenario_plain(self, rng):
        p = rng.choice("AB")
        port = self.procs.port(p)
        x = rng.random()
        if x < 0.05:
            self.ledger.fault("upstream reset on a plain request")
            a = fetch(port, "GET", "/plain/reset", {"X-Test-Drop": "1"})
            a.proxy = p
            ok = a.status is None or a.status >= 500
            kind = "plain_reset"
        elif x < 0.5:
            a = fetch(port, "GET", f"/plain/{rng.randint(1, 1000)}")
            a.proxy = p
            ok = a.status == 200 and a.execution_id() is not None
            kind = "plain_get"
        else:
            body = os.urandom(rng.randint(0, 4096))
            a = fetch(port, "POST", "/plain/post", {"Content-Type": "application/octet-stream"}, body)
            a.proxy = p
            j = a.json() if a.status == 200 else None
            ok = isinstance(j, dict) and j.get("body_bytes") == len(body)
            kind = "plain_post"
        self.plain_result(kind, a, ok)

    def scenario_download(self, rng):
        p = rng.choice("AB")
        a = fetch(self.procs.port(p), "GET", "/bulk/download",
                 {"X-Test-Body-Bytes": str(DOWNLOAD_BYTES)})
        a.proxy = p
        ok = a.status == 200 and len(a.body) == DOWNLOAD_BYTES and a.body == expected_pattern()
        self.plain_result("download", a, ok)
        a.body = b""

    def scenario_upload(self, rng):
        p = rng.choice("AB")
        body = upload_body()
        a = fetch(self.procs.port(p), "POST", "/bulk/upload",
                 {"Content-Type": "application/octet-stream"}, body)
        a.proxy = p
        j = a.json() if a.status == 200 else None
        ok = (isinstance(j, dict) and j.get("body_bytes") == len(body)
              and j.get("body_fnv1a") == UPLOAD_FNV)
        self.plain_result("upload", a, ok)

    def plain_result(self, kind, a, ok):
        if ok:
            self.ledger.count(f"{kind}:ok")
            return
        if a.status is None and (self.procs.killed_during(a.proxy, a.t0, a.t1)
                                 or a.error == "ConnectionRefusedError"):
            self.ledger.count(f"{kind}:proxy_down")
            return
        label = f"{kind}:bad({a.status or a.error})"
        self.ledger.count(label)
        self.ledger.violation(f"{kind} through proxy {a.proxy}: status {a.status} error {a.error} "
                              f"body {a.body[:200]!r}")

    def client(self, idx):
        rng = random.Random(self.rng_seed * 1000 + idx)
        scenarios = ([self.scenario_first] * 8 + [self.scenario_plain] * 6 +
                     [self.scenario_conflict] * 2 + [self.scenario_download, self.scenario_upload])
        while not self.stop.is_set():
            rng.choice(scenarios)(rng)


_PATTERN = None
_UPLOAD = None
UPLOAD_FNV = None


def expected_pattern():
    global _PATTERN
    if _PATTERN is None:
        unit = bytes(ord("a") + i for i in range(26))
        _PATTERN = (unit * (DOWNLOAD_BYTES // 26 + 1))[:DOWNLOAD_BYTES]
    return _PATTERN


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def upload_body():
    return _UPLOAD


def prepare_upload():
    global _UPLOAD, UPLOAD_FNV
    rng = random.Random(7)
    _UPLOAD = rng.randbytes(UPLOAD_BYTES)
    UPLOAD_FNV = fnv1a(_UPLOAD)


# ---------------------------------------------------------------------------------------------
# Faults and RSS


def fault_loop(procs, ledger, stop, interval):
    cycle = ["kill A", "redis", "kill B", "redis"]
    i = 0
    redis_sigs = [signal.SIGTERM, signal.SIGKILL]
    n_redis = 0
    while not stop.wait(interval):
        what = cycle[i % len(cycle)]
        i += 1
        try:
            if what.startswith("kill"):
                name = what[-1]
                log(f"fault: SIGKILL proxy {name}")
                procs.kill_proxy(name)
                ledger.fault(f"proxy {name} SIGKILL + restart")
            else:
                sig = redis_sigs[n_redis % 2]
                n_redis += 1
                log(f"fault: redis restart ({signal.Signals(sig).name})")
                procs.restart_redis(sig)
                ledger.fault(f"redis restart ({signal.Signals(sig).name})")
        except Exception as e:  # noqa: BLE001 - a failed restart is itself a finding
            ledger.violation(f"fault '{what}' failed: {e}")
            return


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_loop(procs, stop, series):
    """series: name -> list of (pid, start_time, [(t, kib)])."""
    while not stop.wait(0.5):
        now = time.monotonic()
        for name in ("A", "B"):
            pid = procs.pid(name)
            kib = rss_kib(pid)
            if kib is None:
                continue
            runs = series[name]
            if not runs or runs[-1][0] != pid:
                runs.append((pid, now, []))
            runs[-1][2].append((now, kib))


def judge_rss(series, ledger):
    lines = []
    for name in ("A", "B"):
        for pid, start, samples in series[name]:
            warm = [k for t, k in samples if t - start >= RSS_WARMUP]
            if len(warm) < RSS_MIN_SAMPLES:
                lines.append(f"  proxy {name} pid {pid}: {len(samples)} samples, "
                             f"too short to judge (< {RSS_MIN_SAMPLES} after warm-up)")
                continue
            q = max(1, len(warm) // 4)
            first = sum(warm[:q]) / q
            last = sum(warm[-q:]) / q
            limit = first * (1 + RSS_MARGIN) + RSS_SLACK_KIB
            verdict = "flat" if last <= limit else "GROWING"
            lines.append(f"  proxy {name} pid {pid}: {len(warm)} samples after warm-up, "
                         f"first quarter {first / 1024:.1f} MiB, last quarter {last / 1024:.1f} MiB"
                         f", max {max(warm) / 1024:.1f} MiB, limit {limit / 1024:.1f} MiB: {verdict}")
            if last > limit:
                ledger.violation(f"RSS of proxy {name} (pid {pid}) grew from {first:.0f} KiB to "
                                 f"{last:.0f} KiB (limit {limit:.0f} KiB)")
    return lines


# ---------------------------------------------------------------------------------------------
# Verification


def final_answer(load, key, proxy, deadline):
    """Retries `key` on `proxy` until a final answer (not 409/503/refused), bounded in time."""
    while True:
        a = load.guarded(key, proxy)
        label = load.record(key, a)
        if label not in ("in_progress", "store_unavailable", "refused") or time.monotonic() > deadline:
            return a, label
        ra = a.header("retry-after")
        time.sleep(min(float(ra) if ra and ra.isdigit() else 0.3, 1.0))


def verify(load, procs, ledger):
    log("verification: leases lapse, every key is retried until it has a final answer")
    time.sleep(LEASE_S + 0.5)
    procs.wait_store_ready("A")
    procs.wait_store_ready("B")
    keys = list(ledger.keys)
    deadline = time.monotonic() + 60 + len(keys) * 0.05
    unsettled = Counter()

    def settle(key):
        a, label = final_answer(load, key, random.choice("AB"), deadline)
        if label in ("in_progress", "store_unavailable", "refused"):
            with ledger.lock:
                unsettled["n"] += 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(settle, keys))
    unsettled = unsettled["n"]
    # Every key whose first answer was `stored` replays, from both proxies, with the same answer.
    replay_checked = Counter()

    def check_replays(key):
        with ledger.lock:
            atts = list(ledger.attempts[key])
        stored = [x for x in atts if x["label"] == "stored" and not x["mismatch"]]
        if len(stored) > 1:
            ledger.violation(f"key {key}: answered `stored` {len(stored)} times "
                             f"(execution ids {[x['eid'] for x in stored]})")
        if not stored:
            return
        first = stored[0]
        for proxy in ("A", "B"):
            a, label = final_answer(load, key, proxy, time.monotonic() + 10)
            with ledger.lock:
                replay_checked["n"] += 1
            if label != "replayed" or a.status != first["status"] or a.execution_id() != first["eid"]:
                ledger.violation(
                    f"key {key}: stored {first['status']} execution {first['eid']} at "
                    f"{first['t0'] - T0:.1f}s via {first['proxy']}, but proxy {proxy} now answers "
                    f"{label} {a.status} execution {a.execution_id()}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check_replays, keys))
    replay_checked = replay_checked["n"]
    counts = json.loads(fetch(procs.upstream_port, "GET", "/__counts").body)["keys"]
    executions = Counter()
    exempted_keys = 0
    exempt_reasons = Counter()
    for key in keys:
        n = counts.get(key, 0)
        executions[min(n, 3)] += 1
        with ledger.lock:
            atts = sorted(ledger.attempts[key], key=lambda x: x["t0"])
        route = ledger.keys[key]["route"]
        t_stored = next((x["t1"] for x in atts if x["label"] == "stored"), None)
        unknown = [x for x in atts
                   if (t_stored is None or x["t0"] < t_stored)
                   and _exempt(x["label"], route)]
        allowed = 1 + len(unknown)
        if unknown and n > 1:
            exempted_keys += 1
            exempt_reasons[f"{route}: " + "+".join(sorted({x['label'] for x in unknown}))] += 1
        if n > allowed:
            hist = "; ".join(f"{x['t0'] - T0:.2f}-{x['t1'] - T0:.2f}s {x['proxy']} {x['label']}"
                             f"{' (other body)' if x['mismatch'] else ''} eid={x['eid']}"
                             for x in atts)
            ledger.violation(f"key {key} (route {route}) executed {n} times, at most {allowed} "
                             f"allowed; attempts: {hist}")
    return {"keys": len(keys), "replays_checked": replay_checked, "unsettled": unsettled,
            "executions": executions, "exempted_keys": exempted_keys,
            "exempt_reasons": exempt_reasons,
            "total_executions": json.loads(fetch(procs.upstream_port, "GET", "/__counts").body)["total"]}


def _exempt(label, route):
    if label in ("proxy_killed", "unrecorded") or label.startswith("released_"):
        return True
    return route == "hold" and label.startswith("upstream.") and label != "upstream.outcome_unknown"


T0 = time.monotonic()


# ---------------------------------------------------------------------------------------------
# Failover mode (--failover async|replicated|postgres): the store's primary killed under load;
# the Redis flavour: Sentinel

FAILOVER_CONFIG = """\
# onceproxy configuration of tests/soak/soak.py --failover (written per run).
listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
workers: 1
access_log: false
upstreams:
  app:
    url: http://127.0.0.1:{upstream_port}
    connect_timeout: 500ms
    timeout: 2s
{store}defaults:
  ttl: 1h
  lease: 2s
routes:
  - name: pay
    match: {{ methods: [POST], prefix: /pay }}
    upstream: app
    idempotency: {{ mode: required, on_store_error: fail_closed }}
"""

SENTINEL_FAILOVER_STORE = """\
store:
  type: redis
  redis:
    connect_timeout: 500ms
    command_timeout: 250ms
    durability: {durability}
    replicas: 2
    wait_timeout: 100ms
    sentinel:
      master: {master}
      nodes: [{nodes}]
"""


def resp(port, *args, timeout=1.0):
    """One Redis command over a fresh connection (RESP2); the decoded reply, or None."""
    out = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in (str(x).encode() for x in args))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(out)
            f = s.makefile("rb")

            def read():
                line = f.readline().rstrip(b"\r\n")
                t, rest = line[:1], line[1:]
                if t in (b"+", b"-"):
                    return rest.decode()
                if t == b":":
                    return int(rest)
                if t == b"$":
                    n = int(rest)
                    return None if n < 0 else f.read(n + 2)[:-2].decode()
                if t == b"*":
                    n = int(rest)
                    return None if n < 0 else [read() for _ in range(n)]
                return None
            return read()
    except (OSError, ValueError):
        return None


class SentinelSet:
    """A master, two replicas and three sentinels (quorum 2, down after 1 s) on loopback."""

    NAME = "onceproxy-soak"

    def __init__(self, procs):
        self.procs = procs
        self.nodes = {}  # port -> Popen
        self.sentinels = [free_port() for _ in range(3)]
        self.kills = 0
        self.failover_seconds = []

    def start_node(self, port, master=None):
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", self.procs.work,
                "--logfile", os.path.join(self.procs.work, f"redis-{port}.log")]
        if master:
            argv += ["--replicaof", "127.0.0.1", str(master)]
        self.nodes[port] = self.procs._spawn(argv, f"redis-{port}.stdout")
        wait_until(lambda: tcp_open(port), 10, f"redis-server {port}")

    def start(self):
        ports = [free_port() for _ in range(3)]
        self.start_node(ports[0])
        for p in ports[1:]:
            self.start_node(p, ports[0])
        for sp in self.sentinels:
            conf = os.path.join(self.procs.work, f"sentinel-{sp}.conf")
            with open(conf, "w") as f:
                f.write(f"port {sp}\nbind 127.0.0.1\nprotected-mode no\ndir {self.procs.work}\n"
                        f"sentinel monitor {self.NAME} 127.0.0.1 {ports[0]} 2\n"
                        f"sentinel down-after-milliseconds {self.NAME} 1000\n"
                        f"sentinel failover-timeout {self.NAME} 4000\n"
                        f"sentinel parallel-syncs {self.NAME} 2\n")
            self.procs._spawn(["redis-server", conf, "--sentinel"], f"sentinel-{sp}.log")
        wait_until(lambda: self.settled(ports[0]), 30, "sentinel set")

    def settled(self, master):
        for sp in self.sentinels:
            info = resp(sp, "SENTINEL", "MASTER", self.NAME)
            if not isinstance(info, list):
                return False
            d = dict(zip(info[::2], info[1::2]))
            if (d.get("port") != str(master) or d.get("flags") != "master"
                    or d.get("num-other-sentinels") != "2"):
                return False
        info = resp(master, "INFO", "replication") or ""
        return info.count("state=online") == 2

    def master(self):
        for sp in self.sentinels:
            r = resp(sp, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.NAME)
            if isinstance(r, list) and len(r) == 2:
                return int(r[1])
        return None

    def kill_master(self):
        old = self.master()
        p = self.nodes.pop(old)
        self.procs.expected_exit.add(p)
        t0 = time.monotonic()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        self.kills += 1

        def moved():
            m = self.master()
            return m not in (None, old) and isinstance(resp(m, "ROLE"), list) \
                and resp(m, "ROLE")[0] == "master"
        wait_until(moved, 30, "failover")
        self.failover_seconds.append(time.monotonic() - t0)
        new = self.master()
        self.start_node(old, new)
        # Settled on whichever node the sentinels name by then (a slow node may be failed over
        # again meanwhile).
        wait_until(lambda: self.settled(self.master()), 60, "sentinel set after failover")
        return old, new

    def config(self, upstream_port, durability):
        store = SENTINEL_FAILOVER_STORE.format(
            durability=durability, master=self.NAME,
            nodes=", ".join(f'"127.0.0.1:{p}"' for p in self.sentinels))
        return FAILOVER_CONFIG.format(upstream_port=upstream_port, store=store)

    def fail_over(self):
        old, new = self.kill_master()
        return f"master {old} killed; the sentinels promoted {new} in " \
               f"{self.failover_seconds[-1]:.1f} s"

    def describe(self):
        return f"master kills: {self.kills}; failover (kill to new master named and ROLE " \
               f"master): " + ", ".join(f"{s:.1f} s" for s in self.failover_seconds)

    def stop_all(self):
        pass  # the processes were started by procs._spawn: procs.stop_all() stops them


# ---------------------------------------------------------------------------------------------
# Failover mode --failover postgres: a primary with a synchronous standby, the primary killed

PG_BIN = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
PG_SUPERUSER_PASSWORD = "soak-superuser"
PG_ROLE = "onceproxy"
PG_PASSWORD = "soak-onceproxy"
PG_DATABASE = "onceproxy"
# Durable: every acknowledged commit is flushed on the primary and on the synchronous standby.
# A standby whose primary is gone retries the WAL stream every wal_retrieve_retry_interval and
# may notice a promotion only then (5 s by default).
PG_SETTINGS = ["fsync=on", "synchronous_commit=on", "full_page_writes=on", "wal_level=replica",
               "max_wal_senders=4", "hot_standby=on", "listen_addresses=127.0.0.1",
               "unix_socket_directories=", "wal_retrieve_retry_interval=200ms"]

PG_STREAM_CUT_S = 0.5  # the standby's stream frozen before each kill (PostgresPair.kill_primary)

PG_FAILOVER_STORE = """\
store:
  type: postgres
  postgres:
    url: "postgresql://{role}@{hosts}/{database}?target_session_attrs=read-write"
    password_file: {password_file}
    table: onceproxy_records
    pool: 2
    connect_timeout: 2s
    statement_timeout: 2s
    migrate: auto
"""


def pid_alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


def cmdline(pid):
    """/proc/PID/cmdline, where a PostgreSQL process shows its role (b"" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def pg_children(parent):
    """The ids of the processes whose parent is `parent` (the postmaster's backends)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so parse after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            out.append(int(name))
    return out


class PostgresPair:
    """A PostgreSQL primary and its synchronous standby (pg_basebackup -R) on loopback.

    Both run as the `postgres` user when we are root (PostgreSQL refuses root), through setpriv,
    which execs the server in place (so the Popen is the postmaster) and kills it if this script
    dies. A kill first freezes the WAL sender for a moment (the standby falls behind), then
    freezes and SIGKILLs the postmaster and all its backends (a machine lost); the
    standby is promoted with synchronous_standby_names = '' (with no standby left, every commit
    would wait forever: a failover manager such as Patroni does the same), and the killed node
    comes back on its port as the new primary's standby, rebuilt with pg_basebackup into a fresh
    directory; once it streams, synchronous_standby_names = '*' again, so the next kill also
    finds every acknowledged commit on the standby."""

    def __init__(self, procs):
        self.procs = procs
        self.ports = [free_port(), free_port()]
        self.nodes = {}  # port -> Popen of the postmaster
        self.primary = None
        self.generation = 0
        self.kills = 0
        self.failover_seconds = []  # kill to the standby promoted (read-write)
        self.reattach_seconds = []  # kill to a synchronous standby again
        self.as_postgres = []
        self.uid = self.gid = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise SystemExit("[soak] no `postgres` user: install postgresql-15 "
                                 "(scripts/install-deps.sh)")
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
            self.as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
                                "--pdeathsig=KILL", "--"]
            os.chmod(procs.work, 0o711)  # the server's user must reach its directories
        if not os.access(os.path.join(PG_BIN, "postgres"), os.X_OK):
            raise SystemExit(f"[soak] no {PG_BIN}/postgres: install postgresql-15 "
                             "(scripts/install-deps.sh)")

    def fresh_dir(self, port):
        self.generation += 1
        path = os.path.join(self.procs.work, f"pg-{port}-{self.generation}")
        os.mkdir(path, 0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)
        return path

    def note(self, what):
        """A timestamped line in pg-tools.log: the steps of a failover, to read their timing."""
        with open(os.path.join(self.procs.work, "pg-tools.log"), "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {what}\n")

    def run(self, what, argv):
        self.note(what)
        logf = os.path.join(self.procs.work, "pg-tools.log")
        with open(logf, "ab") as f:
            f.write(f"$ {' '.join(argv)}\n".encode())
            f.flush()
            r = subprocess.run(self.as_postgres + argv, stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{what} failed with status {r.returncode} (see {logf})")

    def psql(self, port, *sql, db="postgres", timeout=10):
        """Statements, each in its own transaction, as the superuser over one TCP connection;
        their output (unaligned), or None on failure."""
        try:
            r = subprocess.run([os.path.join(PG_BIN, "psql"), "-X", "-q", "-A", "-t",
                                "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port),
                                "-U", "postgres", "-d", db] + [a for q in sql for a in ("-c", q)],
                               capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, PGPASSWORD=PG_SUPERUSER_PASSWORD,
                                        PGCONNECT_TIMEOUT="2"))
        except subprocess.TimeoutExpired:
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    def start_node(self, port, data):
        argv = [os.path.join(PG_BIN, "postgres"), "-D", data, "-p", str(port)]
        for s in PG_SETTINGS:
            argv += ["-c", s]
        p = self.procs._spawn(self.as_postgres + argv, f"pg-{port}.log")
        self.nodes[port] = p
        wait_until(lambda: p.poll() is not None or self.psql(port, "SELECT 1") == "1", 60,
                   f"postgres on {port}")
        if p.poll() is not None:
            raise RuntimeError(f"postgres on {port} exited at start-up (see {self.procs.work})")

    def attach_standby(self, port):
        """Makes the node on `port` a fresh copy of the primary, streaming and synchronous."""
        data = self.fresh_dir(port)
        self.run("pg_basebackup", [
            os.path.join(PG_BIN, "pg_basebackup"), "-D", data, "-R", "-X", "stream", "-c", "fast",
            "-d", f"host=127.0.0.1 port={self.primary} user=postgres "
                  f"password={PG_SUPERUSER_PASSWORD} application_name=pg{port}"])
        self.start_node(port, data)
        self.note(f"{port} started")
        wait_until(lambda: self.psql(self.primary, "SELECT count(*) FROM pg_stat_replication "
                                     "WHERE state = 'streaming'") == "1", 60,
                   f"standby {port} streaming")
        self.note(f"{port} streaming")
        self.set_sync_standbys("*")
        wait_until(lambda: self.psql(self.primary, "SELECT sync_state FROM pg_stat_replication")
                   == "sync", 30, f"standby {port} synchronous")
        self.note(f"{port} synchronous standby of {self.primary}")

    def set_sync_standbys(self, names):
        if self.psql(self.primary, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'",
                     "SELECT pg_reload_conf()") != "t":
            raise RuntimeError(f"cannot set synchronous_standby_names on {self.primary}")

    def start(self):
        first, second = self.ports
        data = self.fresh_dir(first)
        pwfile = os.path.join(self.procs.work, "pg-superuser.pw")
        with open(pwfile, "w") as f:
            f.write(PG_SUPERUSER_PASSWORD + "\n")
        os.chmod(pwfile, 0o644)
        self.run("initdb", [os.path.join(PG_BIN, "initdb"), "-D", data, "-U", "postgres",
                            "--pwfile", pwfile, "--auth-local=trust", "--auth-host=scram-sha-256",
                            "-E", "UTF8", "--locale=C", "--no-instructions"])
        self.start_node(first, data)
        self.primary = first
        for sql in (f"CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}'",
                    f"CREATE DATABASE {PG_DATABASE} OWNER {PG_ROLE}"):
            if self.psql(first, sql) is None:
                raise RuntimeError(f"{sql} failed on {first}")
        self.attach_standby(second)

    def url_hosts(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def config(self, upstream_port, durability):
        pwfile = os.path.join(self.procs.work, "pg-onceproxy.pw")
        with open(pwfile, "w") as f:
            f.write(PG_PASSWORD + "\n")
        store = PG_FAILOVER_STORE.format(role=PG_ROLE, hosts=self.url_hosts(),
                                         database=PG_DATABASE, password_file=pwfile)
        return FAILOVER_CONFIG.format(upstream_port=upstream_port, store=store)

    def kill_primary(self):
        """SIGKILL of the primary (postmaster and backends frozen first, then killed: nothing
        runs after the first process dies), promotion of the standby, the killed node rebuilt as
        its synchronous standby. Returns the old and the new primary's ports."""
        old = self.primary
        new = next(p for p in self.ports if p != old)
        p = self.nodes.pop(old)
        self.procs.expected_exit.add(p)
        # The standby falls behind first: the WAL sender is frozen PG_STREAM_CUT_S before the
        # kill. Only a commit that did not wait for the standby can be acknowledged meanwhile,
        # so a setup whose commits do not wait (asynchronous replication, synchronous_commit
        # local or off) loses records here and fails the run.
        senders = [pid for pid in pg_children(p.pid) if b"walsender" in cmdline(pid)]
        for pid in senders:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(PG_STREAM_CUT_S)
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGSTOP)
        backends = pg_children(p.pid)
        for pid in backends:
            os.kill(pid, signal.SIGSTOP)
        for pid in [p.pid] + backends:
            os.kill(pid, signal.SIGKILL)
        p.wait(timeout=10)
        wait_until(lambda: not any(map(pid_alive, backends)), 10, "backends gone")
        self.kills += 1
        self.note(f"{old} killed ({len(backends)} backends)")
        # What a failover manager does: no standby is left, so no commit may wait for one
        # (ALTER SYSTEM writes postgresql.auto.conf, also on a standby).
        if self.psql(new, "ALTER SYSTEM SET synchronous_standby_names = ''",
                     "SELECT pg_reload_conf()", "SELECT pg_promote(true, 60)",
                     timeout=70) != "t\nt":
            raise RuntimeError(f"promotion of {new} failed")
        self.note(f"{new} promoted")
        self.failover_seconds.append(time.monotonic() - t0)
        self.primary = new
        self.attach_standby(old)
        self.reattach_seconds.append(time.monotonic() - t0)
        return old, new

    def fail_over(self):
        old, new = self.kill_primary()
        return (f"primary {old} killed; standby {new} promoted in "
                f"{self.failover_seconds[-1]:.1f} s, {old} its synchronous standby again after "
                f"{self.reattach_seconds[-1]:.1f} s")

    def describe(self):
        return (f"primary kills: {self.kills}; failover (kill to standby promoted, read-write): "
                + ", ".join(f"{s:.1f} s" for s in self.failover_seconds)
                + "; kill to a synchronous standby again: "
                + ", ".join(f"{s:.1f} s" for s in self.reattach_seconds))

    def stop_all(self):
        for p in self.nodes.values():
            if p.poll() is None:
                # Immediate shutdown (the postmaster stops its backends and exits without a
                # checkpoint: the data is thrown away); procs.stop_all() waits for it.
                p.send_signal(signal.SIGQUIT)


def failover_main(args):
    work = tempfile.mkdtemp(prefix="onceproxy-failover.")
    keep = os.environ.get("SOAK_KEEP") == "1"
    procs = Processes(args.build, work)
    cluster = PostgresPair(procs) if args.failover == "postgres" else SentinelSet(procs)
    answers = {}  # key -> the first final answer's Idempotency-Status (or status)
    lock = threading.Lock()
    stop = threading.Event()
    tally = Counter()
    started = time.monotonic()

    def post(key):
        port = procs.port(random.choice("AB"))
        return fetch(port, "POST", "/pay", {"Idempotency-Key": key,
                                            "Content-Type": "application/json",
                                            "X-Test-Delay-Ms": "20"},
                     b'{"amount":1}', timeout=10)

    def until_final(key, deadline):
        while True:
            a = post(key)
            final = a.status is not None and a.status not in (409, 503)
            with lock:
                tally[f"{a.status or a.error} {a.header('idempotency-status') or ''}".strip()] += 1
            if final or time.monotonic() > deadline:
                return a if final else None
            time.sleep(0.1)

    def client(idx):
        n = 0
        while not stop.is_set():
            n += 1
            key = f"fo-{args.seed}-{idx}-{n}"
            a = until_final(key, time.monotonic() + 30)
            with lock:
                answers[key] = (a.header("idempotency-status") or str(a.status)) if a else "none"

    try:
        procs.start_upstream()
        cluster.start()
        with open(os.path.join(work, "onceproxy.yaml"), "w") as f:
            f.write(cluster.config(procs.upstream_port, args.failover))
        procs.start_proxy("A")
        procs.start_proxy("B")
        procs.wait_store_ready("A")
        procs.wait_store_ready("B")
        # The cost of the durability, before any fault: sequential first executions (the
        # upstream answers at once), one client, each a new key.
        lat = []
        for i in range(300):
            a = fetch(procs.port("A"), "POST", "/pay",
                      {"Idempotency-Key": f"fo-lat-{args.seed}-{i}",
                       "Content-Type": "application/json"}, b'{"amount":1}', timeout=10)
            if a.status == 200:
                lat.append((a.t1 - a.t0) * 1000)
        lat.sort()
        latency = (f"first execution, sequential, no faults: p50 {lat[len(lat) // 2]:.2f} ms, "
                   f"p99 {lat[int(len(lat) * 0.99)]:.2f} ms ({len(lat)} requests)"
                   if lat else "first execution latency: no answer")
        log(latency)
        log(f"failover mode ({args.failover}): {args.seconds:.0f} s, {args.clients} clients, "
            f"a primary kill every {args.fault_interval:.0f} s, work dir {work}")
        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        end = time.monotonic() + args.seconds
        next_kill = time.monotonic() + min(args.fault_interval, 3)
        while time.monotonic() < end:
            if time.monotonic() >= next_kill:
                log(cluster.fail_over())
                next_kill = time.monotonic() + args.fault_interval
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
        # Every key again, as a client that lost the answer retries: after the lease (a claim
        # whose completion never landed) each must replay, unless its record was lost.
        time.sleep(LEASE_S + 0.5)
        keys = list(answers)
        deadline = time.monotonic() + 60 + len(keys) * 0.01
        with ThreadPoolExecutor(8) as pool:
            unsettled = sum(1 for a in pool.map(lambda k: until_final(k, deadline), keys)
                            if a is None)
        counts = json.loads(fetch(procs.upstream_port, "GET", "/__counts").body)["keys"]
        dup_stored = sum(1 for k in keys if counts.get(k, 0) > 1 and answers[k] == "stored")
        dup_flagged = sum(1 for k in keys if counts.get(k, 0) > 1 and answers[k] != "stored")
        extra = sum(max(counts.get(k, 0) - 1, 0) for k in keys)
    except Exception:
        keep = True
        raise
    finally:
        cluster.stop_all()
        procs.stop_all()
        if keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    first = Counter(answers.values())
    store = "postgres, synchronous standby" if args.failover == "postgres" else \
        f"redis sentinel, durability: {args.failover}"
    print(f"\n=== onceproxy failover summary ({store}) ===")
    print(f"duration: load {args.seconds:.0f} s, total {time.monotonic() - started:.0f} s; "
          f"clients {args.clients}")
    print(latency)
    print(cluster.describe())
    print(f"keys: {len(keys)}; first final answer: "
          + ", ".join(f"{k} {v}" for k, v in sorted(first.items())))
    print("answers by status:")
    for k, v in sorted(tally.items()):
        print(f"  {k:40} {v}")
    print(f"duplicate executions: {extra} on {dup_stored + dup_flagged} keys; after a `stored` "
          f"answer (a record lost in the failover): {dup_stored}; after an answer that said the "
          f"record may be missing (unrecorded/error): {dup_flagged}")
    if unsettled:
        print(f"keys without a final answer in the retry pass (a lost record would not show): "
              f"{unsettled}")
    print(f"RESULT durability={args.failover} kills={cluster.kills} keys={len(keys)} "
          f"duplicates={extra} after_stored={dup_stored} after_flagged={dup_flagged}")
    if args.failover in ("replicated", "postgres") and (dup_stored or unsettled):
        print("FAILED: a record acknowledged as stored was lost in a failover" if dup_stored else
              "FAILED: keys left without a final answer after the failovers")
        return 1
    return 0


def main():
    global T0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build", "release"))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", "600")))
    ap.add_argument("--fault-interval", type=float,
                    default=float(os.environ.get("SOAK_FAULT_INTERVAL", "15")))
    ap.add_argument("--clients", type=int, default=int(os.environ.get("SOAK_CLIENTS", "6")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", str(os.getpid()))))
    ap.add_argument("--failover", choices=["async", "replicated", "postgres"],
                    help="kill the store's primary under load and count duplicate executions: "
                         "Redis behind Sentinel with durability async or replicated, or "
                         "PostgreSQL with a synchronous standby")
    args = ap.parse_args()
    if args.failover:
        return failover_main(args)

    work = tempfile.mkdtemp(prefix="onceproxy-soak.")
    keep = os.environ.get("SOAK_KEEP") == "1"
    procs = Processes(args.build, work)
    ledger = Ledger()
    prepare_upload()
    started = time.monotonic()
    try:
        procs.start_upstream()
        procs.start_redis()
        procs.write_config()
        procs.start_proxy("A")
        procs.start_proxy("B")
        procs.wait_store_ready("A")
        procs.wait_store_ready("B")
        log(f"running {args.seconds:.0f} s, {args.clients} clients, a fault every "
            f"{args.fault_interval:.0f} s, seed {args.seed}, work dir {work}")
        T0 = time.monotonic()
        load = Load(procs, ledger, args.seed)
        stop_faults = threading.Event()
        stop_rss = threading.Event()
        series = {"A": [], "B": []}
        threads = [threading.Thread(target=load.client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        fthread = threading.Thread(target=fault_loop,
                                   args=(procs, ledger, stop_faults, args.fault_interval), daemon=True)
        rthread = threading.Thread(target=rss_loop, args=(procs, stop_rss, series), daemon=True)
        for t in threads + [fthread, rthread]:
            t.start()
        end = T0 + args.seconds
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            for d in procs.unexpected_deaths():
                ledger.violation(f"unexpected exit: {d}")
                end = 0
        stop_faults.set()
        fthread.join(30)
        load.stop.set()
        for t in threads:
            t.join(CLIENT_TIMEOUT_S * 3)
        stop_rss.set()
        rthread.join(5)
        for d in procs.unexpected_deaths():
            ledger.violation(f"unexpected exit: {d}")
        result = verify(load, procs, ledger)
        for d in procs.unexpected_deaths():
            ledger.violation(f"unexpected exit: {d}")
        rss_lines = judge_rss(series, ledger)
    except Exception:
        keep = True
        raise
    finally:
        procs.stop_all()
        if ledger.violations:
            keep = True
        if keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print("\n=== onceproxy soak summary ===")
    print(f"duration: load {args.seconds:.0f} s, total {time.monotonic() - started:.0f} s; "
          f"clients {args.clients}; seed {args.seed}")
    print("requests by outcome:")
    for k, v in sorted(ledger.outcomes.items()):
        print(f"  {k:58} {v}")
    print("faults injected:")
    for k, v in sorted(ledger.faults.items()):
        print(f"  {k:58} {v}")
    ex = result["executions"]
    print(f"keys checked: {result['keys']} (unsettled after the final retries: "
          f"{result['unsettled']}); replays checked from both proxies: {result['replays_checked']}")
    print(f"executions per key: 0: {ex[0]}, 1: {ex[1]}, 2: {ex[2]}, 3+: {ex[3]}; keys with a second "
          f"execution after an unknown outcome (legal): {result['exempted_keys']}; upstream total "
          f"executions {result['total_executions']}")
    for k, v in sorted(result["exempt_reasons"].items()):
        print(f"  second execution after {k:44} {v}")
    print("RSS series (VmRSS):")
    print("\n".join(rss_lines))
    if ledger.violations:
        print(f"FAILED: {len(ledger.violations)} violation(s):")
        for v in ledger.violations[:50]:
            print("  - " + v)
        return 1
    print("PASSED: at most once per key, no record lost, RSS flat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
