"""An optimizer run over the real pipeline: Hydra-composed cell, the gold model over
loopback HTTP, real LangGraph runner, real SandboxPool and judge, real APPS train rows.

The optimizer model is a deterministic local callable (tags), standing in until the gold
server has its optimizer mode. The gold model answers with reference solutions whatever
the prompt, so this checks the plumbing (paired seeds, cache, budget, manifest, traces,
prompt file), not that optimization helps.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from conftest import compose_cell, optimizer_config, optimizer_params

from apps_bench.config.schema import JudgeConfig, typed

pytestmark = pytest.mark.slow

CONF = Path(__file__).resolve().parents[2] / "conf"


def _cfg(*overrides):
    return compose_cell("allow_any_cell=true", "model=gold", *overrides)


def chat(messages, seed):
    cur = re.search(r"<current_prompt>\n(.*)\n</current_prompt>", messages[-1]["content"], re.S)
    if cur is None:
        return __import__("apps_bench.optimizers.proposals", fromlist=["ChatReply"]).ChatReply("<winner>tie</winner>", 3)
    from apps_bench.optimizers.proposals import ChatReply

    return ChatReply(
        f"<analysis>a</analysis><modification>m</modification><prompt>{cur.group(1)}\nCheck edge cases ({seed % 7}).</prompt>", 30
    )


def test_maspo_over_real_single_runner_with_gold(tmp_path, apps_data_dir):
    pytest.importorskip("apps_bench.sandbox.tool", reason="python_exec tool (sandbox engineer) not landed yet")
    from apps_bench.cell.engine import Engine
    from apps_bench.data import load_problems
    from apps_bench.models import open_endpoint
    from apps_bench.optimizers.optimization import optimize
    from apps_bench.optimizers.protocol import load_eval_set
    from apps_bench.optimizers.runner import PipelineRunner
    from apps_bench.sandbox import SandboxPool
    from apps_bench.topologies.prompts import load_prompts, roles_for

    cfg = _cfg("topology=single", "dataset=apps_train", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}", "concurrency=4")
    loaded = load_problems(cfg.dataset, difficulty="interview", max_tests_per_row=int(cfg.max_tests_per_row))
    problems = {p.key: p for p in loaded.problems}
    params = optimizer_params(
        "maspo",
        budget={"rollouts": 24},
        pool={"train_size": 6, "val_size": 3, "split_seed": 0},
        K=1,
        Ksub=1,
        T=2,
        D=1,
        minibatch=3,
    )
    out = tmp_path / "opt"
    seed_prompts = load_prompts(cfg.topology)
    with (
        open_endpoint(cfg.model, loaded.problems) as ep,
        SandboxPool.from_config(typed(JudgeConfig, cfg.judge), workers=2) as pool,
        Engine.open(cfg, endpoint=ep, pool=pool) as engine,
    ):
        runner = PipelineRunner(engine, problems=problems)

        def run_once():
            return optimize(
                optimizer=optimizer_config("maspo", params),
                flow=str(cfg.topology.flow),
                roles=roles_for(cfg.topology),
                seed_prompts=seed_prompts,
                problems=loaded.problems,
                dataset_revision=loaded.revision,
                eval_set=load_eval_set(),
                runner=runner,
                run_seed=int(cfg.seed),
                model=runner.model_identity(),
                settings=runner.settings(),
                out_dir=out,
                chat=chat,
                score_program=runner.score_program,
            )

        res = run_once()
        again = run_once()
    # the gold model passes the rows whose reference solution passes: val scores are real verdicts
    assert res.seed_val.strict > 0 and res.budget["rollouts"] > 0 and res.budget["task_tokens"] > 0
    assert res.budget["overshoot"]["rollouts"] < 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset_revision"] == "local" and all(r["split"] == "train" for r in manifest["train"] + manifest["val"])
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "optimizer_call" for e in events)
    # the traces the optimizer model saw came from the real runner: the solver's input holds the framed problem
    first_call = next(e for e in events if e["kind"] == "optimizer_call")
    assert "QUESTION:" in first_call["messages"][-1]["content"]
    # a rerun replays through the cache: same prompts, same charged budget, nothing fresh
    assert again.chosen == res.chosen and again.budget["rollouts"] == res.budget["rollouts"]
    assert again.budget["fresh_rollouts"] == 0 and again.budget["fresh_optimizer_tokens"] == 0
    # the chosen prompt set loads in a normal cell
    cell = _cfg("topology=single", f"topology.prompt_file={res.prompts_path}")
    assert dict(load_prompts(cell.topology).texts) == res.chosen


def test_pool_dataset_config_reads_the_right_split():
    from apps_bench.config.schema import DatasetConfig
    from apps_bench.optimizers.entry import pool_dataset_config

    def pool(**kw):
        return optimizer_params("maspo", pool=kw).pool

    hub = DatasetConfig(
        name="apps", source="hub", hub_repo="codeparrot/apps", revision="abc", split="test", path=None, streaming=True
    )
    tr = pool_dataset_config(hub, pool(source="train"))
    assert (tr.split, tr.revision, tr.source, tr.streaming) == ("train", "abc", "hub", False)
    assert pool_dataset_config(hub, pool(source="test_minus_eval")).split == "test"
    local = DatasetConfig(**{**dataclasses.asdict(hub), "path": "/data/test.jsonl"})
    assert pool_dataset_config(local, pool(source="train", path="/data/train.jsonl")).path == "/data/train.jsonl"
    with pytest.raises(ValueError, match="pool.path"):
        pool_dataset_config(local, pool(source="train"))
    with pytest.raises(ValueError, match="train or test_minus_eval"):
        pool_dataset_config(hub, pool(source="all"))


def test_run_optimizer_cell_from_composed_config(tmp_path, apps_data_dir, optimizer_pool_file):
    """The whole entry: Hydra cell -> pool from a local train file -> gold as task model and
    as optimizer model (its deterministic tagged rewrite) -> prompts.yaml. Gold's answers do
    not depend on the prompt, so the child ties its parent and the seed stays chosen."""
    pytest.importorskip("apps_bench.sandbox.tool", reason="python_exec tool (sandbox engineer) not landed yet")
    from apps_bench.optimizers.entry import run_optimizer

    cfg = _cfg(
        "topology=single",
        "optimizer=maspo",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'test_0-49_partial.jsonl'}",
        "judge.workers=2",
        "concurrency=4",
        "tool.timeout_s=2",
        "judge.timeout_s=2",
        f"optimizer.params.pool.path={optimizer_pool_file}",
        "optimizer.params.pool.train_size=4",
        "optimizer.params.pool.val_size=2",
        "optimizer.params.budget.rollouts=12",
        "optimizer.params.K=1",
        "optimizer.params.Ksub=1",
        "optimizer.params.T=1",
        "optimizer.params.D=1",
        "optimizer.params.minibatch=2",
    )
    res = run_optimizer(cfg, out_dir=tmp_path / "opt")
    assert res.method == "maspo" and res.prompts_path.exists()
    man = json.loads((tmp_path / "opt" / "manifest.json").read_text())
    assert man["pool_source"] == "train" and len(man["train"]) == 4 and len(man["val"]) == 2
    assert res.budget["rollouts"] > 0 and res.val_rescoring["rollouts"] > 0
    events = [json.loads(line) for line in (tmp_path / "opt" / "events.jsonl").read_text().splitlines()]
    child = next(e for e in events if e["kind"] == "maspo_child")
    assert child["reward"] == 0.5 and not child["won"]
    from apps_bench.topologies.prompts import load_prompts

    assert res.chosen == dict(load_prompts(cfg.topology).texts)
    assert res.budget["optimizer_calls"] == 1 and res.budget["rollouts"] == 4  # one parent run + one child re-run of 2
    # the task model sat behind the replay proxy; its stats are in result.json
    assert json.loads((tmp_path / "opt" / "result.json").read_text())["details"]["replay"]["misses"] > 0


def test_optimizer_model_config_resolution():
    from apps_bench.optimizers.entry import optimizer_model_config

    task = _cfg("topology=single").model
    assert optimizer_model_config(None, task) is task
    q = optimizer_model_config("qwen_122b", task)
    assert q.name == "qwen_122b" and q.provider == "openai"
    g = optimizer_model_config({"name": "gold", "temperature": 0.9}, task)
    assert g.provider == "gold" and g.temperature == 0.9 and g.max_tokens == task.max_tokens
    with pytest.raises(ValueError, match="no conf/model/gpt9.yaml"):
        optimizer_model_config("gpt9", task)
