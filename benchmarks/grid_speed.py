#!/usr/bin/env python
"""Grid speed: the whole `python -m apps_bench` command at the default concurrency vs
`concurrency=1`, in the same run, on the same cell (model=gold model.latency_ms=500,
100 problems of train_mini150, the single LangGraph runner); plus `--help` time.

Each command is timed end to end (interpreter start, imports, config, loading, gold
server, sandbox pool, every problem, summary, MLflow logging). The default command runs
`--repeat` times around the concurrency=1 run and its median counts: this machine's
timings vary by about 10% between identical runs. The two commands write
to separate output folders and separate MLflow experiments of one store; the store is
created once beforehand (as it exists after a user's first run), so neither command
pays the one-time SQLite migrations.

Usage (from anywhere):
  python benchmarks/grid_speed.py [--rows FILE] [--n 100] [--latency-ms 500] [--repeat 3] [--keep DIR]
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

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = REPO.parent / "shared" / "data" / "apps" / "train_mini150.jsonl"


def _env(store: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        MLFLOW_TRACKING_URI=f"sqlite:///{store}",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return time.perf_counter() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=DEFAULT_ROWS)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--latency-ms", type=int, default=500)
    ap.add_argument("--keep", type=Path, help="keep outputs in this folder (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the default command; the median counts")
    args = ap.parse_args()
    if not args.rows.exists():
        print(f"rows not found: {args.rows}", file=sys.stderr)
        return 2

    work = args.keep or Path(tempfile.mkdtemp(prefix="grid_speed_"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "mlflow.db"
    env = _env(store)
    py = sys.executable

    # --help
    helps = []
    for _ in range(5):
        dt, r = timed([py, "-m", "apps_bench", "--help"], work, env)
        assert r.returncode == 0, r.stderr
        helps.append(dt)

    # the store exists before the timed commands (as after a user's first run)
    subprocess.run(
        [py, "-c", "from apps_bench.tracking import mlflow as m; m.client(m.tracking_uri())"],
        cwd=work, env=env, check=True,
    )

    base = [
        py, "-m", "apps_bench", "dataset=apps", f"dataset.path={args.rows}", "dataset.split=train",
        f"limit={args.n}", "model=gold", f"model.latency_ms={args.latency_ms}", "topology=single", "progress=false",
    ]
    # the default command `--repeat` times (this machine's timings vary by ~10% run to run;
    # the median counts), the concurrency=1 command once, in between
    runs: dict[str, list[tuple[float, dict, Path]]] = {"default": [], "concurrency=1": []}
    plan = [("default", [])] * ((args.repeat + 1) // 2) + [("concurrency=1", ["concurrency=1"])]
    plan += [("default", [])] * (args.repeat // 2)
    for i, (label, extra) in enumerate(plan):
        tag = f"{'c1' if extra else 'default'}_{i}"  # own folder and experiment: a fresh cell and run each time
        cmd = base + extra + [f"out_dir={work / tag}", f"tracking.experiment=grid_speed_{tag}"]
        dt, r = timed(cmd, work, env)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            return 1
        summary = json.loads((work / tag / "summary.json").read_text())
        runs[label].append((dt, summary, work / tag))
        print(f"{label:>15}: {dt:7.1f} s  pass@1 {summary['pass_at_1']:.3f}  "
              f"model calls {summary['usage']['model_calls']}  problems {summary['n_recorded']}  "
              f"solving processes {summary['run']['solvers']}", flush=True)

    median = {k: sorted(v, key=lambda x: x[0])[len(v) // 2] for k, v in runs.items()}
    t_default, t_one = median["default"][0], median["concurrency=1"][0]
    same = {x[1]["pass_at_1"] for v in runs.values() for x in v}
    spread = [x[0] for x in runs["default"]]
    print()
    print(f"grid speed ({args.n} problems, gold latency {args.latency_ms} ms/call, single runner):")
    print(f"  concurrency=1      {t_one:7.1f} s")
    print(f"  default ({median['default'][1]['run']['concurrency']})       {t_default:7.1f} s   "
          f"(median of {len(spread)}: {', '.join(f'{x:.1f}' for x in spread)})")
    print(f"  ratio              {t_one / t_default:7.1f}x   (target >= 10x; "
          f"{t_one / max(spread):.1f}x against the slowest default run)")
    print(f"  same pass@1        {len(same) == 1}")
    # where the whole-command ratio goes: the problems phase (first to last completed problem,
    # plus one problem's latency) against the fixed costs both commands pay (interpreter,
    # framework imports, gold server, sandbox, summary, MLflow)
    phase = {}
    for label, (dt, _, out) in median.items():
        recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]
        done = sorted(r["completed_at"] for r in recs)
        first = min(recs, key=lambda r: r["completed_at"])
        phase[label] = done[-1] - done[0] + first["latency_s"]
        print(f"  {label:>15} problems phase {phase[label]:6.1f} s, fixed costs {dt - phase[label]:5.1f} s")
    print(f"  problems-phase ratio {phase['concurrency=1'] / phase['default']:5.1f}x")
    print(f"--help: median {statistics.median(helps):.3f} s over {len(helps)} runs (target < 1 s)")
    print(f"outputs: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
