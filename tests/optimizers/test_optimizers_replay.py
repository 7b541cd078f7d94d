"""Request-level replay: a child prompt re-runs only the changed stage and what diverges after it.

Real sequential_langgraph runner, gold model over loopback HTTP behind the replay proxy,
real sandbox and judge, real APPS rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_cell

from apps_bench.config.schema import JudgeConfig, typed

pytestmark = pytest.mark.slow
CONF = Path(__file__).resolve().parents[2] / "conf"


def test_chain_child_replays_upstream_stages(tmp_path, apps_data_dir):
    pytest.importorskip("apps_bench.sandbox.tool")
    from apps_bench.cell.engine import Engine
    from apps_bench.data import load_problems
    from apps_bench.models import open_endpoint
    from apps_bench.optimizers.cache import RolloutCache
    from apps_bench.optimizers.replay import ReplayProxy
    from apps_bench.optimizers.runner import PipelineRunner
    from apps_bench.sandbox import SandboxPool
    from apps_bench.topologies.prompts import load_prompts

    cfg = compose_cell(
        "allow_any_cell=true",
        "model=gold",
        "topology=sequential_langgraph",
        "topology.team_size=4",
        "dataset=apps_train",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "tool.timeout_s=2",
    )
    loaded = load_problems(cfg.dataset, only=("1", "9"), max_tests_per_row=3)
    problems = {p.key: p for p in loaded.problems}
    jobs = [(k, 11) for k in problems]
    seed_ps = load_prompts(cfg.topology)
    cache = RolloutCache(tmp_path / "cache.sqlite")
    proxy = ReplayProxy("unused", cache)
    with (
        open_endpoint(cfg.model, loaded.problems) as ep,
        SandboxPool.from_config(typed(JudgeConfig, cfg.judge), workers=2) as pool,
    ):
        proxy.upstream = ep.base_url
        with proxy as url, Engine.open(cfg, endpoint=ep, pool=pool) as engine:
            runner = PipelineRunner(engine, problems=problems, replay_url=url, replayed=proxy.pop_replayed)
            parent = runner.run_batch(seed_ps, jobs)
            assert (proxy.hits, proxy.misses) == (0, sum(r.model_calls for r in parent))
            child_ps = seed_ps.replace("tester", seed_ps["tester"] + "\nBe thorough.")
            child = runner.run_batch(child_ps, jobs)
            tester_calls = sum(1 for r in parent for t in r.traces if t.role == "tester") * 2  # tool call + answer
            # analyzer and coder replayed; the tester (changed prompt) reached the model; the debugger's
            # requests are identical again (gold's tester reply does not depend on the prompt): replayed
            assert proxy.misses - sum(r.model_calls for r in parent) == tester_calls
            assert proxy.hits == sum(r.model_calls for r in child) - tester_calls
            assert [r.passed for r in child] == [r.passed for r in parent]
            # tokens: only what reached the model is charged; replayed answers are booked apart, per rollout
            gold = ep.server.stats
            assert sum(r.task_tokens for r in parent + child) == gold.prompt_tokens + gold.completion_tokens
            assert all(r.replayed_tokens == 0 for r in parent) and all(r.replayed_tokens > 0 for r in child)
            assert sum(r.replayed_tokens for r in child) == proxy.stats()["replayed_tokens"]
            assert all(c.task_tokens < p.task_tokens for p, c in zip(parent, child))
            # a rollout re-run after a kill caught it in flight (its own answers recorded, the rollout not
            # cached) is charged as the first time: its own answers keep their usage, the parent's do not
            served = gold.prompt_tokens + gold.completion_tokens
            again = runner.run_batch(child_ps, jobs)
            assert gold.prompt_tokens + gold.completion_tokens == served  # nothing reached the model
            assert [(r.task_tokens, r.replayed_tokens) for r in again] == [(r.task_tokens, r.replayed_tokens) for r in child]
            assert [[t.output for t in r.traces if t.role == "coder"] for r in child] == [
                [t.output for t in r.traces if t.role == "coder"] for r in parent
            ]
    # the recorded answers are in the run's cache, so a rerun after a kill replays them too
    assert RolloutCache(tmp_path / "cache.sqlite").count("model_call") == proxy.misses
