"""Every topology on model=local (llama-cpp-python + SmolLM2-135M), 2 real APPS rows each,
through the real CLI; prints the per-topology table of docs/benchmarks.md (wall time, calls, tokens,
tool calls, finish reasons, pass@1) from each cell's summary.json.

    python benchmarks/local_topologies.py [--rows tests/fixtures/apps/test_more.jsonl] [--limit 2]

Needs the `local` extra. Each cell runs in a fresh scratch directory (its own MLflow store).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
ROOT = Path(__file__).resolve().parents[1]


def run(topology: str, rows: Path, limit: int, work: Path) -> dict:
    cwd = work / topology
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "apps_bench",
        "model=local",
        f"topology={topology}",
        "dataset=apps",
        f"dataset.path={rows}",
        f"limit={limit}",
        "progress=false",
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    (summary_path,) = (cwd / "outputs" / "cells").glob("*/summary.json")
    s = json.loads(summary_path.read_text())
    return {"topology": topology, "exit": out.returncode, "wall_s": wall, "summary": s, "tail": out.stdout[-1500:]}


def row(r: dict) -> str:
    s, u = r["summary"], r["summary"]["usage"]
    finish = ", ".join(f"{k} {v}" for k, v in sorted((s.get("finish_reasons") or {}).items())) or "-"
    return (
        f"| `{r['topology']}` | {r['exit']} | {r['wall_s']:.0f} | {u['model_calls']} | {u['prompt_tokens']} + {u['completion_tokens']} "
        f"| {u['tool_calls']} | {u['requests_with_tools']} | {finish} | {s['n_errors']} | {s['pass_at_1']:.2f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=Path, default=ROOT / "tests" / "fixtures" / "apps" / "test_more.jsonl")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=list(TOPOLOGIES))
    args = ap.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    work = Path(tempfile.mkdtemp(prefix="apps-bench-local-"))
    print(
        "| topology | exit | wall s | model calls | tokens (prompt + completion) | tool calls | requests with `tools` | finish reasons | errors | pass@1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in args.only:
        r = run(t, args.rows.resolve(), args.limit, work)
        print(row(r), flush=True)
        for w in r["summary"].get("warnings") or ():
            print(f"<!-- {t}: WARNING {w} -->", flush=True)
    print(f"<!-- outputs under {work} -->")


if __name__ == "__main__":
    main()
