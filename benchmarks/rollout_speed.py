#!/usr/bin/env python
"""An optimizer's rollout phase on one solver process vs the solver pool, in one run.

The optimizer's rollouts run on the cell's engine (apps_bench/cell/engine.py), so `processes`
decides how many processes solve them, as it does for a cell's own problems. This runs the
same optimization (method, seed, pool, budget) once per `--processes` setting, in fresh output
folders (no cache reuse), on a multi-agent topology with the gold model at zero latency (so the
harness's own CPU per model call is what is measured), and reports:

- the rollout phase: from the optimizer's first evaluation event to its last (events.jsonl), so
  start-up (imports, the forkserver) is left out; fresh rollouts per second over it, and the
  ratio to the first setting;
- the chosen prompt set's digest: the same seed must choose the same prompts whatever the
  process count (and before/after a change: run this script on both commits and compare).

Usage (from the repo root):
  python benchmarks/rollout_speed.py [--topology decentralized_langgraph] [--processes 1,auto]
      [--method maspo] [--budget 48] [--train 12] [--minibatch 6] [--val 4] [--latency-ms 0] [--wrong-fraction 0.3]
Rows: tests/fixtures/apps/train_mini150.jsonl (pool), test_0-49_partial.jsonl (eval rows).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO / "tests" / "fixtures" / "apps"


def compose(overrides: list[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from apps_bench.config.schema import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "apps_bench" / "conf")):
        return hcompose("config", overrides=overrides)


def digest(prompts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()[:12]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="decentralized_langgraph")
    ap.add_argument("--processes", default="1,auto", help="comma-separated settings; the first is the baseline")
    ap.add_argument("--method", default="maspo")
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--train", type=int, default=12)
    ap.add_argument("--minibatch", type=int, default=6, help="MASPO's minibatch: the rollouts in flight per step")
    ap.add_argument("--val", type=int, default=4)
    ap.add_argument("--latency-ms", type=int, default=0)
    ap.add_argument("--wrong-fraction", type=float, default=0.3, help="gold's share of wrong answers: candidates then differ")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from apps_bench.optimizers.entry import run_optimizer
    from apps_bench.topologies.registry import get_topology

    out_root = Path(tempfile.mkdtemp(prefix="rollout_speed_"))
    base = [
        "allow_any_cell=true",
        f"topology={args.topology}",
        "model=gold",
        f"model.gold.latency_ms={args.latency_ms}",
        f"model.gold.wrong_fraction={args.wrong_fraction}",
        f"optimizer={args.method}",
        "dataset=apps",
        f"dataset.path={DATA / 'test_0-49_partial.jsonl'}",
        f"concurrency={args.concurrency}",
        f"seed={args.seed}",
        f"optimizer.params.pool.path={DATA / 'train_mini150.jsonl'}",
        f"optimizer.params.pool.train_size={args.train}",
        f"optimizer.params.pool.val_size={args.val}",
        f"optimizer.params.budget.rollouts={args.budget}",
        f"optimizer.params.minibatch={args.minibatch}",
    ]
    if args.topology != "single":
        base.append("topology.team_size=2")
    get_topology(compose(base).topology)  # the framework's imports, once, outside the timings
    rows = []
    for setting in args.processes.split(","):
        cfg = compose([*base, f"processes={setting}"])
        out = out_root / f"p{setting}"
        t0 = time.perf_counter()
        res = run_optimizer(cfg, out_dir=out)
        wall = time.perf_counter() - t0
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        evals = [e for e in events if e["kind"] == "evaluation"]
        phase = evals[-1]["t"] - evals[0]["t"] if len(evals) > 1 else float("nan")
        fresh = sum(len(e["keys"]) for e in evals[1:] if e.get("fresh"))  # the rollouts run inside the phase
        rows.append(
            {
                "processes": setting,
                "wall_s": wall,
                "phase_s": phase,
                "fresh_rollouts": fresh,
                "rollouts_per_s": fresh / phase if phase else float("nan"),
                "chosen": digest(dict(res.chosen)),
                "chosen_val": res.chosen_val.strict,
            }
        )
    first = rows[0]["rollouts_per_s"]
    print(
        f"\n{args.method} on {args.topology}, gold at {args.latency_ms} ms (wrong {args.wrong_fraction}), "
        f"budget {args.budget}, seed {args.seed}\n"
    )
    print("| processes | wall s | rollout phase s | fresh rollouts | rollouts/s | speed-up | chosen prompts | chosen val |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['processes']} | {r['wall_s']:.1f} | {r['phase_s']:.1f} | {r['fresh_rollouts']} | "
            f"{r['rollouts_per_s']:.2f} | {r['rollouts_per_s'] / first:.2f}x | {r['chosen']} | {r['chosen_val']:.3f} |"
        )
    same = len({r["chosen"] for r in rows}) == 1
    print(f"\nthe same chosen prompts for every setting: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
