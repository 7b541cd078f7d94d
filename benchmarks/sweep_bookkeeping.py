#!/usr/bin/env python
"""Sweep bookkeeping: the tracking time each cell of a sweep spends, for sweeps of 8, 32, 128 cells.

A cell's bookkeeping is opening its MLflow run (found by its cell key, created, params logged)
and finishing it (metrics, tags, artifacts; on code before issue 22 also redrawing the sweep's
whole comparison from every finished sibling's records, under a lock). The sweep's own share is
the launching process's end of the sweep (publishing the comparison once), divided by the cells.
Per cell = the median over cells of open + finish, plus the sweep's end over the cells; a
worker's first cell is left out of the median (its open also imports mlflow and opens the
store, once per worker process: shown apart). Cost per cell is constant when the per-cell
figure stays flat as the sweep grows.

Each size is one real sweep through the CLI: `-m hydra/launcher=local_parallel seed=0..N-1` (joblib,
two cells at a time) of tiny gold cells (`dataset=demo limit=1`: one built-in problem, so the
cells' own work is small) into a fresh SQLite store. The times come from the cells themselves:
a `sitecustomize` on the sweep's PYTHONPATH (inherited by the joblib workers) wraps
`CellRun.open`, `CellRun.finish` and `SweepTracking._close` with a timer and appends one JSON line
per call to a log; nothing else changes.

Usage (from anywhere; PYTHONPATH picks the code measured, e.g. another checkout's):
  python benchmarks/sweep_bookkeeping.py [--sizes 8,32,128] [--n-jobs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMER = """
import json, os, time


def _log(what, seconds):
    line = json.dumps({"what": what, "s": seconds, "pid": os.getpid()}) + "\\n"
    fd = os.open(os.environ["BOOKKEEPING_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _timed(what, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _log(what, time.perf_counter() - t0)
    return wrapper


try:
    from apps_bench.tracking import mlflow as _m
    from apps_bench.tracking import callbacks as _cb

    _m.CellRun.open = classmethod(_timed("open", _m.CellRun.open.__func__))
    _m.CellRun.finish = _timed("finish", _m.CellRun.finish)
    _cb.SweepTracking._close = _timed("sweep_end", _cb.SweepTracking._close)
except ImportError:
    pass
"""


def run_sweep(n: int, work: Path, n_jobs: int) -> dict[str, float]:
    """One sweep of `n` tiny gold cells; -> its per-cell bookkeeping figures (seconds)."""
    work.mkdir(parents=True)
    (work / "timer").mkdir()
    (work / "timer" / "sitecustomize.py").write_text(TIMER)
    log = work / "bookkeeping.jsonl"
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(work / "timer"), env.get("PYTHONPATH", "")) if p),
        BOOKKEEPING_LOG=str(log),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    env.pop("APPS_BENCH_PARENT_RUN_ID", None)
    cmd = [
        sys.executable,
        "-m",
        "apps_bench",
        "-m",
        "hydra/launcher=local_parallel",
        f"hydra.launcher.n_jobs={n_jobs}",
        f"seed=range(0,{n})",
        "model=gold",
        "dataset=demo",
        "limit=1",
        "allow_any_cell=true",
        "progress=false",
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"sweep of {n} cells failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    cells: list[tuple[float, float]] = []  # (open, finish) of each cell, paired in each worker's order
    first_opens = []
    for pid in sorted({c["pid"] for c in calls if c["what"] == "open"}):
        mine = [c for c in calls if c["pid"] == pid and c["what"] in ("open", "finish")]
        opens, finishes = [c["s"] for c in mine if c["what"] == "open"], [c["s"] for c in mine if c["what"] == "finish"]
        first_opens.append(opens[0])  # a worker's first cell also imports mlflow and opens the store
        cells += list(zip([0.0] + opens[1:], finishes))
    end = sum(c["s"] for c in calls if c["what"] == "sweep_end")
    if len(cells) != n:
        sys.exit(f"sweep of {n} cells: timed {len(cells)} cells (is the timer on PYTHONPATH?)")
    later = [(o, f) for o, f in cells if o > 0.0]  # cells that were not their worker's first
    return {
        "cells": n,
        "workers": len(first_opens),
        "first_open_s": statistics.median(first_opens),
        "open_median_s": statistics.median(o for o, _ in later),
        "finish_median_s": statistics.median(f for _, f in cells),
        "finish_max_s": max(f for _, f in cells),
        "sweep_end_s": end,
        "per_cell_s": statistics.median(o + f for o, f in later) + end / n,
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="8,32,128", help="sweep sizes (cells), comma-separated")
    ap.add_argument("--n-jobs", type=int, default=2, help="cells at once (joblib)")
    ap.add_argument("--keep", type=Path, help="keep the sweeps' folders here (default: a temp dir)")
    args = ap.parse_args()
    import apps_bench

    print(f"code measured: {Path(apps_bench.__file__).parent}", file=sys.stderr)
    root = args.keep or Path(tempfile.mkdtemp(prefix="sweep-bookkeeping-"))
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        row = run_sweep(n, root / f"n{n}", args.n_jobs)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(
        "| cells | per cell (s) | open (median s) | finish (median s) | finish (max s) | sweep end (s) | "
        "worker's first open (median s) | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['cells']} | {r['per_cell_s']:.3f} | {r['open_median_s']:.3f} | {r['finish_median_s']:.3f} | "
            f"{r['finish_max_s']:.3f} | {r['sweep_end_s']:.2f} | {r['first_open_s']:.1f} | {r['wall_s']:.0f} |"
        )
    first, last = rows[0]["per_cell_s"], rows[-1]["per_cell_s"]
    print(f"\nper-cell bookkeeping at {rows[-1]['cells']} cells / at {rows[0]['cells']} cells: {last / first:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
