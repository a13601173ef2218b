#!/usr/bin/python3
"""The Grafana dashboard (charts/geotrain/dashboards/geotrain-wan.json) against
the exporters' sources and docs/metrics.md, without running anything.

1. layout: panel ids unique; every panel and target on the `datasource`
   variable; gridPos inside the 24 columns, no two panels overlapping, rows
   full width, panels listed in reading order (y, then x);
2. names: every geotrain_* metric a PromQL expression names (panels and
   template variables) is registered by the worker exporter
   (worker/metrics/worker_metrics.cc) or the controller (controller/**/*.{cc,h});
   the worker's are in the table of docs/metrics.md;
3. labels: on worker metrics, every label a selector matches on is one the
   table gives that metric (or job, region, rank, le of a histogram), every
   literal value is one it lists, and every `by (...)` label belongs to a
   metric of its expression;
4. docs: the table of docs/metrics.md lists exactly what the worker exporter
   registers, and its list of dashboard rows names exactly the dashboard's.

tests/worker/metrics/scrape_local_test.py holds the same dashboard to a real
scrape and a real Prometheus; this test needs no worker binary, so it runs in
every build.

Usage: dashboard_test.py REPO_ROOT
"""

import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from checks import check, failures, finish  # noqa: E402,F401

CONSTANT_LABELS = {"job", "region", "rank"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
NAME = re.compile(r"\b(geotrain_[a-zA-Z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
REGISTERED = re.compile(r'"(geotrain_[a-z0-9_]+)"')


def family(name, known):
    """The registered family a series name belongs to (a histogram's _bucket,
    _sum and _count are its own)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name not in known and name.endswith(suffix) and name[: -len(suffix)] in known:
            return name[: -len(suffix)]
    return name


def registered(paths):
    names = set()
    for path in paths:
        with open(path) as f:
            names |= set(REGISTERED.findall(f.read()))
    return names


def docs_table(path):
    """{metric: (type, {label: {values}})} from the table of docs/metrics.md."""
    table = {}
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 4 or not re.fullmatch(r"`geotrain_[a-z0-9_]+`", cells[0]):
                continue
            labels = {}
            # "`reason` (`key`, `handshake`)": a label, then its values.
            for label, values in re.findall(r"`([a-z_]+)`(?:\s*\(([^)]*)\))?", cells[2]):
                labels[label] = set(re.findall(r"`([^`]+)`", values))
            table[cells[0].strip("`")] = (cells[1].split()[0], labels)
    return table


def docs_rows(path):
    with open(path) as f:
        text = f.read()
    section = text.split("## The Grafana dashboard", 1)[-1]
    return re.findall(r"^- \*\*([^*]+)\*\*:", section, re.M)


def check_layout(panels):
    ids = [p.get("id") for p in panels]
    check(all(isinstance(i, int) and i > 0 for i in ids), f"panel ids {ids}")
    check(len(ids) == len(set(ids)), f"duplicate panel ids in {ids}")
    boxes = []
    for p in panels:
        where = f"panel {p.get('id')} ({p.get('title')})"
        g = p.get("gridPos", {})
        if not check(all(isinstance(g.get(k), int) for k in "hwxy"), f"{where}: gridPos {g}"):
            continue
        check(g["h"] > 0 and g["w"] > 0 and g["x"] >= 0 and g["y"] >= 0 and
              g["x"] + g["w"] <= 24, f"{where}: gridPos {g} outside the 24 columns")
        if p["type"] == "row":
            check(g["x"] == 0 and g["w"] == 24 and g["h"] == 1, f"{where}: row gridPos {g}")
            check(p.get("collapsed") is False and p.get("panels") == [],
                  f"{where}: rows are expanded, their panels follow them")
        else:
            check(p.get("datasource") == DATASOURCE, f"{where}: datasource {p.get('datasource')}")
            targets = p.get("targets", [])
            check(targets, f"{where}: no targets")
            refs = [t.get("refId") for t in targets]
            check(len(refs) == len(set(refs)), f"{where}: refIds {refs}")
            for t in targets:
                check(t.get("datasource") == DATASOURCE and t.get("expr"),
                      f"{where}: target {t.get('refId')} without the datasource or an expr")
        for other, og in boxes:
            check(g["x"] + g["w"] <= og["x"] or og["x"] + og["w"] <= g["x"] or
                  g["y"] + g["h"] <= og["y"] or og["y"] + og["h"] <= g["y"],
                  f"{where} overlaps {other}")
        boxes.append((where, g))
    order = [(p["gridPos"]["y"], p["gridPos"]["x"]) for p in panels if "gridPos" in p]
    check(order == sorted(order), "panels are not listed in reading order (y, then x)")


def expressions(dash):
    exprs = []
    for p in dash["panels"]:
        exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            exprs.append(q)
    return exprs


def main():
    repo = sys.argv[1]
    with open(os.path.join(repo, "charts", "geotrain", "dashboards", "geotrain-wan.json")) as f:
        dash = json.load(f)
    metrics_md = os.path.join(repo, "docs", "metrics.md")
    docs = docs_table(metrics_md)
    worker = registered([os.path.join(repo, "worker", "metrics", "worker_metrics.cc")])
    controller = registered(glob.glob(os.path.join(repo, "controller", "**", "*.cc"), recursive=True) +
                            glob.glob(os.path.join(repo, "controller", "**", "*.h"), recursive=True))
    histograms = {n for n, (t, _) in docs.items() if t == "histogram"}
    check(len(worker) >= 20 and len(controller) >= 4,
          f"found only {sorted(worker)} and {sorted(controller)} registered")

    check_layout(dash["panels"])

    exprs = expressions(dash)
    used = set()
    for e in exprs:
        in_expr = set()
        for name, matchers in NAME.findall(e):
            metric = family(name, worker | controller)
            used.add(metric)
            if metric in controller and metric not in worker:
                continue  # tests/controller/controller_e2e_test.py checks those labels
            in_expr.add(metric)
            check(metric in worker, f"the dashboard uses {name}, which nothing exports")
            if not check(metric in docs, f"the dashboard uses {name}, not in docs/metrics.md"):
                continue
            labels = docs[metric][1]
            allowed = CONSTANT_LABELS | set(labels) | ({"le"} if metric in histograms else set())
            for label, op, value in MATCHER.findall(matchers):
                check(label in allowed, f"{e}: {name} has no label {label}")
                if op == "=" and "$" not in value and labels.get(label):
                    check(value in labels[label],
                          f"{e}: {name}{{{label}={value!r}}}: docs list {sorted(labels[label])}")
        if not in_expr:
            continue
        have = set(CONSTANT_LABELS)
        for metric in in_expr:
            have |= set(docs.get(metric, ("", {}))[1])
            if metric in histograms:
                have.add("le")
        for by in re.findall(r"\bby\s*\(([^)]*)\)", e):
            for label in filter(None, (x.strip() for x in by.split(","))):
                check(label in have, f"{e}: groups by {label}, which none of its metrics has")

    documented = set(docs)
    check(documented == worker,
          f"docs/metrics.md and the worker exporter differ: only documented "
          f"{sorted(documented - worker)}, only exported {sorted(worker - documented)}")
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    check(rows == docs_rows(metrics_md),
          f"dashboard rows {rows}, docs/metrics.md lists {docs_rows(metrics_md)}")
    print(f"dashboard: {len(dash['panels'])} panels, {len(exprs)} expressions over "
          f"{len(used)} metrics; docs/metrics.md lists {len(documented)}")
    finish()


if __name__ == "__main__":
    main()
