"""The GEPA adapter with a synthetic evaluator and a deterministic reflection callable.

Synthetic world: a problem with id i passes when the coder prompt holds at least
(i % 7) '+' signs, so adding '+' is a real improvement GEPA can find. The reflection
callable answers in tags and appends '+' plus a code fence to the current prompt (the
fence would break GEPA's default ``` proposer).
"""

from __future__ import annotations

import re

import pytest
from conftest import compose_cell, optimizer_params

pytest.importorskip("gepa")

from gepa.core.adapter import GEPAAdapter  # noqa: E402

from apps_bench.config.schema import cell_data  # noqa: E402
from apps_bench.optimizers.cache import RolloutCache  # noqa: E402
from apps_bench.optimizers.gepa_adapter import PipelineAdapter, run_gepa  # noqa: E402
from apps_bench.optimizers.proposals import CachedChat, ChatReply  # noqa: E402
from apps_bench.optimizers.protocol import Budget, EvalKeyError, EvalSet, ScoringGate, Splits  # noqa: E402
from apps_bench.optimizers.scoring import PERFECT_SCORE, FailingTest, InfrastructureDown, ProtocolEvaluator, RoleTrace, Rollout  # noqa: E402
from apps_bench.topologies.base import PromptSet  # noqa: E402

TRAIN = [("train", str(i)) for i in range(1, 9)]
VAL = [("train", str(i)) for i in range(20, 25)]
EVAL = EvalSet(frozenset(("test", str(i)) for i in range(50)))
FENCE = "\nEnd with:\n```python\n# code\n```"
SEED = {"coder": "Solve it." + FENCE, "tester": "Test it."}


class Runner:
    def __init__(self, broken=()):
        self.jobs: list[tuple[dict, list]] = []
        self.broken = set(broken)

    def run_batch(self, prompt_set, jobs):
        self.jobs.append((dict(prompt_set.texts), list(jobs)))
        out = []
        for key, seed in jobs:
            if key in self.broken:
                raise RuntimeError(f"runner crashed on {key}")
            need, have = int(key[1]) % 7, prompt_set["coder"].count("+")
            ok = have >= need
            out.append(
                Rollout(
                    key=key,
                    seed=seed,
                    program="print(1)",
                    passed=ok,
                    pass_fraction=1.0 if ok else have / need,
                    tests_passed=min(have, need),
                    n_tests=max(need, 1),
                    task_tokens=7,
                    first_failure=None if ok else FailingTest(have, f"in{key[1]}", f"out{key[1]}", "wrong_answer"),
                    traces=(
                        RoleTrace("c", "coder", f"QUESTION {key[1]}", "```python\nprint(1)\n```"),
                        RoleTrace("t", "tester", "tests?", "looks fine"),
                    ),
                )
            )
        return out


def reflect(messages, seed):
    current = re.search(r"<current_prompt>\n(.*)\n</current_prompt>", messages[1]["content"], re.S).group(1)
    new = current.replace("Solve it.", "Solve it.+", 1) if "Solve it." in current else current + "+"
    return ChatReply(f"<analysis>needs +</analysis><modification>add +</modification><prompt>{new}</prompt>", tokens=50)


def evaluator(tmp_path, runner, budget, cache=None, strict_splits=True):
    return ProtocolEvaluator(
        runner=runner,
        cache=cache or RolloutCache(tmp_path / "cache.sqlite"),
        budget=budget,
        gate=ScoringGate(EVAL, Splits(tuple(TRAIN), tuple(VAL), 0) if strict_splits else None),
        run_seed=0,
        model={"id": "synthetic"},
        settings={"topology": "sequential"},
    )


def go(tmp_path, runner, budget, cache=None, **cfg):
    ev = evaluator(tmp_path, runner, budget, cache)
    chat = CachedChat(reflect, ev.cache, {"id": "reflector"}, budget)
    return run_gepa(SEED, TRAIN, VAL, ev, chat, budget=budget, cfg=optimizer_params("gepa", **{"minibatch": 3, **cfg}))


def test_adapter_is_a_gepa_adapter_with_its_own_proposer():
    a = PipelineAdapter(evaluator=None, reflect=reflect)  # type: ignore[arg-type]
    assert GEPAAdapter in type(a).__mro__ and a.propose_new_texts is not None


def test_gepa_improves_within_budget_and_maps_val_ids(tmp_path):
    runner = Runner()
    budget = Budget(max_rollouts=60)
    out = go(tmp_path, runner, budget)
    best = out.best["coder"]
    assert best.count("+") >= 2 and best.endswith(FENCE)  # the fence survived every rewrite
    assert out.best["tester"].startswith("Test it.")
    assert out.val_aggregate[out.best_idx] > out.val_aggregate[0]
    # val scores are keyed by problem key, not GEPA's positions
    assert all(set(s) <= set(VAL) for s in out.val_scores) and set(out.val_scores[0]) == set(VAL)
    # seed (no '+'): problem 21 (21 % 7 == 0) passes, 22 needs one '+' and fails
    assert out.val_scores[0][("train", "21")] > 1.0 and out.val_scores[0][("train", "22")] == pytest.approx(0.0)
    # the budget: stopped by it, overshoot at most one batch, reported
    assert out.stopped == "budget"
    assert budget.rollouts >= 60 and budget.overshoot()["rollouts"] < max(len(VAL), 3)
    assert out.budget["overshoot"]["rollouts"] == budget.rollouts - 60
    # no eval key, and nothing outside train/val, ever reached the runner
    ran = {k for _, jobs in runner.jobs for k, _ in jobs}
    assert ran <= set(TRAIN) | set(VAL)
    assert out.proposals >= 2 and out.unparsable == 0
    assert budget.optimizer_tokens == 50 * budget.optimizer_calls


def test_rerun_replays_from_cache_same_result_no_new_charges(tmp_path):
    cache = RolloutCache(tmp_path / "shared.sqlite")
    b1 = Budget(max_rollouts=40)
    o1 = go(tmp_path, Runner(), b1, cache)
    runner2 = Runner()
    b2 = Budget(max_rollouts=40)
    o2 = go(tmp_path, runner2, b2, cache)
    assert o2.best == o1.best and o2.candidates == o1.candidates
    assert (b2.rollouts, b2.task_tokens, b2.optimizer_tokens) == (b1.rollouts, b1.task_tokens, b1.optimizer_tokens)
    assert runner2.jobs == [] and b2.fresh_rollouts == 0 and b2.fresh_optimizer_tokens == 0


def test_stops_when_nothing_new_is_charged(tmp_path):
    """All-perfect minibatches are skipped by GEPA and cost nothing: the stall stopper ends the loop."""
    budget = Budget(max_rollouts=10_000)
    out = go(tmp_path, Runner(), budget, stall_iterations=5)
    assert out.stopped == "stalled" and not budget.exhausted
    assert out.best["coder"].count("+") == 6  # reached the top of the synthetic world first


def test_flaky_infrastructure_is_retried_not_scored(tmp_path):
    """A rollout that fails for an infrastructure reason is re-run (infra_retries) and scored on
    its real verdict, charged once; a runner that crashes on one problem is isolated the same way."""

    class Flaky(Runner):
        def __init__(self):
            super().__init__()
            self.failed: set = set()

        def run_batch(self, prompt_set, jobs):
            out = super().run_batch(prompt_set, jobs)
            for i, r in enumerate(out):
                if r.key == TRAIN[1] and r.key not in self.failed:  # the first run of this problem meets an outage
                    self.failed.add(r.key)
                    out[i] = Rollout(key=r.key, seed=r.seed, error="model_error: 503 after retries", task_tokens=2)
            return out

    budget = Budget()
    runner = Flaky()
    ad = PipelineAdapter(evaluator(tmp_path, runner, budget), reflect, budget=budget)
    res = ad.evaluate(TRAIN[:3], {**SEED, "coder": "Solve it.++"}, capture_traces=True)
    assert all(r.error is None for r in res.outputs) and res.scores[1] == PERFECT_SCORE  # its real verdict (needs 2 '+'), not 0
    assert [len(jobs) for _, jobs in runner.jobs] == [3, 1] and budget.rollouts == 3 and res.num_metric_calls == 3
    assert res.trajectories == res.outputs
    assert ad.evaluate(TRAIN[:2], dict(SEED), capture_traces=False).trajectories is None


def test_persistent_infrastructure_failure_stops_instead_of_scoring_zero(tmp_path):
    """What still fails after the retries is never a 0 (a wrong answer to GEPA): the run stops with
    a message saying what failed and how to resume; the finished rollouts are cached."""
    budget = Budget()
    runner = Runner(broken={TRAIN[1]})
    ev = evaluator(tmp_path, runner, budget)
    ad = PipelineAdapter(ev, reflect, budget=budget)
    with pytest.raises(InfrastructureDown, match=r"1 of 3 rollouts failed .* train/2: .*runner crashed.*rerun"):
        ad.evaluate(TRAIN[:3], dict(SEED))
    runner.broken.clear()  # the endpoint is back: the rerun pays only the problem that failed
    res = ad.evaluate(TRAIN[:3], dict(SEED))
    assert all(r.error is None for r in res.outputs) and [k for k, _ in runner.jobs[-1][1]] == [TRAIN[1]]
    assert ev.cache.count() == 3


def test_infrastructure_down_is_not_scored_as_zeros(tmp_path):
    class Down(Runner):
        def run_batch(self, prompt_set, jobs):
            return [Rollout(key=k, seed=s, error="connection refused") for k, s in jobs]

    ad = PipelineAdapter(evaluator(tmp_path, Down(), Budget()), reflect)
    with pytest.raises(InfrastructureDown, match="connection refused"):
        ad.evaluate(TRAIN[:3], dict(SEED))


def test_eval_keys_are_refused_not_scored(tmp_path):
    runner = Runner()
    ad = PipelineAdapter(evaluator(tmp_path, runner, Budget(), strict_splits=False), reflect)
    with pytest.raises(EvalKeyError):
        ad.evaluate([TRAIN[0], ("test", "3")], dict(SEED))
    assert runner.jobs == []


def test_budget_exhausted_runs_nothing_more(tmp_path):
    runner = Runner()
    budget = Budget(max_rollouts=3)
    ad = PipelineAdapter(evaluator(tmp_path, runner, budget), reflect, budget=budget)
    first = ad.evaluate(TRAIN[:3], dict(SEED))
    assert first.num_metric_calls == 3
    second = ad.evaluate(TRAIN[3:6], dict(SEED))
    assert second.scores == [0.0, 0.0, 0.0] and ad.budget_hit and ad.placeholder_evals == 1
    assert len(runner.jobs) == 1 and second.num_metric_calls == 0


def test_reflective_dataset_per_role_and_tag_proposer(tmp_path):
    ad = PipelineAdapter(evaluator(tmp_path, Runner(), Budget()), reflect, question_of=lambda k: f"Q{k[1]}", n_traces=2)
    batch = ad.evaluate(TRAIN[:4], dict(SEED), capture_traces=True)
    ds = ad.make_reflective_dataset(dict(SEED), batch, ["coder", "tester"])
    assert set(ds) == {"coder", "tester"} and len(ds["coder"]) == 2
    rec = ds["coder"][0]  # problem 1 needs one '+', has none
    assert rec["Inputs"] == {"problem": "Q1", "agent_input": "QUESTION 1"}
    assert rec["Generated Outputs"].startswith("```python")
    assert "FAIL" in rec["Feedback"] and "0/1" in rec["Feedback"] and "in1" in rec["Feedback"] and "out1" in rec["Feedback"]
    assert ds["tester"][0]["Generated Outputs"] == "looks fine"
    new = ad.propose_new_texts(dict(SEED), ds, ["coder"])
    assert new == {"coder": "Solve it.+" + FENCE}
    bad = PipelineAdapter(ad.evaluator, lambda m, s: ChatReply("```python\nprint('no tags')\n```"))
    assert bad.propose_new_texts(dict(SEED), ds, ["coder"]) == {} and bad.unparsable == 1


def test_config_params():
    """The YAML's settings reach the run typed; a key GEPA lacks fails at composition, a bad choice at the check."""
    from omegaconf.errors import ConfigKeyError

    from apps_bench.config.validate import InvalidSettings, check_settings

    assert optimizer_params("gepa", minibatch=5).minibatch == 5
    with pytest.raises(ConfigKeyError, match="unknown"):
        optimizer_params("gepa", unknown=1)
    with pytest.raises(InvalidSettings, match="component_selection"):
        check_settings(cell_data(compose_cell("dataset=apps", "optimizer=gepa", "optimizer.params.component_selection=random")))
    assert isinstance(PromptSet(SEED).texts, dict)


def test_adapter_state_roundtrip_for_gepa_run_dir_resume(tmp_path):
    """GEPA persists adapter state in its run_dir: charged rollouts and the proposal counter survive."""
    cache = RolloutCache(tmp_path / "c.sqlite")
    b1 = Budget()
    a1 = PipelineAdapter(evaluator(tmp_path, Runner(), b1, cache), reflect, budget=b1)
    a1.evaluate(TRAIN[:3], dict(SEED))
    a1.propose_new_texts(dict(SEED), {"coder": []}, ["coder"])
    state = a1.get_adapter_state()
    b2 = Budget()
    runner2 = Runner()
    a2 = PipelineAdapter(evaluator(tmp_path, runner2, b2, cache), reflect, budget=b2)
    a2.set_adapter_state(state)
    assert a2.proposals == 1 and (b2.rollouts, b2.fresh_rollouts) == (3, 3)
    a2.evaluate(TRAIN[:3], dict(SEED))  # the seed re-scoring on resume: from the cache, not charged again
    assert (b2.rollouts, b2.fresh_rollouts) == (3, 3) and runner2.jobs == []
