#!/usr/bin/env python
"""Optimizer cost report: rollouts, tokens and wall time per method at a fixed budget.

For each method (none, maspo, gepa) run one optimizer cell on `sequential_langgraph`
with the gold model as task model and as optimizer model (gold's tagged rewrite), with
per-call latency on, the same pool, splits and rollout budget, and report: rollouts
charged against the budget and the overshoot, fresh rollouts, task-model tokens charged
(spent) and replayed from the run's cache (partial re-runs; not charged), optimizer-model
calls and tokens (counted apart), the val re-scoring's rollouts and tokens (not charged),
val scores of seed and chosen prompts, and wall time (also as a ratio to `none`, which
only scores the seed on val). Each method runs in a fresh output directory (no cache
reuse). The table is printed as Markdown (docs/benchmarks.md, 'Optimizer cost', holds one).

Usage (from the repo root):
  python benchmarks/optimizer_cost.py [--budget 60] [--latency-ms 50] [--train 8] [--val 4] [--out DIR]
Rows: tests/fixtures/apps/train_mini150.jsonl (pool) and test_0-49_partial.jsonl (eval rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO / "tests" / "fixtures" / "apps"  # the vendored rows


def compose(overrides: list[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from apps_bench.config.schema import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return hcompose("config", overrides=overrides)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=60, help="rollout cap per method")
    ap.add_argument("--latency-ms", type=int, default=50, help="gold model latency per call")
    ap.add_argument("--train", type=int, default=8)
    ap.add_argument("--val", type=int, default=4)
    ap.add_argument("--methods", default="none,maspo,gepa")
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    args = ap.parse_args()

    from apps_bench.optimizers.entry import run_optimizer

    out_root = Path(args.out or tempfile.mkdtemp(prefix="optimizer_cost_"))
    # warm-up outside the timings: heavy imports (LangGraph, LangChain, OpenAI) happen once per process
    from apps_bench.topologies.registry import get_topology

    get_topology(compose(["allow_any_cell=true", "topology=sequential_langgraph"]).topology)
    import apps_bench.optimizers.gepa_adapter  # noqa: F401
    import apps_bench.optimizers.maspo_system  # noqa: F401

    rows = []
    for method in args.methods.split(","):
        over = [
            "allow_any_cell=true",
            "topology=sequential_langgraph",
            "model=gold",
            f"model.gold.latency_ms={args.latency_ms}",
            f"optimizer={method}",
            "dataset=apps",
            f"dataset.path={DATA / 'test_0-49_partial.jsonl'}",
            "concurrency=8",
            "judge.workers=2",
        ]
        if method != "none":
            over += [
                f"optimizer.params.pool.path={DATA / 'train_mini150.jsonl'}",
                f"optimizer.params.pool.train_size={args.train}",
                f"optimizer.params.pool.val_size={args.val}",
                f"optimizer.params.budget.rollouts={args.budget}",
            ]
        if method == "maspo":
            over += ["optimizer.params.minibatch=3"]
        if method == "none":  # optimizer=none has no params of its own: give it the same pool
            over += [
                f"+optimizer.params.pool={{path: '{DATA / 'train_mini150.jsonl'}', train_size: {args.train}, val_size: {args.val}}}"
            ]
        cfg = compose(over)
        t0 = time.perf_counter()
        res = run_optimizer(cfg, out_dir=out_root / method)
        wall = time.perf_counter() - t0
        b = res.budget
        # per fresh batch: the time since the previous event (problem draws differ across methods; one slow
        # problem dominates a small run, so the median batch time is the fairer speed figure)
        events = [json.loads(line) for line in (out_root / method / "events.jsonl").read_text().splitlines()]
        batch_s = [round(e["t"] - p["t"], 3) for p, e in zip(events, events[1:]) if e["kind"] == "evaluation" and e["fresh"]]
        rows.append(
            {
                "method": method,
                "wall_s": round(wall, 2),
                "rollouts": b["rollouts"],
                "budget": b["max_rollouts"] if method != "none" else "-",
                "overshoot": b["overshoot"]["rollouts"],
                "fresh_rollouts": b["fresh_rollouts"],
                "task_tokens": b["task_tokens"],
                "replayed_task_tokens": b.get("replayed_task_tokens", 0),
                "optimizer_calls": b["optimizer_calls"],
                "optimizer_tokens": b["optimizer_tokens"],
                "val_rollouts": res.val_rescoring["rollouts"],
                "val_task_tokens": res.val_rescoring["task_tokens"],
                "seed_val": res.seed_val.strict,
                "chosen_val": res.chosen_val.strict,
                "stopped": res.stopped,
                "median_batch_s": round(statistics.median(batch_s), 2) if batch_s else None,
                "max_batch_s": max(batch_s) if batch_s else None,
                "replay_hits": res.details.get("replay", {}).get("hits"),
            }
        )
    base = next((r["wall_s"] for r in rows if r["method"] == "none"), None)
    cols = [
        "method",
        "rollouts",
        "budget",
        "overshoot",
        "fresh_rollouts",
        "task_tokens",
        "replayed_task_tokens",
        "optimizer_calls",
        "optimizer_tokens",
        "val_rollouts",
        "val_task_tokens",
        "wall_s",
        "x_none",
        "median_batch_s",
        "max_batch_s",
        "replay_hits",
        "seed_val",
        "chosen_val",
        "stopped",
    ]
    for r in rows:
        r["x_none"] = round(r["wall_s"] / base, 2) if base else None
    print(
        f"optimizer cost at a budget of {args.budget} rollouts, sequential_langgraph, gold model, latency {args.latency_ms} ms, "
        f"train {args.train} / val {args.val}"
    )
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    (out_root / "optimizer_cost.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    print(f"written: {out_root / 'optimizer_cost.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
