"""Prompt optimizers: one protocol shared by every method (MASPO, GEPA).

Modules, each with one job (import them by name; `gepa` and the frameworks load lazily):
- `protocol`: pool, disjoint splits, manifest, scoring gate (eval keys refused), budgets,
  paired request seeds.
- `cache`: the rollout cache (SQLite, safe across kill -9) and per-step checkpoints.
- `scoring`: `Rollout`, the `Evaluator`/`Runner` protocols, `ProtocolEvaluator` (gate +
  seeds + cache + budget in front of a runner), the objective.
- `proposals`: tagged answers of the optimizer model, messages, `CachedChat`, `ModelProposer`.
- `maspo`: the MASPO search over an abstract agent graph; `maspo_system`: its runs and
  execution-grounded comparisons over an `Evaluator`.
- `gepa_adapter`: `gepa` 0.1.x over an `Evaluator`, avoiding the traps found.
- `runner`: the `Runner` over the real pipeline (topology + judge); `chat`: the optimizer
  model on the project's metered clients.
- `optimization`: one optimizer run (manifest first, method, val re-scoring, prompts.yaml,
  events.jsonl, result.json); `entry`: from a composed cell config to `optimization.optimize`.
- `replay`: the loopback proxy that answers repeated model requests from the run's cache
  (partial re-runs), with replayed tokens booked apart.
- `cell_runs`: the optimizer cell's MLflow layout (its run + a final-eval child run) and
  the seed cell (`optimizer=none`) it is reported next to.

The CLI's use (`optimizers/optimizer_cell.py`): `entry.run_optimizer(cfg, out_dir=..., hook=...)`
returns the chosen PromptSet (`result.prompts_path`); the cell then evaluates it on its own
problems in a child MLflow run, next to the seed prompts' cell. `python -m apps_bench.optimize`
takes the seed's `optimizers.protocol.run` flags.
"""

from __future__ import annotations

__all__ = [
    "cache",
    "cell_runs",
    "chat",
    "entry",
    "gepa_adapter",
    "maspo",
    "maspo_system",
    "proposals",
    "protocol",
    "replay",
    "optimization",
    "runner",
    "scoring",
]
