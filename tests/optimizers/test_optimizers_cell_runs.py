"""The optimizer cell's MLflow layout helpers: the seed cell it is compared with, the
final-eval child's tags, the metrics of the optimizer cell's own run."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import compose_cell

from apps_bench.cell.key import resolve_cell
from apps_bench.config.schema import cell_data
from apps_bench.optimizers import cell_runs
from apps_bench.optimizers.optimization import OptimizeResult
from apps_bench.optimizers.scoring import Objective

CONF = Path(__file__).resolve().parents[2] / "conf"


def _data(*overrides: str) -> dict:
    return cell_data(compose_cell("allow_any_cell=true", *overrides))


def test_seed_cell_is_the_same_cell_with_optimizer_none():
    common = ["topology=sequential_langgraph", "dataset=apps", "limit=7", "seed=3"]
    opt = _data(*common, "optimizer=maspo", "optimizer.params.K=1", "concurrency=2")
    seed = cell_runs.seed_cell_of(opt)
    assert seed.key == resolve_cell(_data(*common)).key  # what `optimizer=none` composes, run-only settings aside
    assert seed.key != resolve_cell(opt).key and seed.optimizer == "none" and seed.seed == 3
    assert seed.key != resolve_cell(_data(*common[:-1], "seed=4")).key


def test_seed_cell_result_reads_the_local_summary(tmp_path):
    seed = cell_runs.seed_cell_of(_data("topology=single"))
    missing = cell_runs.seed_cell_result(seed, tmp_path)
    assert missing.pass_at_1 is None and "rerun this command with optimizer=none" in cell_runs.comparison_line(0.5, missing)
    d = tmp_path / "outputs" / "cells" / seed.dir_name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"pass_at_1": 0.25}))
    found = cell_runs.seed_cell_result(seed, tmp_path)
    assert found.pass_at_1 == 0.25
    assert "pass@1 0.5000 (chosen prompts) vs 0.2500 seed prompts" in cell_runs.comparison_line(0.5, found)
    assert cell_runs.headline({"pass_at_1": 0.5, "n_problems": 2.0, "latency_mean_s": 1.0}, found) == {
        "pass_at_1": 0.5,
        "n_problems": 2.0,
        "seed_cell_pass_at_1": 0.25,
    }


def test_final_eval_tags_never_carry_the_cell_key():
    data = _data("topology=single", "optimizer=gepa")
    cell, seed = resolve_cell(data), cell_runs.seed_cell_of(data)
    tags = cell_runs.final_eval_tags({"cell_key": cell.key, "optimizer": "gepa", "topology": "single"}, cell, seed, "RUN1")
    assert "cell_key" not in tags  # the cell's run is found again by cell_key; the child by final_eval_of
    assert tags["final_eval_of"] == cell.key and tags["seed_cell_key"] == seed.key and tags["optimizer_run_id"] == "RUN1"
    assert tags["run_kind"] == "final_eval" and tags["optimizer"] == "gepa"


def test_optimizer_metrics_report_budget_and_overshoot():
    budget = {
        "rollouts": 14,
        "fresh_rollouts": 10,
        "task_tokens": 900,
        "optimizer_tokens": 40,
        "optimizer_calls": 2,
        "max_rollouts": 12,
        "overshoot": {"rollouts": 2},
        "replayed_task_tokens": 300,
    }
    res = OptimizeResult(
        "maspo", {}, Objective(0.5, 0.6), Objective(1.0, 1.0), budget, {"rollouts": 4}, "budget", {"replay": {"hits": 3}}
    )
    m = cell_runs.optimizer_metrics(res)
    assert m["opt/rollouts_charged"] == 14 and m["opt/rollouts_budget"] == 12 and m["opt/overshoot_rollouts"] == 2
    assert m["opt/replayed_task_tokens"] == 300 and m["opt/replay_hits"] == 3 and m["val/chosen_strict"] == 1.0


def test_step_metrics_are_buffered_until_the_run_is_open():
    from concurrent.futures import Future

    from apps_bench.optimizers.optimization import step_metrics

    class Run:
        def __init__(self):
            self.logged, self.failed = [], None

        def log_metrics(self, metrics, step=0):
            self.logged.append((step, metrics["opt/rollouts_charged"]))

        def fail(self, message):
            self.failed = message

    fut: Future = Future()
    sink = cell_runs.StepMetricsSink(fut, step_metrics)
    ev = {"strict": 0.5, "fraction": 0.5}
    sink("evaluation", {**ev, "rollouts_charged": 3})
    sink("optimizer_call", {"tokens": 9})  # not a metric
    run = Run()
    fut.set_result(run)
    assert run.logged == []  # nothing is logged before the next event or flush
    sink("evaluation", {**ev, "rollouts_charged": 6})
    assert run.logged == [(3, 3.0), (6, 6.0)]
    sink.pending.append((9, {"opt/rollouts_charged": 9.0}))
    sink.fail("boom")
    assert run.logged[-1] == (9, 9.0) and run.failed == "boom"
