#!/usr/bin/env python
"""A study at its real size: 24 cells x 5,000 problems, synthesised from real gold cells, and what
the harness costs on it.

1. A synthetic APPS file of --problems rows (the vendored rows copied under new ids).
2. A real gold cell of --seed-problems of them (`sequential_langgraph`: transcripts, 14-span traces)
   in a fresh SQLite store: its store per trace (the trace tables' pages in a VACUUMed copy, less an
   empty store's).
3. The study: --cells copies of that cell's folder (records.jsonl, transcripts.jsonl, cell.json,
   summary.json), each under a new key and axes (8 topologies x seeds), its problems renumbered so
   every cell holds the same --problems problem keys.
4. `python -m apps_bench.report --cells-dir` over the study: CPU per record, peak RSS (the largest
   process of its tree, from wait4), wall.
5. `python -m apps_bench.plan` of a 24-cell sweep (8 topologies x seeds 0-2) on the synthetic file,
   beside an empty outputs/cells and beside the study's records (none of them the planned cells').
6. A real gold `single` cell of all --problems problems, traces on (MLflow's export on one worker):
   traces in the store == problems; then the same command again: its time to say there is nothing
   left to run, and whether the rerun wrote anything to the MLflow store (its rows and artifacts).
7. `report.stats.mcnemar_exact` at --pairs discordant pairs (lopsided: 60/40).

Run it with another checkout on PYTHONPATH to measure that code (the output names the apps_bench
it imported). Full size takes about 10 minutes on 2 busy cores; `--cells 2 --problems 20
--seed-problems 5` is a quick run.

Usage: python benchmarks/study_scale.py [--cells 24] [--problems 5000] [--seed-problems 50] [--pairs 15000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"
TOPOLOGIES = (
    "single",
    "independent",
    "sequential_langgraph",
    "sequential_crewai",
    "centralized_langgraph",
    "centralized_autogen",
    "decentralized_langgraph",
    "decentralized_openai",
)
TRACE_TABLES = ("spans", "trace_info", "trace_tags", "trace_request_metadata", "assessments", "trace_metrics", "span_metrics")


@dataclass
class Measured:
    wall_s: float
    cpu_s: float  # user + system of the command and its waited-for descendants
    peak_rss_mb: float  # the largest resident set among them
    out: str


def measure(cmd: list[str], cwd: Path) -> Measured:
    """Run `cmd` (a failure stops the benchmark) and measure it with wait4's usage of that child alone."""
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    for name in ("MLFLOW_TRACKING_URI", "APPS_BENCH_PARENT_RUN_ID"):
        env.pop(name, None)
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{text[-3000:]}")
    return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def synthetic_rows(dest: Path, n: int) -> None:
    """`n` APPS rows: the vendored rows in turn, problem ids 0..n-1."""
    rows = [json.loads(x) for x in ROWS.read_text().splitlines() if x.strip()]
    with dest.open("w") as f:
        for i in range(n):
            f.write(json.dumps({**rows[i % len(rows)], "problem_id": i}) + "\n")


def cell_args(rows: Path, n: int, topology: str, *extra: str) -> list[str]:
    return [
        "model=gold",
        "dataset=apps",
        f"dataset.path={rows}",
        "dataset.split=train",
        f"limit={n}",
        f"topology={topology}",
        "progress=false",
        *extra,
    ]


def trace_bytes(db: Path) -> int:
    """The pages of the trace tables and their indexes, in a VACUUMed copy of `db` (SQLite's dbstat)."""
    copy = db.with_name(db.stem + ".vacuumed.db")
    copy.unlink(missing_ok=True)
    with sqlite3.connect(db) as src:
        src.execute(f"VACUUM INTO '{copy}'")
    with sqlite3.connect(copy) as c:
        names = [n for (n,) in c.execute(f"select name from sqlite_master where tbl_name in {TRACE_TABLES}")]
        (size,) = c.execute(f"select sum(pgsize) from dbstat where name in ({','.join('?' * len(names))})", names).fetchone()
    copy.unlink()
    return int(size)


def traces_in(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return int(c.execute("select count(*) from trace_info").fetchone()[0])


def store_state(cwd: Path) -> str:
    """A digest of what the MLflow store holds for the runs (rows, not SQLite's bookkeeping) and of its artifacts."""
    h = hashlib.sha256()
    with sqlite3.connect(cwd / "outputs" / "mlflow.db") as c:
        for table in ("runs", "tags", "params", "metrics", "latest_metrics", "trace_info", "spans"):
            for row in c.execute(f"select * from {table} order by 1, 2"):
                h.update(repr(row).encode())
    for p in sorted((cwd / "mlruns").rglob("*")) if (cwd / "mlruns").exists() else []:
        if p.is_file():
            st = p.stat()
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def synthesise_study(seed_cell: Path, cells_dir: Path, cells: int, problems: int) -> int:
    """`cells` copies of `seed_cell` under new keys and axes, each with the same `problems` problem keys
    (the seed's records in turn, renumbered); -> the records written."""
    info = json.loads((seed_cell / "cell.json").read_text())
    records = [json.loads(x) for x in (seed_cell / "records.jsonl").read_text().splitlines() if x.strip()]
    transcripts = {d["key"]: d for d in map(json.loads, (seed_cell / "transcripts.jsonl").read_text().splitlines())}
    written = 0
    for c in range(cells):
        topology, seed = TOPOLOGIES[c % len(TOPOLOGIES)], c // len(TOPOLOGIES)
        key = hashlib.sha256(f"study_scale/{c}".encode()).hexdigest()[:12]
        cell = {**info, "key": key, "axes": {**info["axes"], "topology": topology, "seed": seed}}
        cell["identity"] = {
            **info["identity"],
            "seed": seed,
            "limit": problems,
            "topology": {**info["identity"]["topology"], "name": topology},
        }
        d = cells_dir / f"apps-{topology}-gold-none-s{seed}-{key}"
        d.mkdir(parents=True)
        (d / "cell.json").write_text(json.dumps(cell, indent=2))
        if (seed_cell / "summary.json").exists():
            shutil.copy(seed_cell / "summary.json", d / "summary.json")
        with (d / "records.jsonl").open("w") as rf, (d / "transcripts.jsonl").open("w") as tf:
            for i in range(problems):
                src = records[i % len(records)]
                new = {"key": f"train/{i}", "id": str(i)}
                rf.write(json.dumps({**src, **new, "cell": key}) + "\n")
                t = transcripts.get(src["key"])
                if t is not None:
                    tf.write(json.dumps({**t, **new}) + "\n")
                written += 1
    return written


def mcnemar_time(pairs: int) -> tuple[float, float]:
    """(seconds, p) of report.stats.mcnemar_exact on `pairs` discordant pairs split 60/40; the best of 5."""
    from apps_bench.report import stats

    b, best, p = pairs * 6 // 10, float("inf"), 1.0
    for _ in range(5):
        t0 = time.perf_counter()
        p = stats.mcnemar_exact(b, pairs - b)
        best = min(best, time.perf_counter() - t0)
    return best, float(p)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--cells", type=int, default=24, help="cells in the synthetic study (default 24)")
    ap.add_argument("--problems", type=int, default=5000, help="problems per cell, and of the real single cell (default 5000)")
    ap.add_argument("--seed-problems", type=int, default=50, help="problems of the real sequential cell copied (default 50)")
    ap.add_argument("--pairs", type=int, default=15000, help="discordant pairs for McNemar (default 15000)")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary folder, removed)")
    args = ap.parse_args()
    if min(args.cells, args.problems, args.seed_problems, args.pairs) < 1:
        ap.error("--cells, --problems, --seed-problems and --pairs are at least 1")
    import apps_bench

    work = args.keep or Path(tempfile.mkdtemp(prefix="study_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, work, Path(apps_bench.__file__).parent)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, code: Path) -> int:
    n, cells = args.problems, args.cells
    rows = work / "rows.jsonl"
    synthetic_rows(rows, max(n, args.seed_problems))
    print(f"study scale: {cells} cells x {n} problems; apps_bench from {code}")

    seed_cwd, empty_cwd = work / "seed", work / "empty_store"
    for d in (seed_cwd, empty_cwd):
        d.mkdir()
    measure(cli("apps_bench", *cell_args(rows, args.seed_problems, "sequential_langgraph", "tracking.traces=true")), seed_cwd)
    measure(
        [
            sys.executable,
            "-c",
            "import sys; from apps_bench.tracking import mlflow as m; m.client(sys.argv[1])",
            f"sqlite:///{empty_cwd / 'mlflow.db'}",
        ],
        empty_cwd,
    )
    traced = traces_in(seed_cwd / "outputs" / "mlflow.db")
    per_trace = (trace_bytes(seed_cwd / "outputs" / "mlflow.db") - trace_bytes(empty_cwd / "mlflow.db")) / max(traced, 1)
    artifacts = len(list(seed_cwd.rglob("traces.json")))
    print(
        f"  store per trace (sequential_langgraph, {traced} traces)   {per_trace / 1000:9.1f} KB   traces.json artifacts {artifacts}"
    )

    study = work / "study"
    [seed_cell] = [p.parent for p in (seed_cwd / "outputs" / "cells").glob("*/cell.json")]
    records = synthesise_study(seed_cell, study / "outputs" / "cells", cells, n)
    tbytes = sum(p.stat().st_size for p in (study / "outputs" / "cells").glob("*/transcripts.jsonl"))
    print(f"  study: {cells} cells, {records} records, transcripts {tbytes / 1e6:.0f} MB")

    rep = measure(cli("apps_bench.report", "--cells-dir", str(study / "outputs" / "cells")), study)
    print(
        f"  report from the folders   CPU {rep.cpu_s:7.1f} s ({rep.cpu_s / records * 1000:.3f} ms per record)   "
        f"peak RSS {rep.peak_rss_mb:6.0f} MB   wall {rep.wall_s:6.1f} s"
    )

    sweep = ["-m", f"topology={','.join(TOPOLOGIES)}", "seed=0,1,2", *cell_args(rows, n, "single")[:-2]]
    (work / "plan_empty").mkdir()
    empty = measure(cli("apps_bench.plan", *sweep), work / "plan_empty")
    beside = measure(cli("apps_bench.plan", *sweep), study)
    print(f"  plan of 24 cells, beside 0 records          CPU {empty.cpu_s:6.2f} s   wall {empty.wall_s:6.2f} s")
    print(f"  plan of 24 cells, beside {records} records  CPU {beside.cpu_s:6.2f} s   wall {beside.wall_s:6.2f} s")

    cell_cwd = work / "single"
    cell_cwd.mkdir()
    env_workers = os.environ.get("MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS", "1 (set by the cell)")
    single = cell_args(rows, n, "single", "tracking.traces=true")
    first = measure(cli("apps_bench", *single), cell_cwd)
    db = cell_cwd / "outputs" / "mlflow.db"
    print(
        f"  single cell, {n} problems, traces on: CPU {first.cpu_s:.1f} s ({first.cpu_s / n * 1000:.1f} ms per problem), "
        f"peak RSS {first.peak_rss_mb:.0f} MB, wall {first.wall_s:.1f} s"
    )
    print(
        f"    traces in the store {traces_in(db)} of {n} problems (export workers: {env_workers}); "
        f"traces.json artifacts {len(list(cell_cwd.rglob('traces.json')))}"
    )
    before = store_state(cell_cwd)
    again = measure(cli("apps_bench", *single), cell_cwd)
    said = next((x.strip() for x in again.out.splitlines() if "to run" in x or "nothing" in x.lower()), "(no such line)")
    print(f"  rerun of the finished cell: wall {again.wall_s:.2f} s, CPU {again.cpu_s:.2f} s; it said: {said}")
    print(
        f"    MLflow store after the rerun: {'unchanged' if store_state(cell_cwd) == before else 'CHANGED (the rerun wrote to it)'}"
    )

    secs, p = mcnemar_time(args.pairs)
    print(f"  McNemar exact at {args.pairs} discordant pairs (60/40): {secs * 1000:.3f} ms, p = {p:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
