"""How an optimizer cell is laid out in MLflow and reported next to its seed cell.

Why a layout of two runs: the optimization (step metrics keyed by charged rollouts, the
manifest, events, chosen prompts, result.json) and the final evaluation on the eval IDs
(a normal cell's metrics and per-problem table) are different things; mixing them in one
run makes the final cell look unlike every other cell. So:

- the optimizer cell's run (found again by its `cell_key` tag, nested under a sweep's
  parent like any cell) carries the optimization, plus a copy of the final evaluation's
  headline metrics so the grid report (one run per cell) keeps working;
- a child run, the final evaluation, is a normal cell run with the chosen PromptSet,
  found again by its own `final_eval_of` tag (never by `cell_key`, so it cannot shadow
  the cell's run on resume).

The seed prompts' cell is the same cell with `optimizer=none`; both runs name it by key
and name. It is not run implicitly (on a real model it costs a whole cell on the eval
IDs, and a sweep `optimizer=none,maspo` runs it anyway); when its summary exists in the
local outputs, its pass@1 is logged and printed next to the optimizer cell's.
"""

from __future__ import annotations

import functools
import json
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from apps_bench.cell.key import Cell, resolve_cell
from apps_bench.config.schema import Config, OptimizerConfig, as_plain, compose, config_data
from apps_bench.data import LoadResult
from apps_bench.optimizers.optimization import OptimizeResult
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.run import NoRun, Tracker, cell_tags
from apps_bench.types import JsonObject

HEADLINE = (
    "pass_at_1",
    "pass_at_1_ci_low",
    "pass_at_1_ci_high",
    "pass_at_1_extracted",
    "n_problems",
    "n_passed",
    "n_errors",
    "complete",
)


def seed_cell_of(data: JsonObject) -> Cell:
    """The seed prompts' cell: this cell's config with `optimizer=none` as conf/optimizer/none.yaml composes it."""
    return resolve_cell({**dict(data), "optimizer": as_plain(_no_optimizer())})


@functools.cache
def _no_optimizer() -> OptimizerConfig:
    return compose(["optimizer=none"]).optimizer


@dataclass(frozen=True)
class SeedCellResult:
    cell: Cell
    summary_path: Path | None
    pass_at_1: float | None


def seed_cell_result(seed: Cell, cwd: Path | None = None) -> SeedCellResult:
    """The seed cell's local summary (`outputs/cells/<dir>/summary.json` under `cwd`), if it ran."""
    path = (cwd or Path.cwd()).resolve() / "outputs" / "cells" / seed.dir_name / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SeedCellResult(seed, None, None)
    value = summary.get("pass_at_1")
    return SeedCellResult(seed, path, float(value) if value is not None else None)


def link_tags(cell: Cell, seed: Cell) -> dict[str, str]:
    """Tags both runs carry: which cell this is and which seed cell it is compared with."""
    return {"seed_cell_key": seed.key, "seed_cell_name": seed.name, "optimizer_cell_key": cell.key}


def final_eval_tags(cell_tags: Mapping[str, str], cell: Cell, seed: Cell, optimizer_run_id: str) -> dict[str, str]:
    """The final-eval child's tags: the cell's (axes, framework, revision...) minus `cell_key`."""
    tags = {k: v for k, v in cell_tags.items() if k != "cell_key"}
    return {
        **tags,
        **link_tags(cell, seed),
        "run_kind": "final_eval",
        "final_eval_of": cell.key,
        "optimizer_run_id": optimizer_run_id,
    }


def open_final_eval_run(config: Config, cell: Cell, loaded: LoadResult, optimizer_run: Tracker) -> Tracker:
    """The final evaluation's run: a child of the optimizer cell's run, found again by its own
    `final_eval_of` tag on resume."""
    if config.tracking.backend == "none":
        return NoRun()

    parent = optimizer_run.run_id
    if parent is None:  # only NoRun has no id, and it is the optimizer run of `tracking=none` alone
        raise TypeError(f"the optimizer cell's run has no id under tracking.backend={config.tracking.backend}")
    tags = final_eval_tags(cell_tags(config, cell, loaded), cell, seed_cell_of(config_data(config)), parent)
    return mlf.CellRun.open(
        experiment=config.tracking.experiment,
        cell_key=cell.key,
        run_name=f"{cell.name}·final_eval",
        params=dict(cell.identity),
        tags=tags,
        key_tag="final_eval_of",
        parent_run_id=parent,
    )


def optimizer_metrics(result: OptimizeResult) -> dict[str, float]:
    """What the optimization cost and found, as the optimizer cell run's final metrics."""
    b = dict(result.budget)
    replay = dict(result.details.get("replay") or {})
    m = {
        "opt/rollouts_charged": b["rollouts"],
        "opt/fresh_rollouts": b["fresh_rollouts"],
        "opt/task_tokens": b["task_tokens"],
        "opt/optimizer_tokens": b["optimizer_tokens"],
        "opt/optimizer_calls": b["optimizer_calls"],
        "opt/overshoot_rollouts": b["overshoot"]["rollouts"],
        "opt/val_rescoring_rollouts": result.val_rescoring["rollouts"],
        "val/seed_strict": result.seed_val.strict,
        "val/chosen_strict": result.chosen_val.strict,
        "val/seed_fraction": result.seed_val.fraction,
        "val/chosen_fraction": result.chosen_val.fraction,
    }
    if b.get("max_rollouts") is not None:
        m["opt/rollouts_budget"] = b["max_rollouts"]
    if "replayed_task_tokens" in b:
        m["opt/replayed_task_tokens"] = b["replayed_task_tokens"]
    if replay:
        m["opt/replay_hits"] = replay.get("hits", 0)
    return {k: float(v) for k, v in m.items() if v is not None}


def headline(cell_metrics: Mapping[str, float], seed: SeedCellResult) -> dict[str, float]:
    """The final evaluation's headline metrics for the optimizer cell's run, and the seed cell's pass@1."""
    m = {k: float(cell_metrics[k]) for k in HEADLINE if k in cell_metrics}
    if seed.pass_at_1 is not None:
        m["seed_cell_pass_at_1"] = seed.pass_at_1
    return m


def comparison_line(pass_at_1: float, seed: SeedCellResult) -> str:
    """The summary's last line: the chosen prompts' pass@1 next to the seed prompts'."""
    head = f"optimizer cell pass@1 {pass_at_1:.4f} (chosen prompts)"
    if seed.pass_at_1 is not None:
        return f"{head} vs {seed.pass_at_1:.4f} seed prompts (cell {seed.cell.name} [{seed.cell.key}], {seed.summary_path})"
    return (
        f"{head}; seed prompts' cell {seed.cell.name} [{seed.cell.key}] has no local results: "
        "rerun this command with optimizer=none to compare"
    )


class StepMetricsSink:
    """The optimizer's event hook -> MLflow step metrics on the cell's run, which opens in the
    background (seconds: the helper imports mlflow) while the optimization starts; metrics of
    events before it is open are buffered. A store that failed to open stops the run at the
    next event, as a cell stops at its next problem."""

    def __init__(
        self, run_future: Future[Tracker], to_metrics: Callable[[str, JsonObject], tuple[int, dict[str, float]] | None]
    ) -> None:
        self.future = run_future
        self.to_metrics = to_metrics  # run.step_metrics: (kind, payload) -> (step, metrics) | None
        self.pending: list[tuple[int, dict[str, float]]] = []
        self._lock = threading.Lock()  # events may come from the optimizer's worker threads

    def __call__(self, kind: str, payload: JsonObject) -> None:
        m = self.to_metrics(kind, payload)
        with self._lock:
            if m:
                self.pending.append(m)
            if self.future.done():
                self._flush()

    def flush(self) -> Tracker:
        """Wait for the run, log what is buffered; -> the run."""
        with self._lock:
            return self._flush()

    def _flush(self) -> Tracker:
        run = self.future.result()
        while self.pending:
            step, metrics = self.pending.pop(0)
            run.log_metrics(metrics, step=step)
        return run

    def fail(self, message: str) -> None:
        """Log what is buffered (the curve up to the failure), then mark the run failed."""
        try:
            run = self.flush()
        except Exception:  # noqa: BLE001 - the store itself failed: the optimizer's own error is the one to show
            return
        try:
            run.fail(message)
        except Exception:  # noqa: BLE001 - same
            pass
