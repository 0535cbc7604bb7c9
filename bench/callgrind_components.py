#!/usr/bin/env python3
"""User-space instructions per request by component, from bench/callgrind.sh dumps.

    bench/callgrind_components.py [--functions N] LABEL=DUMP [LABEL=DUMP ...]

Each DUMP is a callgrind.out file written by bench/callgrind.sh, which leaves the number of
requests of its run beside it (DUMP.requests). Every function's own instructions (not those of
what it calls: coroutines resume from the event loop, so inclusive costs mean little here) are
put in a component by the object and the source file they come from, and divided by the
requests. The last rows count the calls to the allocator per request (malloc, operator new,
aligned_alloc, calloc, realloc) and the header field nodes Beast allocated among them.
--functions N lists, under the table, the N functions with the most instructions per request
of the last dump.

Note: valgrind does not emulate the SHA extensions (SHA-NI), so under callgrind OpenSSL hashes
with its plain x86-64 code; on a CPU that has them, SHA-256 costs several times fewer
instructions than the table shows (perf: 1.4 to 2.5% of a guarded request's CPU time here).
"""
import argparse
import collections
import re
import sys

COMPONENTS = [
    ("beast", "Beast: HTTP parser, header fields (one allocated node each, in a red-black tree), serializer"),
    ("sha", "SHA-256 (OpenSSL; see the note)"),
    ("std", "strings, vectors, shared pointers (libstdc++)"),
    ("asio", "Asio: event loop, operations, coroutine frames and resumption"),
    ("alloc", "allocator (jemalloc)"),
    ("proxy", "proxy code (src/http, src/wire, src/upstream, src/config, src/metrics)"),
    ("libc", "libc: memcpy and friends, system call wrappers, mutexes"),
    ("core", "request facts and records (src/core, Boost.JSON: canonical JSON, hashing, records)"),
    ("redis", "Redis client (src/redis, hiredis's reply reader)"),
    ("store", "store (src/store)"),
    ("other", "other"),
]
ALLOCATORS = ("malloc", "operator new(unsigned long)", "aligned_alloc", "calloc", "realloc")


def component(obj, src, fn):
    obj = obj or ""
    src = src or ""
    if "libcrypto" in obj:
        return "sha"
    if "jemalloc" in obj:
        return "alloc"
    if "libc.so" in obj:
        return "libc"
    if "hiredis" in obj:
        return "redis"
    if "libstdc++" in obj:
        return "std"
    if "boost_json" in obj or "/boost/json/" in src:
        return "core"
    if "/boost/beast/" in src or "/boost/intrusive/" in src:
        return "beast"
    if "/boost/asio/" in src:
        return "asio"
    for part, name in (("src/redis", "redis"), ("src/store", "store"), ("src/core", "core"),
                       ("include/onceproxy/core", "core"), ("include/onceproxy/store", "store")):
        if part in src:
            return name
    if "/src/" in src or "include/onceproxy/" in src:
        return "proxy"
    if "/c++/" in src:
        return "std"
    return "other"


NAME = re.compile(r"^(fn|fl|fi|fe|ob)=\((\d+)\)(?: (.*))?$")
CALLEE = re.compile(r"^c(fn|fi|fl|ob)=\((\d+)\)(?: (.*))?$")


def load(path):
    """Own instructions per (object, file, function), and calls per (caller, callee)."""
    names = {"fn": {}, "fl": {}, "ob": {}}
    own = collections.Counter()
    calls = collections.Counter()
    fn = src = obj = callee = None
    in_call = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = NAME.match(line)
            if m:
                kind, ident, text = m.groups()
                table = "fl" if kind in ("fi", "fe") else kind
                if text:
                    names[table][ident] = text
                value = names[table].get(ident, "?")
                if kind == "fn":
                    fn, in_call = value, False
                elif kind == "ob":
                    obj = value
                else:
                    src = value
                continue
            m = CALLEE.match(line)
            if m:
                kind, ident, text = m.groups()
                table = "fl" if kind == "fi" else kind
                if text:
                    names[table][ident] = text
                if kind == "fn":
                    callee = names["fn"].get(ident, "?")
                continue
            if line.startswith("calls="):
                in_call = True
                calls[(fn, callee)] += int(line.split()[0][6:])
                continue
            if fn and line[:1] in "+-*0123456789":
                parts = line.split()
                if len(parts) >= 2:
                    if in_call:  # the inclusive cost of the call just named
                        in_call = False
                        continue
                    own[(obj, src, fn)] += int(parts[1])
    return own, calls


def requests_of(dump):
    try:
        with open(dump + ".requests", encoding="utf-8") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        sys.exit(f"{dump}.requests is missing: run bench/callgrind.sh, which writes it")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--functions", type=int, default=0)
    ap.add_argument("dumps", nargs="+", metavar="LABEL=DUMP")
    args = ap.parse_args()
    columns = []
    last_own = None
    for spec in args.dumps:
        label, _, dump = spec.partition("=")
        if not dump:
            sys.exit(f"expected LABEL=DUMP, got {spec}")
        n = requests_of(dump)
        own, calls = load(dump)
        by = collections.Counter()
        for (obj, src, fn), ir in own.items():
            by[component(obj, src, fn)] += ir
        allocs = sum(c for (_, callee), c in calls.items() if callee in ALLOCATORS)
        fields = sum(c for (caller, callee), c in calls.items()
                     if callee in ALLOCATORS and caller and "basic_fields" in caller
                     and "new_element" in caller)
        columns.append((label, {k: v / n for k, v in by.items()}, allocs / n, fields / n))
        last_own, last_n = own, n
    print("| instructions per request | " + " | ".join(c[0] for c in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for key, title in COMPONENTS:
        if any(c[1].get(key, 0) >= 50 for c in columns):
            print(f"| {title} | " + " | ".join(f"{c[1].get(key, 0) / 1000:.1f}k" for c in columns) + " |")
    print("| **all** | " + " | ".join(f"**{sum(c[1].values()) / 1000:.1f}k**" for c in columns) + " |")
    print("| allocations per request | " + " | ".join(f"{c[2]:.0f}" for c in columns) + " |")
    print("| of which Beast header fields | " + " | ".join(f"{c[3]:.0f}" for c in columns) + " |")
    if args.functions:
        print(f"\nfunctions with the most own instructions per request ({columns[-1][0]}):")
        top = collections.Counter()
        for (_, _, fn), ir in last_own.items():
            top[fn] += ir
        for fn, ir in top.most_common(args.functions):
            print(f"{ir / last_n:9.0f}  {fn[:150]}")


if __name__ == "__main__":
    main()
