#!/usr/bin/env python3
"""The Grafana dashboard (deploy/monitoring/dashboard.json) stays importable and true to metrics.

Usage: check-dashboard.py --promtool PATH [ROOT]

Checks that panel ids are unique; that every panel and query uses the `datasource` variable;
that panels fit the 24 grid columns without overlapping; that every panel has a description;
that range vectors take [$__rate_interval] (or [$__range], the dashboard's time range);
that every metric named in a query or a variable is a family of
include/onceproxy/metrics/family.hpp documented in docs/operations.md (_bucket, _sum and _count
only on histograms), matched and grouped only by labels it has; and that every query is valid
PromQL: with the Grafana variables replaced by sample values, the queries become recording
rules of a temporary file that `promtool check rules` must accept. Exit 1 with the problems
listed, 0 otherwise.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

# Sample values for the variables Grafana fills in, as a query would see them.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "30000",
}
SAMPLE_VALUES = {"job": "onceproxy", "instance": "10.0.0.1:9901", "route": "payments",
                 "egress_route": "provider"}

KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--promtool", required=True, help="path of promtool")
parser.add_argument("--dashboard", help="the dashboard JSON (default: ROOT/deploy/monitoring/"
                    "dashboard.json)")
parser.add_argument("root", nargs="?", default=".", help="the source tree")
args = parser.parse_args()
root = pathlib.Path(args.root)
path = pathlib.Path(args.dashboard) if args.dashboard else root / "deploy/monitoring/dashboard.json"

problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


# The families of the table with their kind and labels; `documented`: those the manual lists.
table = (root / "include/onceproxy/metrics/family.hpp").read_text()
manual = (root / "docs/operations.md").read_text()
families = {}  # name: (kind, label names, with the job and instance of the scrape)
for name, kind, scope, label in re.findall(
        r'"(onceproxy_\w+)",\s*kind::(\w+),\s*scope::(\w+),\s*"(\w*)"', table):
    first = {"route": "route", "egress_route": "route", "upstream": "upstream"}.get(scope, "")
    labels = {"job", "instance", first, label}
    families[name] = (kind, labels - {""})
if len(families) < 30:
    sys.exit(f"found only {len(families)} families in family.hpp: the pattern no longer matches")
documented = {name for name in families if re.search(rf"`{name}[`{{]", manual)}

try:
    dashboard = json.loads(path.read_text())
except (OSError, ValueError) as e:
    sys.exit(f"{path}: {e}")

variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
ds_var = variables.get("datasource", {})
if ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
    problem("templating", "needs a `datasource` variable of type datasource, query prometheus")
for name in ("job", "instance", "route"):
    if variables.get(name, {}).get("type") != "query":
        problem("templating", f"needs a `{name}` query variable")
if dashboard.get("schemaVersion", 0) < 36:
    problem("dashboard", "schemaVersion below 36")


def uses_ds_variable(ds):
    return isinstance(ds, dict) and ds.get("uid") in ("${datasource}", "$datasource")


def substitute(where, expr):
    """The expression as Prometheus would get it from Grafana, with sample values."""
    def value(m):
        name = m.group(1) or m.group(2)
        if name in BUILTINS:
            return BUILTINS[name]
        if name in variables and name in SAMPLE_VALUES:
            return SAMPLE_VALUES[name]
        problem(where, f"unknown variable ${name}")
        return "x"
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def check_metrics(where, expr):
    """Every metric an expression names is a documented family, and every label it matches or
    groups by is one of that family's (or, for grouping, one of the expression's families)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    grouping = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)",
                         text):
        grouping.update(re.findall(r"\w+", m.group(1)))
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)                # ranges and subqueries
    text = re.sub(r"\boffset\s+-?[\w.]+", " ", text)
    known = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)\s*(\(|\{[^}]*\})?", text):
        name, after = m.group(1), m.group(2) or ""
        if after == "(" or name.lower() in KEYWORDS:
            continue  # a function or an operator
        base, labels = name, set()
        for suffix in HISTOGRAM_SUFFIXES:
            stem = name[: -len(suffix)]
            if name.endswith(suffix) and families.get(stem, ("",))[0] == "histogram":
                base = stem
                labels = {"le"} if suffix == "_bucket" else set()
        if base not in families:
            problem(where, f"{name} is not a metric family of family.hpp")
            known.add("*")  # its labels are unknown: no grouping check
            continue
        if base not in documented:
            problem(where, f"{name} is not documented in docs/operations.md")
        if families[base][0] == "histogram" and base == name:
            problem(where, f"{name} is a histogram: query {name}_bucket, _sum or _count")
        labels |= families[base][1] | {"__name__"}
        known |= labels
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", after):
            if label not in labels:
                problem(where, f"{name} has no label {label}")
    for label in sorted(grouping - known if "*" not in known else set()):
        problem(where, f"grouping by {label}, a label none of its metrics has")


rules = []  # (record name, expression) for promtool
for name, var in variables.items():
    if var.get("type") != "query":
        continue
    where = f"variable {name}"
    if not uses_ds_variable(var.get("datasource")):
        problem(where, "datasource must be ${datasource}")
    query = var.get("query")
    query = query.get("query", "") if isinstance(query, dict) else query or ""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
    if not m:
        problem(where, f"expected label_values(<selector>, <label>), got {query!r}")
        continue
    expr = substitute(where, f"count by ({m.group(2)}) ({m.group(1)})")
    check_metrics(where, expr)
    rules.append((f"dashboard:variable_{name}", expr))


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


panels = list(all_panels(dashboard.get("panels", [])))
if not panels:
    problem("dashboard", "no panels")
ids = {}
cells = {}
for p in panels:
    where = f"panel {p.get('id')} {p.get('title')!r}"
    if p.get("id") in ids:
        problem(where, f"id {p.get('id')} is also panel {ids[p.get('id')]!r}")
    ids[p.get("id")] = p.get("title")
    g = p.get("gridPos", {})
    x, y, w, h = (g.get(k) for k in ("x", "y", "w", "h"))
    if not all(isinstance(v, int) for v in (x, y, w, h)) or x < 0 or y < 0 or w < 1 or h < 1:
        problem(where, f"gridPos {g} is not a box of whole cells")
    elif x + w > 24:
        problem(where, f"gridPos {g} goes past the 24 columns")
    else:
        box = [(cx, cy) for cx in range(x, x + w) for cy in range(y, y + h)]
        other = next((cells[c] for c in box if c in cells), None)
        if other is not None:
            problem(where, f"overlaps panel {other}")
        cells.update(dict.fromkeys(box, p.get("id")))
    if p.get("type") == "row":
        continue
    if not p.get("description", "").strip():
        problem(where, "has no description")
    if not uses_ds_variable(p.get("datasource")):
        problem(where, "datasource must be ${datasource}")
    targets = p.get("targets", [])
    if not targets:
        problem(where, "has no queries")
    for t in targets:
        twhere = f"{where} query {t.get('refId')}"
        if not uses_ds_variable(t.get("datasource", p.get("datasource"))):
            problem(twhere, "datasource must be ${datasource}")
        for window in re.findall(r"\[([^\]]*)\]", t.get("expr", "")):
            if window not in ("$__rate_interval", "$__range"):
                problem(twhere, f"range [{window}]: use [$__rate_interval] (or [$__range])")
        expr = substitute(twhere, t.get("expr", ""))
        if not expr.strip():
            problem(twhere, "empty expr")
            continue
        check_metrics(twhere, expr)
        rules.append((f"dashboard:panel_{p.get('id')}:{t.get('refId')}", expr))

# promtool reads YAML, and JSON is YAML.
with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="dashboard-rules-") as f:
    json.dump({"groups": [{"name": "dashboard", "rules": [
        {"record": record, "expr": expr} for record, expr in rules]}]}, f, indent=1)
    f.flush()
    run = subprocess.run([args.promtool, "check", "rules", f.name], capture_output=True,
                         text=True)
    if run.returncode != 0:
        problem("promtool check rules", (run.stdout + run.stderr).strip())

if problems:
    print(f"{path}:")
    for p in problems:
        print("  " + p)
    sys.exit(1)
print(f"{path}: {len(panels)} panels, {len(rules)} queries: ids unique, data source variable, "
      "grid, documented metrics and labels, PromQL valid (promtool)")
