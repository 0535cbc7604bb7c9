#!/usr/bin/env python3
"""The conformance report: docs/conformance/requirements.txt maps every MUST/SHOULD of the
Idempotency-Key draft and every guarantee of the README to the automated tests that check it;
this script checks that every mapped test still exists, runs them, and writes docs/CONFORMANCE.md
with each requirement's result and the date.

    scripts/conformance-report.py [--build build/test] [--map FILE] [--out FILE] [--check-only]

--check-only lists the test cases of every test binary the map names (--list-test-cases) and
fails when a mapped test is not among them; it runs nothing (make test runs this check). Without
it, the mapped tests run, one run per binary with a doctest -tc filter, and the report is written
even when some fail. Exit status: 0 all mapped tests exist (and passed), 1 otherwise, 2 a usage or
map format error.

Map format (blocks separated by blank lines, `#` starts a comment line):

    id: DRAFT-2.1-string
    source: draft-ietf-httpapi-idempotency-key-header-07 §2.1
    level: MUST
    text: The field's value is a Structured Field String.
    test: unit_core | - | idempotency_key: strict syntax takes sf-strings only
    test: it_idempotency_test | idempotency | key.syntax: strict takes sf-strings only
    note: free text shown in the report (optional)

A test is `binary | suite | case`, the doctest test suite and test case names exactly as
written in the source (`-` for no suite). A requirement with no test must say why in `untested:`.
"""

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class MapError(Exception):
    pass


def parse_map(path):
    """The requirements of the map at `path`, in order: dicts with id, source, level, text,
    tests [(binary, suite, case)], note, untested, line."""
    reqs = []
    cur = None
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if line.startswith("#"):
            continue
        if not line.strip():
            cur = None
            continue
        if ":" not in line:
            raise MapError(f"{path}:{n}: expected 'field: value', got {line!r}")
        field, value = line.split(":", 1)
        field = field.strip()
        value = value.strip()
        if field == "id":
            cur = {"id": value, "tests": [], "line": n, "note": "", "untested": ""}
            if any(r["id"] == value for r in reqs):
                raise MapError(f"{path}:{n}: duplicate id {value!r}")
            reqs.append(cur)
            continue
        if cur is None:
            raise MapError(f"{path}:{n}: '{field}' outside a requirement (start one with id:)")
        if field == "test":
            parts = [p.strip() for p in value.split("|", 2)]
            if len(parts) != 3 or not parts[0] or not parts[2]:
                raise MapError(f"{path}:{n}: expected 'test: binary | suite | case'")
            binary, suite, case = parts
            cur["tests"].append((binary, "" if suite == "-" else suite, case))
        elif field in ("source", "level", "text", "note", "untested"):
            if field == "text" and cur.get("text"):
                cur["text"] += " " + value
            else:
                cur[field] = value
        else:
            raise MapError(f"{path}:{n}: unknown field {field!r}")
    for r in reqs:
        for needed in ("source", "level", "text"):
            if not r.get(needed):
                raise MapError(f"{path}:{r['line']}: requirement {r['id']} has no {needed}")
        if not r["tests"] and not r["untested"]:
            raise MapError(
                f"{path}:{r['line']}: requirement {r['id']} names no test and no untested: reason")
    return reqs


def find_binary(build, name):
    for sub in ("tests", "."):
        p = os.path.join(build, sub, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise MapError(f"test binary {name!r} not found under {build} (build it first)")


def listed_cases(binary):
    """{(suite, case)} of every test case the doctest binary holds."""
    out = subprocess.run([binary, "--list-test-cases", "--reporters=xml", "--no-version"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise MapError(f"{binary} --list-test-cases failed: {out.stderr.strip()[:500]}")
    root = ET.fromstring(out.stdout)
    return {(tc.get("testsuite") or "", tc.get("name")) for tc in root.iter("TestCase")}


def escape_filter(name):
    # doctest splits -tc on commas; a backslash escapes one (and itself).
    return name.replace("\\", "\\\\").replace(",", "\\,")


def run_cases(binary, cases):
    """Runs `cases` [(suite, case)] of one binary; {(suite, case): (passed, detail)}."""
    names = sorted({c for _, c in cases})
    with tempfile.NamedTemporaryFile(suffix=".xml", delete=False) as tmp:
        out_path = tmp.name
    try:
        proc = subprocess.run(
            [binary, "-tc=" + ",".join(escape_filter(n) for n in names), "--reporters=xml",
             "--out=" + out_path, "--no-version"],
            capture_output=True, text=True, timeout=3600)
        results = {}
        try:
            root = ET.parse(out_path).getroot()
        except ET.ParseError as e:
            detail = f"no report ({e}); exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
            return {c: (False, detail) for c in cases}
        wanted = set(cases)
        # The run report nests test cases in their suites; cases outside the filter are listed
        # with skipped="true" and are of no interest.
        for ts in root.iter("TestSuite"):
            for tc in ts.iter("TestCase"):
                key = (ts.get("name") or "", tc.get("name"))
                if key not in wanted or tc.get("skipped") == "true":
                    continue
                res = tc.find("OverallResultsAsserts")
                ok = res is not None and res.get("test_case_success") == "true"
                detail = ""
                if not ok:
                    detail = (f"{res.get('failures', '?')} failed assertion(s)" if res is not None
                              else "no result (crashed?)")
                results[key] = (ok, detail)
        for c in cases:
            if c not in results:
                results[c] = (False, f"did not run (binary exit {proc.returncode})")
            elif results[c][0] and proc.returncode not in (0, 1):
                # a sanitizer report or a crash after the case: the run as a whole failed
                results[c] = (False, f"binary exit {proc.returncode} after the case passed")
        return results
    finally:
        os.unlink(out_path)


def md_escape(s):
    # `<` and `>` would start HTML in Markdown (template test names carry `<fixture>`).
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def write_report(path, reqs, results, map_path, build):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        if dirty:
            commit += " (with local changes)"
    except OSError:
        commit = "unknown"
    tested = [r for r in reqs if r["tests"]]
    passed = [r for r in tested if all(results[t][0] for t in r["tests"])]
    all_tests = {t for r in reqs for t in r["tests"]}
    lines = [
        "# Conformance report",
        "",
        "Generated by `make conformance-report` (scripts/conformance-report.py) from",
        f"`{os.path.relpath(map_path, ROOT)}`; do not edit by hand.",
        "",
        f"- Generated: {now}, commit {commit}, test build `{os.path.relpath(build, ROOT)}`"
        " (ASan+UBSan).",
        f"- Requirements: {len(reqs)}; {len(tested)} checked by automated tests, "
        f"{len(reqs) - len(tested)} not testable here (the reason is given).",
        f"- Result: {len(passed)} of {len(tested)} requirements pass every test mapped to them; "
        f"{sum(1 for t in all_tests if results[t][0])} of {len(all_tests)} distinct tests passed.",
        "",
        "A test is named `binary | test suite | test case` (doctest); run one with",
        "`build/test/tests/<binary> -ts='<suite>' -tc='<case>'`. The requirement texts of the draft",
        "are paraphrased; its section numbers are given with each.",
        "",
    ]
    sections = []
    for r in reqs:
        group = r["source"].split(" §")[0]
        if group not in sections:
            sections.append(group)
    for group in sections:
        lines += [f"## {group}", "", "| id | level | requirement | tests | result |",
                  "|---|---|---|---|---|"]
        for r in reqs:
            if r["source"].split(" §")[0] != group:
                continue
            where = r["source"][len(group):].strip()
            text = md_escape(r["text"]) + (f" ({where})" if where else "")
            if r["note"]:
                text += "<br>*" + md_escape(r["note"]) + "*"
            if r["tests"]:
                tests = "<br>".join(
                    md_escape(f"`{b}` {s + ' / ' if s else ''}{c}") for b, s, c in r["tests"])
                failed = [t for t in r["tests"] if not results[t][0]]
                if failed:
                    result = "**FAIL** " + "; ".join(
                        md_escape(f"{c}: {results[(b, s, c)][1]}") for b, s, c in failed)
                else:
                    result = f"pass ({len(r['tests'])}/{len(r['tests'])})"
            else:
                tests = "—"
                result = "not tested: " + md_escape(r["untested"])
            lines.append(f"| {r['id']} | {r['level']} | {text} | {tests} | {result} |")
        lines.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "test"))
    ap.add_argument("--map", default=os.path.join(ROOT, "docs", "conformance", "requirements.txt"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "CONFORMANCE.md"))
    ap.add_argument("--check-only", action="store_true")
    args = ap.parse_args()
    try:
        reqs = parse_map(args.map)
        by_binary = {}
        for r in reqs:
            for b, s, c in r["tests"]:
                by_binary.setdefault(b, set()).add((s, c))
        missing = []
        paths = {}
        for b in sorted(by_binary):
            paths[b] = find_binary(args.build, b)
            have = listed_cases(paths[b])
            for s, c in sorted(by_binary[b]):
                if (s, c) not in have:
                    missing.append(f"{b} | {s or '-'} | {c}")
    except (MapError, OSError, subprocess.SubprocessError, ET.ParseError) as e:
        print(f"conformance-report: {e}", file=sys.stderr)
        return 2
    if missing:
        print("conformance-report: the map names tests that do not exist (renamed or removed?):",
              file=sys.stderr)
        for m in missing:
            print("  " + m, file=sys.stderr)
        return 1
    count = sum(len(v) for v in by_binary.values())
    if args.check_only:
        print(f"conformance-report: {len(reqs)} requirements, {count} mapped tests, all present")
        return 0
    results = {}
    for b in sorted(by_binary):
        print(f"conformance-report: running {len(by_binary[b])} test(s) of {b}", flush=True)
        for (s, c), res in run_cases(paths[b], sorted(by_binary[b])).items():
            results[(b, s, c)] = res
    write_report(args.out, reqs, results, args.map, args.build)
    failed = sorted(t for t, (ok, _) in results.items() if not ok)
    print(f"conformance-report: wrote {os.path.relpath(args.out, ROOT)}; "
          f"{count - len(failed)} of {count} tests passed")
    for b, s, c in failed:
        print(f"  FAIL {b} | {s or '-'} | {c}: {results[(b, s, c)][1]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
