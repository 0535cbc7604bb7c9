#!/usr/bin/env python3
"""One large streamed transfer for bench/run.sh (stdlib only): curl moves BYTES through URL while
the resident memory of the measured processes is sampled, and one JSON line is printed.

  bulk.py --mode upload|download --url URL --bytes N --pids PID[,PID...] --file SPARSE_FILE
          [--time-limit SECONDS] [--label TEXT]

upload:   curl -T SPARSE_FILE (Content-Length N, the body streamed from a sparse file); the test
          upstream answers with the number of body bytes it read, which must equal N.
download: GET with X-Test-Body-Bytes: N (the test upstream generates the body piece by piece);
          curl writes it to /dev/null and reports the size, which must equal N.

Output: {"mode", "bytes", "seconds", "mb_per_s", "peak_rss_kib", "rss_before_kib", "ok",
"detail"}. peak_rss_kib is the highest sum of VmRSS over the measured PIDs (sampled every 50 ms;
nginx counts its master and workers), rss_before_kib the same sum just before the transfer.
Exit status 0 unless the transfer failed or moved the wrong number of bytes.
"""
import argparse
import json
import re
import subprocess
import sys
import time


def rss_kib(pids) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
                total += int(m.group(1)) if m else 0
        except OSError:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("upload", "download"), required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--pids", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--time-limit", type=float, default=300)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    pids = [int(p) for p in a.pids.split(",") if p]

    fmt = "%{http_code} %{size_download} %{size_upload} %{time_total}"
    cmd = ["curl", "-s", "--max-time", str(int(a.time_limit)), "-w", fmt]
    if a.mode == "upload":
        with open(a.file, "wb") as f:
            f.truncate(a.bytes)  # sparse: reading it costs no disk I/O
        cmd += ["-T", a.file, "-X", "POST", "-H", "Content-Type: application/octet-stream",
                "-H", "Expect:", "-o", a.file + ".reply", a.url]
    else:
        cmd += ["-H", f"X-Test-Body-Bytes: {a.bytes}", "-o", "/dev/null", a.url]

    before = rss_kib(pids)
    peak = before
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        peak = max(peak, rss_kib(pids))
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    out, err = proc.communicate()
    peak = max(peak, rss_kib(pids))

    ok = False
    detail = f"curl exit {proc.returncode} {err.strip()[:200]}"
    fields = out.split()
    seconds = elapsed
    if proc.returncode == 0 and len(fields) == 4:
        code, down, up, total = fields
        seconds = float(total) or elapsed
        if code != "200":
            detail = f"HTTP {code}"
        elif a.mode == "download":
            ok = int(down) == a.bytes
            detail = f"received {down} bytes"
        else:
            try:
                with open(a.file + ".reply") as f:
                    got = json.load(f).get("body_bytes")
            except (OSError, ValueError) as e:
                got = f"unreadable reply ({e})"
            ok = int(up) == a.bytes and got == a.bytes
            detail = f"sent {up} bytes, upstream read {got}"
    mbps = a.bytes / 1e6 / seconds if ok and seconds > 0 else float("nan")
    print(json.dumps({
        "mode": a.mode, "bytes": a.bytes, "seconds": seconds, "mb_per_s": mbps,
        "peak_rss_kib": peak, "rss_before_kib": before, "ok": ok, "detail": detail}))
    if a.label:
        print(f"[bench] {a.label}: {mbps:.0f} MB/s, peak RSS {peak / 1024:.1f} MiB "
              f"(before {before / 1024:.1f} MiB), {detail}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
