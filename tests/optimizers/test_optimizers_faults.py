"""GEPA over the real pipeline while the gold server injects infrastructure faults
(`model.gold.fault_fraction`, client retries off so they reach the rollouts): failed rollouts
are re-run, never scored as wrong answers, so the run ends exactly where a fault-free run
ends (same chosen prompts, val scores and charged budget). Without retries it stops with
`InfrastructureDown` instead of scoring zeros.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import compose_cell, optimizer_config, optimizer_params

from apps_bench.config.schema import JudgeConfig, typed

pytestmark = pytest.mark.slow
pytest.importorskip("gepa")
CONF = Path(__file__).resolve().parents[2] / "conf"


def _cfg(*overrides):
    return compose_cell("allow_any_cell=true", "model=gold", *overrides)


@pytest.fixture(scope="module")
def rows(apps_data_dir):
    pytest.importorskip("apps_bench.sandbox.tool")
    from apps_bench.data import load_problems

    base = _cfg("dataset=apps_train", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}")
    loaded = load_problems(base.dataset, difficulty="interview", max_tests_per_row=2)
    small = sorted(
        (p for p in loaded.problems if p.tests.fn_name is None), key=lambda p: sum(len(str(x)) for x in p.tests.inputs)
    )[:6]
    return small


def _gepa(out: Path, rows, fault_fraction: float, infra_retries: int):
    """One GEPA run as an optimizer cell does it: task model behind the replay proxy, a separate
    (fault-free) gold endpoint as reflection model."""
    from apps_bench.cell.engine import Engine
    from apps_bench.models import open_endpoint
    from apps_bench.optimizers.cache import RolloutCache
    from apps_bench.optimizers.chat import EndpointChat
    from apps_bench.optimizers.optimization import optimize
    from apps_bench.optimizers.protocol import load_eval_set
    from apps_bench.optimizers.replay import ReplayProxy
    from apps_bench.optimizers.runner import PipelineRunner
    from apps_bench.sandbox import SandboxPool
    from apps_bench.topologies.prompts import load_prompts, roles_for

    cfg = _cfg(
        "topology=single",
        "tool.timeout_s=2",
        "judge.timeout_s=2",
        "concurrency=4",
        "model.gold.wrong_fraction=0.5",
        f"model.gold.fault_fraction={fault_fraction}",
        "model.max_retries=0",
    )
    params = optimizer_params(
        "gepa",
        budget={"rollouts": 8},
        pool={"train_size": 3, "val_size": 2, "split_seed": 0},
        minibatch=2,
        infra_retries=infra_retries,
    )
    with ExitStack() as stack:
        ep = stack.enter_context(open_endpoint(cfg.model, rows))
        ep.server.fault_kinds = ("http_500", "http_503", "malformed")  # no stalls: keeps the test fast
        opt_cfg = _cfg("model.gold.wrong_fraction=0.5").model
        opt_ep = stack.enter_context(open_endpoint(opt_cfg, rows))
        pool = stack.enter_context(SandboxPool.from_config(typed(JudgeConfig, cfg.judge), workers=2))
        proxy = ReplayProxy(ep.base_url, stack.enter_context(RolloutCache(out / "cache.sqlite")))
        url = stack.enter_context(proxy)
        engine = stack.enter_context(Engine.open(cfg, endpoint=ep, pool=pool))
        runner = PipelineRunner(engine, problems={p.key: p for p in rows}, replay_url=url, replayed=proxy.pop_replayed)
        chat = stack.enter_context(_closing(EndpointChat(opt_ep, opt_cfg)))
        res = optimize(
            optimizer=optimizer_config("gepa", params),
            flow=str(cfg.topology.flow),
            roles=roles_for(cfg.topology),
            seed_prompts=load_prompts(cfg.topology),
            problems=rows,
            dataset_revision="local",
            eval_set=load_eval_set(),
            runner=runner,
            run_seed=0,
            model=runner.model_identity(),
            settings=runner.settings(),
            out_dir=out,
            chat=chat,
            score_program=runner.score_program,
        )
        return res, dict(ep.server.stats.faults)


class _closing:
    def __init__(self, thing):
        self.thing = thing

    def __enter__(self):
        return self.thing

    def __exit__(self, *exc):
        self.thing.close()


def test_gepa_under_injected_faults_ends_where_a_fault_free_run_ends(tmp_path, rows):
    clean, no_faults = _gepa(tmp_path / "clean", rows, 0.0, 1)
    faulty, faults = _gepa(tmp_path / "faulty", rows, 0.25, 8)
    assert not no_faults and sum(faults.values()) > 0
    events = [json.loads(line) for line in (tmp_path / "faulty" / "events.jsonl").read_text().splitlines()]
    assert sum(e.get("retried", 0) for e in events if e["kind"] == "evaluation") > 0  # faults reached rollouts
    assert all(e.get("infra_errors", 0) == 0 for e in events if e["kind"] == "evaluation")
    assert faulty.chosen == clean.chosen
    assert (faulty.seed_val, faulty.chosen_val) == (clean.seed_val, clean.chosen_val)
    for k in ("rollouts", "task_tokens", "replayed_task_tokens", "optimizer_calls"):  # retries are not charged twice
        assert faulty.budget[k] == clean.budget[k], k
    assert faulty.details["candidates"] == clean.details["candidates"]


def test_gepa_without_retries_stops_instead_of_scoring_zeros(tmp_path, rows):
    from apps_bench.optimizers.scoring import InfrastructureDown

    with pytest.raises(InfrastructureDown, match="failed for infrastructure reasons"):
        _gepa(tmp_path / "faulty", rows, 0.25, 0)
    assert (tmp_path / "faulty" / "manifest.json").exists() and not (tmp_path / "faulty" / "result.json").exists()


def test_optimizer_cell_with_the_model_down_stops_with_a_clear_message(
    tmp_path, apps_data_dir, optimizer_pool_file, mlflow_template
):
    """Through the CLI: every task-model call fails -> the optimizer stops (exit 2, what failed and
    how to resume), its MLflow run is marked failed, no final evaluation runs."""
    from conftest import fresh_store, run_cli

    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(
        [
            "allow_any_cell=true",
            "optimizer=gepa",
            "model=gold",
            "model.gold.fault_fraction=1.0",
            "model.max_retries=0",
            "model.request_timeout_s=2",
            "dataset=apps",
            f"dataset.path={apps_data_dir / 'test_0-49_partial.jsonl'}",
            "progress=false",
            f"optimizer.params.pool.path={optimizer_pool_file}",
            "optimizer.params.pool.train_size=2",
            "optimizer.params.pool.val_size=2",
            "optimizer.params.budget.rollouts=6",
        ],
        tmp_path,
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "optimizer=gepa stopped: all 2 rollouts of the batch failed for infrastructure reasons" in r.stderr
    assert "Traceback" not in r.stderr and "rerun" in r.stderr
    import os

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert [(x.data.tags.get("run_kind"), x.info.status) for x in runs] == [("optimizer_cell", "FAILED")]
