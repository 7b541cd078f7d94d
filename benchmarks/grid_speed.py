#!/usr/bin/env python
"""Grid speed: the whole `python -m apps_bench` command at the default concurrency vs
`concurrency=1`, in the same run, on the same cell (model=gold model.gold.latency_ms=500,
100 problems of train_mini150, the single LangGraph runner), whole command and problems
phase (first problem started -> last recorded, from the records); a multi-agent topology
(sequential_langgraph) in one process vs the default; `--help`; the no-arg demo.

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
DEFAULT_ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"  # the vendored rows


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
        cwd=work,
        env=env,
        check=True,
    )

    base = [
        py,
        "-m",
        "apps_bench",
        "dataset=apps",
        f"dataset.path={args.rows}",
        "dataset.split=train",
        f"limit={args.n}",
        "model=gold",
        f"model.gold.latency_ms={args.latency_ms}",
        "progress=false",
    ]

    def cell(label: str, extra: list[str], i: int) -> tuple[float, dict, Path]:
        tag = f"{label.replace('=', '_').replace(' ', '_')}_{i}"  # own folder and experiment: a fresh cell and run each time
        cmd = base + extra + [f"out_dir={work / tag}", f"tracking.experiment=grid_speed_{tag}"]
        dt, r = timed(cmd, work, env)
        if r.returncode != 0:
            raise SystemExit(f"{label} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        summary = json.loads((work / tag / "summary.json").read_text())
        print(
            f"{label:>28}: {dt:7.1f} s  pass@1 {summary['pass_at_1']:.3f}  model calls {summary['usage']['model_calls']}  "
            f"problems {summary['n_recorded']}  solving processes {summary['run']['solvers']}",
            flush=True,
        )
        return dt, summary, work / tag

    # the default command `--repeat` times (this machine's timings vary by ~10% run to run;
    # the median counts), the concurrency=1 command once, in between
    single = ["topology=single"]
    runs: dict[str, list[tuple[float, dict, Path]]] = {"default": [], "concurrency=1": []}
    plan = [("default", single)] * ((args.repeat + 1) // 2) + [("concurrency=1", [*single, "concurrency=1"])]
    plan += [("default", single)] * (args.repeat // 2)
    for i, (label, extra) in enumerate(plan):
        runs[label].append(cell(label, extra, i))
    # a multi-agent topology: one process vs the default (workers on every usable CPU)
    seq = ["topology=sequential_langgraph"]
    seq_runs = {
        "sequential processes=1": cell("sequential processes=1", [*seq, "processes=1"], 0),
        "sequential default": cell("sequential default", seq, 0),
    }
    # the no-arg demo, in a folder of its own whose store already exists
    demos = []
    for i in range(3):
        d = work / f"demo_{i}"
        d.mkdir(exist_ok=True)
        denv = _env(d / "outputs" / "mlflow.db")
        (d / "outputs").mkdir(exist_ok=True)
        subprocess.run(
            [py, "-c", "from apps_bench.tracking import mlflow as m; m.client(m.tracking_uri())"], cwd=d, env=denv, check=True
        )
        dt, r = timed([py, "-m", "apps_bench"], d, denv)
        assert r.returncode == 0, r.stderr[-3000:]
        demos.append(dt)

    median = {k: sorted(v, key=lambda x: x[0])[len(v) // 2] for k, v in runs.items()}
    t_default, t_one = median["default"][0], median["concurrency=1"][0]
    same = {x[1]["pass_at_1"] for v in runs.values() for x in v}
    spread = [x[0] for x in runs["default"]]
    print()
    print(
        f"grid speed ({args.n} problems, gold latency {args.latency_ms} ms/call, single runner; load {os.getloadavg()[0]:.1f}):"
    )
    print(f"  concurrency=1      {t_one:7.1f} s")
    print(
        f"  default ({median['default'][1]['run']['concurrency']})       {t_default:7.1f} s   "
        f"(median of {len(spread)}: {', '.join(f'{x:.1f}' for x in spread)})"
    )
    print(f"  whole-command ratio {t_one / t_default:6.1f}x   ({t_one / max(spread):.1f}x against the slowest default run)")
    print(f"  same pass@1        {len(same) == 1}")

    def problems_phase(out: Path) -> float:
        """First problem started -> last recorded, from the records' own timestamps."""
        recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]
        return max(r["completed_at"] for r in recs) - min(r["completed_at"] - r["latency_s"] for r in recs)

    phase = {}
    for label, (dt, _, out) in median.items():
        phase[label] = problems_phase(out)
        print(f"  {label:>15} problems phase {phase[label]:6.1f} s, fixed costs {dt - phase[label]:5.1f} s")
    print(f"  problems-phase ratio {phase['concurrency=1'] / phase['default']:5.1f}x   (target >= 15x)")
    one, dflt = seq_runs["sequential processes=1"], seq_runs["sequential default"]
    p1, pd = problems_phase(one[2]), problems_phase(dflt[2])
    print(
        f"sequential_langgraph, default concurrency: processes=1 {one[0]:.1f} s (problems {p1:.1f} s) vs default "
        f"{dflt[0]:.1f} s (problems {pd:.1f} s, {dflt[1]['run']['solvers']} processes): {p1 / pd:.2f}x problems phase, "
        f"{one[0] / dflt[0]:.2f}x whole command"
    )
    print(f"--help: median {statistics.median(helps):.3f} s over {len(helps)} runs (target < 1 s)")
    print(
        f"no-arg demo: median {statistics.median(demos):.1f} s over {len(demos)} runs ({', '.join(f'{x:.1f}' for x in demos)}; target < 15 s)"
    )
    print(f"outputs: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
