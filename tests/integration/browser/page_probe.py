#!/usr/bin/env python3
"""Loads a page in headless Chromium and reports what a person would see, as JSON on stdout.

Drives Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: fds 3 and 4,
messages separated by NUL), so nothing listens on a port. Reported:
  errors     console errors and warnings, uncaught exceptions, failed loads
  values     the text of every element with a data-k attribute, by that attribute
  rates_seen whether a cell data-k="route:*:rate" showed a rate above 0 at some refresh
  overflow   whether the document is wider than the window (a phone must not scroll sideways)
Options: --width/--height (the window, CSS pixels), --not-before EPOCH (collect the values from
the first refresh whose document.body.dataset.generated is at or after it), --screenshot PNG
(the whole page), --timeout seconds.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


class Browser:
    def __init__(self, chromium, width, height):
        self.profile = tempfile.mkdtemp(prefix="onceproxy-chromium-")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def wire():  # in the child: fd 3 reads commands, fd 4 writes answers
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
             "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
             f"--window-size={width},{height}", f"--user-data-dir={self.profile}",
             "about:blank"],
            preexec_fn=wire, pass_fds=(3, 4),  # kept open after wire() ran
            stdout=subprocess.DEVNULL, stderr=open(os.environ.get("PROBE_STDERR", os.devnull), "w"))
        os.close(to_child_r)
        os.close(from_child_w)
        self.next_id = 0
        self.buffer = b""
        self.events = []

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read(self, deadline):
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the pipe (exit %s)" % self.proc.poll())
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)


def errors_in(events):
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
            out.append("console." + p["type"] + ": " +
                       " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
        elif method == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            out.append("log: " + p["entry"]["text"] + " " + p["entry"].get("url", ""))
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            out.append("load failed: " + p.get("errorText", ""))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--mobile", action="store_true")
    ap.add_argument("--not-before", type=float, default=0)
    ap.add_argument("--screenshot")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()

    b = Browser(args.chromium, args.width, args.height)
    try:
        target = b.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            b.call(domain + ".enable", session=s)
        b.call("Emulation.setDeviceMetricsOverride",
               {"width": args.width, "height": args.height, "deviceScaleFactor": 1,
                "mobile": args.mobile}, session=s)
        b.call("Page.navigate", {"url": args.url}, session=s)

        def evaluate(expr):
            r = b.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=s)
            if "exceptionDetails" in r:
                raise RuntimeError("evaluate failed: " + json.dumps(r["exceptionDetails"]))
            return r["result"].get("value")

        # "{}" while the page is still loading (no body yet).
        collect = """(() => { try { return JSON.stringify({
            generated: Number((document.body && document.body.dataset.generated) || 0),
            values: Object.fromEntries([...document.querySelectorAll('[data-k]')]
                                        .map(e => [e.dataset.k, e.textContent])),
            overflow: document.documentElement.scrollWidth > window.innerWidth,
            height: document.documentElement.scrollHeight}) } catch (e) { return "{}" } })()"""
        deadline = time.monotonic() + args.timeout
        rates_seen = False
        seen = None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the page did not show a refresh after --not-before")
            state = json.loads(evaluate(collect) or "{}")
            for k, v in state.get("values", {}).items():
                if k.endswith(":rate") and v.replace(".", "", 1).isdigit() and float(v) > 0:
                    rates_seen = True
            # The first refresh at or after --not-before, or (rates take two refreshes: a
            # Chromium slow to start on a loaded machine may see its first one late) a later
            # one that shows a rate, for up to 6 s more.
            generated = state.get("generated", 0)
            if generated > 0 and generated >= args.not_before and (
                    rates_seen or generated >= args.not_before + 6):
                seen = state
                break
            time.sleep(0.2)
        if args.screenshot:
            b.call("Emulation.setDeviceMetricsOverride",
                   {"width": args.width, "height": max(args.height, seen["height"]),
                    "deviceScaleFactor": 1, "mobile": args.mobile}, session=s)
            shot = b.call("Page.captureScreenshot", {"format": "png"}, session=s)
            import base64
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        time.sleep(0.3)
        b.call("Runtime.evaluate", {"expression": "1"}, session=s)  # drain late events
        json.dump({"errors": errors_in(b.events), "values": seen["values"],
                   "rates_seen": rates_seen, "overflow": seen["overflow"]}, sys.stdout)
    finally:
        b.close()


if __name__ == "__main__":
    main()
