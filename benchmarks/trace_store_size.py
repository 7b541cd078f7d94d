#!/usr/bin/env python
"""What a trace costs the store in bytes: the same gold cell with traces off and on, each in a fresh
SQLite store, and the traces' bytes counted.

Per trace: the store's growth (both stores VACUUMed, on - off, divided by the traces), the spans'
JSON in it, and the `traces.json` artifacts MLflow wrote besides (a trace stored twice); then where
the bytes go: each table and its indexes (SQLite's `dbstat`: the pages, with what of them is unused),
and the spans' JSON split into MLflow's own fields and the inputs, outputs and attributes we give. Every
trace is read back whole (its judge span included) and its spans are counted. Extra overrides
(`--set tracking.trace_text_chars=500`) go to both runs; run it with another checkout on PYTHONPATH
to measure that code (the printed table says which apps_bench it imported).

Usage (from anywhere):
  python benchmarks/trace_store_size.py [--rows FILE] [--n 50] [--topology sequential_langgraph] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"  # the vendored rows


def run_cell(cwd: Path, args: argparse.Namespace, traces: bool) -> None:
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    for name in ("MLFLOW_TRACKING_URI", "APPS_BENCH_PARENT_RUN_ID"):
        env.pop(name, None)
    cmd = [
        sys.executable,
        "-m",
        "apps_bench",
        "model=gold",
        "dataset=apps",
        f"dataset.path={args.rows}",
        "dataset.split=train",
        f"limit={args.n}",
        f"topology={args.topology}",
        "progress=false",
        f"tracking.traces={'true' if traces else 'false'}",
        *args.set,
    ]
    r = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def vacuumed(db: Path) -> Path:
    copy = db.with_name("vacuumed.db")
    with sqlite3.connect(db) as src:
        src.execute(f"VACUUM INTO '{copy}'")
    return copy


def pages_by_table(db: Path) -> dict[str, tuple[int, int]]:
    """{'<table>' or '<table> indexes': (bytes of pages, bytes unused in them)} from SQLite's dbstat."""
    with sqlite3.connect(db) as c:
        owner = dict(c.execute("select name, tbl_name from sqlite_master where type in ('table', 'index')"))
        out: dict[str, tuple[int, int]] = {}
        for name, size, unused in c.execute("select name, sum(pgsize), sum(unused) from dbstat group by name"):
            table = owner.get(name, name)
            key = table if table == name else f"{table} indexes"
            have = out.get(key, (0, 0))
            out[key] = (have[0] + size, have[1] + unused)
    return out


OURS = ("mlflow.spanInputs", "mlflow.spanOutputs")  # what we give a span, besides attributes of our own names


def span_json_split(db: Path) -> tuple[int, int, int]:
    """(MLflow's own fields, our inputs and outputs, our attributes) in bytes of the spans' JSON, all traces."""
    import json

    mlflow_own = io = attrs = 0
    with sqlite3.connect(db) as c:
        for (content,) in c.execute("select content from spans"):
            span = json.loads(content)
            for key, value in span.pop("attributes", {}).items():
                size = len(json.dumps({key: value})) - 2
                if key in OURS:
                    io += size
                elif key.startswith("mlflow."):
                    mlflow_own += size
                else:
                    attrs += size
            mlflow_own += len(json.dumps(span))
    return mlflow_own, io, attrs


def traces_read_back(db: Path) -> tuple[int, int]:
    """(traces, spans) as MLflow reads them; every trace must be whole."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    exp = mlflow.get_experiment_by_name("apps")
    traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list")
    assert all(any(s.name == "judge" for s in t.data.spans) for t in traces), "a trace was stored without its judge span"
    return len(traces), sum(len(t.data.spans) for t in traces)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=Path, default=DEFAULT_ROWS)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--topology", default="sequential_langgraph")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for both runs")
    args = ap.parse_args()
    import apps_bench

    with tempfile.TemporaryDirectory(prefix="trace_store_size_") as tmp:
        sizes, tables = {}, {}
        for mode in ("off", "on"):
            cwd = Path(tmp) / mode
            cwd.mkdir()
            run_cell(cwd, args, traces=mode == "on")
            copy = vacuumed(cwd / "outputs" / "mlflow.db")
            sizes[mode], tables[mode] = copy.stat().st_size, pages_by_table(copy)
        db = Path(tmp) / "on" / "outputs" / "mlflow.db"
        n, spans = traces_read_back(db)
        with sqlite3.connect(db) as c:
            (span_json,) = c.execute("select coalesce(sum(length(content)), 0) from spans").fetchone()
            page_size = c.execute("pragma page_size").fetchone()[0]
        split = span_json_split(db)
        artifacts = list((Path(tmp) / "on").rglob("traces.json"))
        artifact_bytes = sum(p.stat().st_size for p in artifacts)
    if not n:
        raise SystemExit("no trace was written")
    print(
        f"trace store size: {args.n} problems, model=gold, topology={args.topology}, {' '.join(args.set) or 'defaults'}; "
        f"apps_bench from {Path(apps_bench.__file__).parent}"
    )
    print(f"  traces {n}, spans {spans} ({spans / n:.0f} per trace)")
    print(f"  store per trace (VACUUMed, traces on - off)   {(sizes['on'] - sizes['off']) / n / 1000:8.1f} KB")
    print(f"    of it the spans' JSON                       {span_json / n / 1000:8.1f} KB")
    print(f"  traces also uploaded as traces.json artifacts {len(artifacts):8d}  ({artifact_bytes / n / 1000:.1f} KB per trace)")
    print(f"  where the bytes go, per trace (pages of {page_size} bytes, on - off):")
    growth = {
        k: (v[0] - tables["off"].get(k, (0, 0))[0], v[1] - tables["off"].get(k, (0, 0))[1]) for k, v in tables["on"].items()
    }
    for name, (size, unused) in sorted(growth.items(), key=lambda kv: -kv[1][0]):
        if size:
            print(f"    {name:42s} {size / n / 1000:8.2f} KB   (unused in its pages {unused / n / 1000:.2f} KB)")
    print(
        f"  the spans' JSON per trace: MLflow's own fields {split[0] / n / 1000:.1f} KB, our inputs and outputs "
        f"{split[1] / n / 1000:.1f} KB, our attributes {split[2] / n / 1000:.2f} KB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
