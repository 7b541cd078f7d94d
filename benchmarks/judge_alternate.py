#!/usr/bin/env python
"""The judge command's whole time in two or more source trees, run alternately.

Each round runs `python -m apps_bench.judge ROWS --gold --max-tests-per-row 0` once per tree (that tree's
code on PYTHONPATH, this interpreter and its packages for all), so a change in the machine's load during
the measurement weighs on every tree alike. Prints per tree the median wall time and the median CPU time
(user + sys) of the command and its sandbox workers together and apart (the command's own is what it
used when it exits, the workers' the rest), with each run's wall times. Under load CPU compares across
trees where wall time does not.

Usage (from the repo root; a tree of an older commit: `git worktree add /tmp/eb eb39394`):
  python benchmarks/judge_alternate.py /tmp/eb . [--rows ROWS] [--rounds 12]
ROWS defaults to tests/fixtures/apps/train_mini150.jsonl.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from time import perf_counter

REPO = Path(__file__).resolve().parents[1]


# `python -m apps_bench.judge ...`, and on the way out the command's own CPU time on fd {fd}.
_COMMAND = (
    "import atexit, os, resource, runpy\n"
    "def _own():\n"
    "    r = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    os.write({fd}, repr(r.ru_utime + r.ru_stime).encode())\n"
    "atexit.register(_own)\n"
    "runpy.run_module('apps_bench.judge', run_name='__main__', alter_sys=True)\n"
)


def run_once(tree: Path, rows: Path) -> tuple[float, float, float]:
    """(wall, user + sys CPU of the command and its workers, of the command alone) of one judge command
    with `tree` on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    own_r, own_w = os.pipe()
    cmd = [
        sys.executable,
        "-c",
        _COMMAND.format(fd=own_w),
        str(rows),
        "--gold",
        "--max-tests-per-row",
        "0",
        "--split",
        "train",
        "--no-progress",
        "--out",
        os.devnull,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, pass_fds=(own_w,))
    wall = perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.close(own_w)
    with os.fdopen(own_r) as f:
        own = f.read()
    if proc.returncode != 0 or not own:
        raise SystemExit(f"error: the judge command in {tree} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), float(own)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", type=Path, help="source trees (each holds apps_bench/)")
    ap.add_argument("--rows", type=Path, default=REPO / "tests/fixtures/apps/train_mini150.jsonl")
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    missing = [str(t) for t in trees if not (t / "apps_bench" / "judge" / "cli.py").is_file()]
    if missing or not args.rows.is_file():
        print(
            f"error: {', '.join(missing) or args.rows}: not a source tree with apps_bench/judge (or the rows file is missing)",
            file=sys.stderr,
        )
        return 2
    runs: dict[Path, list[tuple[float, float, float]]] = {t: [] for t in trees}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for _ in range(args.rounds):
        for tree in trees:
            runs[tree].append(run_once(tree, args.rows.resolve()))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for tree, got in runs.items():
        walls = sorted(w for w, _, _ in got)
        print(
            f"{str(tree):<40} wall median {statistics.median(walls):.2f} s (min {walls[0]:.2f}, max {walls[-1]:.2f}); "
            f"CPU median {statistics.median(c for _, c, _ in got):.3f} s (command {statistics.median(o for *_, o in got):.3f}, "
            f"workers {statistics.median(c - o for _, c, o in got):.3f}); runs {', '.join(f'{w:.2f}' for w, _, _ in got)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
