#!/usr/bin/env python
"""The harness's own CPU per model call, per topology: what decides how many agents one node
can drive against a fast server.

For each topology, two gold cells of different sizes (`--sizes`, problems of train_mini150) run
(at zero added latency unless `--latency-ms`) in one process (`processes=1`) against one gold server started apart
(`python -m apps_bench.models.gold`), so its CPU is read from its own process (/proc) and
reported apart. The cell's CPU is that of the whole command and every process it waited for (the
sandbox's children included: the judge is part of the harness), as `wait4` reports it. Per call
= (CPU of the big cell - CPU of the small one) / (model calls of the big - of the small): the
start-up (imports, store, forkserver) cancels out. A cell's start-up CPU still varies by a few
tenths of a second from run to run, which over the few dozen calls between the sizes is several
ms per call: `--repeat N` runs each size N times, interleaved, and takes the medians.

`TCP opens/call`: connections opened per model call in the big cell (this machine's ActiveOpens
counter around it: run it on a quiet machine). `--latency-ms` gives the server a reply time, as a
real model has: with none, replies come faster than the harness sends, and the cell's connection
pool holds mostly idle connections.

Usage (from anywhere):
  python benchmarks/harness_cpu.py [--sizes 6 24] [--repeat 1] [--topology single ...] [--rows FILE] [--latency-ms 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import free_port, proc_cpu, run_timed  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"
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


def tcp_opens() -> int:
    """TCP connections this machine has opened (/proc/net/snmp ActiveOpens): around a cell, on a quiet
    machine, the connections its clients opened to the server."""
    head, values = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Tcp:")]
    return int(values[head.index("ActiveOpens")])


def run_cell(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    """CPU seconds of the command and its waited-for descendants."""
    return run_timed([sys.executable, "-m", "apps_bench", *args], cwd, env)[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, default=DEFAULT_ROWS)
    ap.add_argument("--sizes", type=int, nargs=2, default=[6, 24], metavar=("SMALL", "BIG"))
    ap.add_argument("--topology", nargs="+", default=list(TOPOLOGIES))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each size, interleaved; medians count")
    ap.add_argument("--latency-ms", type=int, default=0, help="the gold server's reply time")
    args = ap.parse_args()
    small, big = args.sizes
    work = Path(tempfile.mkdtemp(prefix="harness_cpu_"))
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    env.pop("APPS_BENCH_PARENT_RUN_ID", None)
    port = free_port()
    gold = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apps_bench.models.gold",
            "--rows",
            str(args.rows),
            "--split",
            "train",
            "--port",
            str(port),
            "--latency-ms",
            str(args.latency_ms),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=work,
    )
    try:
        gold.stdout.readline()  # its banner: serving
        base = [
            "model=gold",
            f"model.base_url=http://127.0.0.1:{port}/v1",
            "dataset=apps",
            f"dataset.path={args.rows}",
            "dataset.split=train",
            "processes=1",
            "progress=false",
            "allow_any_cell=true",
        ]
        run_cell([*base, "limit=1", "out_dir=warm"], work, env)  # the store's migrations, once
        rows = []
        print(
            f"{'topology':<24}{'calls':>12}{'harness ms/call':>17}{'gold ms/call':>14}{'harness ms/problem':>20}{'TCP opens/call':>16}",
            flush=True,
        )
        for topo in args.topology:
            runs: dict[int, list[tuple[float, float, int]]] = {small: [], big: []}
            for i in range(args.repeat):
                for n in (small, big):
                    out = work / f"{topo}-{n}-{i}"
                    g0, t0 = proc_cpu(gold.pid), tcp_opens()
                    cpu = run_cell([*base, f"topology={topo}", f"limit={n}", f"out_dir={out}"], work, env)
                    g1, t1 = proc_cpu(gold.pid), tcp_opens()
                    s = json.loads((out / "summary.json").read_text())
                    runs[n].append((cpu, g1 - g0, s["usage"]["model_calls"], t1 - t0))
            seen = {
                n: (statistics.median(r[0] for r in runs[n]), statistics.median(r[1] for r in runs[n]), runs[n][0][2])
                for n in runs
            }
            assert all(r[2] == seen[n][2] for n in runs for r in runs[n]), f"{topo}: model calls differ between runs"
            d_calls = seen[big][2] - seen[small][2]
            harness = (seen[big][0] - seen[small][0]) / d_calls * 1000
            server = (seen[big][1] - seen[small][1]) / d_calls * 1000
            per_problem = (seen[big][0] - seen[small][0]) / (big - small) * 1000  # the judge's share is per problem
            opens = statistics.median(r[3] for r in runs[big]) / seen[big][2]
            rows.append(
                {
                    "topology": topo,
                    "calls": [seen[small][2], seen[big][2]],
                    "harness_ms": harness,
                    "gold_ms": server,
                    "harness_ms_per_problem": per_problem,
                    "tcp_opens_per_call": opens,
                }
            )
            print(
                f"{topo:<24}{seen[small][2]:>5} -> {seen[big][2]:<5}{harness:>14.1f}{server:>14.1f}{per_problem:>20.0f}"
                f"{opens:>16.2f}",
                flush=True,
            )
        print(
            f"(sizes {small} and {big} problems, median of {args.repeat}, server latency {args.latency_ms} ms; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
        )
        (work / "harness_cpu.json").write_text(json.dumps(rows, indent=1))
        print(f"table: {work / 'harness_cpu.json'}")
    finally:
        gold.terminate()
        gold.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
