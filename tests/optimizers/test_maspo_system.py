"""MASPO end to end over the protocol (gate, paired seeds, cache, budget) with a synthetic
two-stage pipeline, execution-grounded comparisons, and a kill followed by a resume.

Synthetic pipeline analyzer -> coder: the analyzer replies "plan" plus one '+' per '+'
in its prompt (no program); the coder replies a program `print(N)` with
N = (+ in analyzer prompt) + (+ in coder prompt) - (- in coder prompt). Problem i passes
when N >= i % 5. The optimizer model answers in tags, adding '+' on even seeds and '-'
on odd ones; the text judge prefers the output with more '+'.
"""

from __future__ import annotations

import re

import pytest
from conftest import optimizer_params

from apps_bench.optimizers.cache import Checkpoints, RolloutCache
from apps_bench.optimizers.maspo import Maspo, MaspoConfig, graph_for
from apps_bench.optimizers.maspo_system import EvaluatorSystem, ModelTextJudge, symmetric_win
from apps_bench.optimizers.proposals import CachedChat, ChatReply, ModelProposer
from apps_bench.optimizers.protocol import Budget, EvalSet, ScoringGate, Splits
from apps_bench.optimizers.scoring import ProtocolEvaluator, RoleTrace, Rollout

TRAIN = [("train", str(i)) for i in range(100, 120)]
VAL = [("train", str(i)) for i in range(200, 205)]
EVAL = EvalSet(frozenset(("test", str(i)) for i in range(50)))
SEED = {"analyzer": "Plan.", "coder": "Code."}


def need(key) -> int:
    return int(key[1]) % 5


def n_of(prompts) -> int:
    return prompts["analyzer"].count("+") + prompts["coder"].count("+") - prompts["coder"].count("-")


class Killed(Exception):
    pass


class Pipeline:
    def __init__(self, die_after: int | None = None):
        self.batches = 0
        self.die_after = die_after
        self.keys_seen: set = set()

    def run_batch(self, prompt_set, jobs):
        if self.die_after is not None and self.batches >= self.die_after:
            raise Killed("kill -9")
        self.batches += 1
        p = dict(prompt_set.texts)
        n = n_of(p)
        out = []
        for key, seed in jobs:
            self.keys_seen.add(key)
            ok = max(0, n) >= need(key)
            out.append(
                Rollout(
                    key=key,
                    seed=seed,
                    program=f"print({n})",
                    passed=ok,
                    pass_fraction=1.0 if ok else max(0, n) / need(key),
                    n_tests=1,
                    tests_passed=int(ok),
                    task_tokens=5,
                    traces=(
                        RoleTrace("analyzer", "analyzer", f"Q{key[1]}", "plan" + "+" * p["analyzer"].count("+")),
                        RoleTrace("coder", "coder", f"Q{key[1]} + plan", f"```python\nprint({n})\n```"),
                    ),
                )
            )
        return out


def extract(text: str):
    m = re.search(r"```python\n(.*?)```", text, re.S)
    return m.group(1).strip() if m else None


def judge_program(key, program):
    n = int(re.search(r"print\((-?\d+)\)", program).group(1))
    ok = max(0, n) >= need(key)
    return (ok, 1.0 if ok else max(0, n) / need(key))


def plus_judge(question, first, second):
    a, b = first.count("+"), second.count("+")
    return "first" if a > b else "second" if b > a else "tie"


def optimizer_model(messages, seed):
    cur = re.search(r"<current_prompt>\n(.*)\n</current_prompt>", messages[1]["content"], re.S).group(1)
    return ChatReply(
        f"<analysis>x</analysis><modification>y</modification><prompt>{cur}{'+' if seed % 2 == 0 else '-'}</prompt>", 20
    )


def build(tmp_path, cache_name, pipeline, max_rollouts=None, T=2, D=2):
    cache = RolloutCache(tmp_path / cache_name)
    budget = Budget(max_rollouts=max_rollouts)
    ev = ProtocolEvaluator(
        pipeline,
        cache,
        budget,
        ScoringGate(EVAL, Splits(tuple(TRAIN), tuple(VAL), 0)),
        run_seed=0,
        model={"id": "synthetic"},
        settings={"flow": "sequential"},
    )
    graph = graph_for("sequential", ["analyzer", "coder"])
    system = EvaluatorSystem(ev, graph, judge_program=judge_program, extract_program=extract, text_judge=plus_judge)
    chat = CachedChat(optimizer_model, cache, {"id": "opt"}, budget)
    proposer = ModelProposer(chat, ksub=2, question_of=lambda k: f"Q{k[1]}")
    cfg = MaspoConfig.of(optimizer_params("maspo", K=2, Ksub=2, T=T, D=D, minibatch=4, seed=1))
    return Maspo(
        graph, SEED, system, proposer, TRAIN, cfg, budget=budget, checkpoints=Checkpoints(tmp_path / f"ck_{cache_name}")
    ), budget


def test_comparisons_are_execution_grounded_and_symmetric():
    graph = graph_for("sequential", ["analyzer", "coder"])
    pipe = Pipeline()

    class Direct:
        def evaluate(self, ps, keys, capture_traces=True):
            return pipe.run_batch(ps, [(k, 0) for k in keys])

    sys_ = EvaluatorSystem(Direct(), graph, judge_program=judge_program, extract_program=extract, text_judge=plus_judge)
    keys = [("train", "102"), ("train", "105")]  # need 2 and 0
    parent = {"analyzer": "Plan.", "coder": "Code.+"}
    child = {"analyzer": "Plan.+", "coder": "Code.+"}
    cmp = sys_.compare("analyzer", parent, child, keys, sys_.run(parent, keys))
    # analyzer outputs hold no program: the text judge (both orders agree) says the child wins
    assert [p.local for p in cmp.per_problem] == [1.0, 1.0]
    # coder (successor) programs: print(2) vs print(1) on need 2 -> win; on need 0 both pass -> tie
    assert [p.lookahead for p in cmp.per_problem] == [1.0, 0.5]
    assert [p.global_ for p in cmp.per_problem] == [1.0, 0.5]
    # the coder has no successor: lookahead is the global result
    cmp2 = sys_.compare("coder", parent, {"analyzer": "Plan.", "coder": "Code.-"}, keys, sys_.run(parent, keys))
    assert [(p.local, p.lookahead, p.global_) for p in cmp2.per_problem] == [(0.0, 0.0, 0.0), (0.5, 0.5, 0.5)]

    # an infrastructure failure on either side is no evidence: a tie on every term
    class Flaky(Direct):
        def evaluate(self, ps, keys, capture_traces=True):
            out = super().evaluate(ps, keys, capture_traces)
            return [Rollout(key=r.key, seed=0, error="model unreachable") if ps.texts == child else r for r in out]

    flaky = EvaluatorSystem(Flaky(), graph, judge_program=judge_program, extract_program=extract, text_judge=plus_judge)
    cmp3 = flaky.compare("analyzer", parent, child, keys, flaky.run(parent, keys))
    assert [(p.local, p.lookahead, p.global_) for p in cmp3.per_problem] == [(0.5, 0.5, 0.5)] * 2
    # a position-biased judge (always "first") disagrees with itself across orders: a tie
    assert symmetric_win(lambda q, a, b: "first", "", "x", "y+") == 0.5
    assert symmetric_win(plus_judge, "", "x", "y+") == 1.0 and symmetric_win(plus_judge, "", "x+", "y") == 0.0
    mj = ModelTextJudge(lambda m, s: ChatReply("I pick <winner> Second </winner>"))
    assert mj("q", "a", "b") == "second"
    assert ModelTextJudge(lambda m, s: ChatReply("no idea"))("q", "a", "b") == "tie"


def test_maspo_over_protocol_improves_and_never_touches_eval_or_val(tmp_path):
    pipe = Pipeline()
    m, budget = build(tmp_path, "a.sqlite", pipe)
    res = m.run()
    assert res.stopped == "done"
    assert n_of(res.prompts) > n_of(SEED) and res.prompts["coder"].count("-") == 0
    assert pipe.keys_seen <= set(TRAIN)  # optimization only ever ran training problems
    assert budget.rollouts == budget.fresh_rollouts > 0 and budget.optimizer_calls > 0
    assert Checkpoints(tmp_path / "ck_a.sqlite").steps() == list(range(1, res.steps_done + 1))


def test_estimate_is_an_upper_bound_of_what_runs(tmp_path):
    m, budget = build(tmp_path, "e.sqlite", Pipeline(), T=2, D=2)
    res = m.run()
    assert res.stopped == "done" and 0 < budget.rollouts <= m.plan.estimated_rollouts


def test_token_cap_stops_maspo_with_overshoot_at_most_one_batch(tmp_path):
    m, budget = build(tmp_path, "b.sqlite", Pipeline(), T=3, D=3)
    budget.max_task_tokens = 50  # 5 tokens per rollout: the cap falls after 10 rollouts
    res = m.run()
    assert res.stopped == "budget" and res.events[-1]["kind"] == "stopped"
    assert budget.task_tokens >= 50 and budget.overshoot()["task_tokens"] < 5 * 4  # one minibatch of 4
    assert budget.rollouts == budget.task_tokens // 5
    assert res.prompts == m.prompts  # what was written before the cap is the answer


def test_kill_and_rerun_gives_same_prompts_and_same_charged_budget(tmp_path):
    ref_pipe = Pipeline()
    ref, ref_budget = build(tmp_path, "ref.sqlite", ref_pipe)
    expected = ref.run()

    killed, _ = build(tmp_path, "run.sqlite", Pipeline(die_after=7))
    with pytest.raises(Killed):
        killed.run()
    rerun_pipe = Pipeline()
    again, budget = build(tmp_path, "run.sqlite", rerun_pipe)
    got = again.run()
    assert got.prompts == expected.prompts and got.visits == expected.visits
    assert [(n.text, n.score) for n in got.beams["coder"]] == [(n.text, n.score) for n in expected.beams["coder"]]
    assert (budget.rollouts, budget.task_tokens, budget.optimizer_tokens) == (
        ref_budget.rollouts,
        ref_budget.task_tokens,
        ref_budget.optimizer_tokens,
    )
    # the 7 pipeline batches run before the kill were served from the cache, not run again
    assert rerun_pipe.batches == ref_pipe.batches - 7
    assert budget.fresh_rollouts < budget.rollouts
