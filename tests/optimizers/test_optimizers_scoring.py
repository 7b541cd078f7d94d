"""Scoring through the protocol: gate, paired seeds, cache, budget; rollouts from attempts;
tagged proposals and the cached optimizer model."""

from __future__ import annotations

import pytest

from apps_bench.optimizers.cache import RolloutCache
from apps_bench.optimizers.proposals import (
    CachedChat,
    ChatReply,
    ModelProposer,
    feedback_text,
    parse_tagged,
    proposal_messages,
    role_examples,
)
from apps_bench.optimizers.protocol import Budget, BudgetExhausted, EvalKeyError, EvalSet, ScoringGate, request_seed
from apps_bench.optimizers.scoring import (
    PERFECT_SCORE,
    EvalRecord,
    Objective,
    ProtocolEvaluator,
    RoleTrace,
    Rollout,
    example_score,
    objective,
    program_win,
    rollout_from_attempt,
    traces_from_transcript,
)
from apps_bench.topologies.base import PromptSet
from apps_bench.types import Attempt, Outcome, Problem, TranscriptEvent, Usage, Verdict
from apps_bench.types import TestResult as Result
from apps_bench.types import TestSuite as Suite

TRAIN = [("train", str(i)) for i in range(10)]


class FakeRunner:
    """Passes a problem when the coder prompt has at least (id % 3) '+' signs."""

    def __init__(self, fail_keys=()):
        self.jobs: list[tuple[dict, list]] = []
        self.fail_keys = set(fail_keys)

    def run_batch(self, prompt_set, jobs):
        self.jobs.append((dict(prompt_set.texts), list(jobs)))
        out = []
        for key, seed in jobs:
            if key in self.fail_keys:
                out.append(Rollout(key=key, seed=seed, error="model unreachable"))
                continue
            need = int(key[1]) % 3
            have = prompt_set["coder"].count("+")
            out.append(
                Rollout(
                    key=key,
                    seed=seed,
                    program="print(1)",
                    passed=have >= need,
                    pass_fraction=min(1.0, have / need) if need else 1.0,
                    tests_passed=min(have, need),
                    n_tests=max(need, 1),
                    task_tokens=10,
                    traces=(RoleTrace("coder", "coder", f"problem {key[1]}", "```python\nprint(1)\n```"),),
                )
            )
        return out


def make_eval(tmp_path, runner, budget=None, records=None, cache=None):
    return ProtocolEvaluator(
        runner=runner,
        cache=cache or RolloutCache(tmp_path / "cache.sqlite"),
        budget=budget or Budget(),
        gate=ScoringGate(EvalSet(frozenset({("test", str(i)) for i in range(50)}))),
        run_seed=0,
        model={"id": "gold"},
        settings={"topology": "single"},
        on_evaluate=records.append if records is not None else None,
    )


def test_paired_seeds_cache_and_single_charge(tmp_path):
    runner = FakeRunner()
    records: list[EvalRecord] = []
    ev = make_eval(tmp_path, runner, records=records)
    a, b = PromptSet({"coder": "+"}), PromptSet({"coder": "++"})
    ra = ev.evaluate(a, TRAIN[:4])
    rb = ev.evaluate(b, TRAIN[:4])
    # the same request seed per problem for every candidate, derived from (run seed, key)
    assert [s for _, s in runner.jobs[0][1]] == [s for _, s in runner.jobs[1][1]]
    assert runner.jobs[0][1][2] == (TRAIN[2], request_seed(0, TRAIN[2]))
    assert [r.passed for r in ra] == [True, True, False, True] and all(r.passed for r in rb)
    again = ev.evaluate(a, TRAIN[:4])  # a repeat: no run, no charge
    assert len(runner.jobs) == 2 and all(r.cached for r in again)
    assert [r.to_json() for r in again] == [r.to_json() for r in ra]
    assert ev.budget.rollouts == 8 and ev.budget.task_tokens == 80 and ev.budget.fresh_rollouts == 8
    assert [(r.fresh, r.cached, r.charged) for r in records] == [(4, 0, 4), (4, 0, 4), (0, 4, 0)]
    # a partly new batch runs only the new problems
    ev.evaluate(a, TRAIN[2:6])
    assert [k for k, _ in runner.jobs[-1][1]] == TRAIN[4:6] and ev.budget.rollouts == 10


def test_eval_keys_refused_before_anything_runs(tmp_path):
    runner = FakeRunner()
    ev = make_eval(tmp_path, runner)
    with pytest.raises(EvalKeyError, match="test/7"):
        ev.evaluate(PromptSet({"coder": "+"}), [TRAIN[0], ("test", "7")])
    assert runner.jobs == [] and ev.budget.rollouts == 0
    ev.evaluate(PromptSet({"coder": "+"}), [("test", "50")])  # outside the eval IDs: allowed


def test_budget_cap_overshoot_at_most_one_batch(tmp_path):
    runner = FakeRunner()
    ev = make_eval(tmp_path, runner, budget=Budget(max_rollouts=5))
    ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:4])
    ev.evaluate(PromptSet({"coder": "++"}), TRAIN[:4])  # starts at 4 < 5: runs whole
    assert ev.budget.rollouts == 8 and ev.budget.overshoot()["rollouts"] == 3 < ev.budget.largest_batch
    with pytest.raises(BudgetExhausted):
        ev.evaluate(PromptSet({"coder": "+++"}), TRAIN[:1])
    assert len(runner.jobs) == 2
    # what is already charged stays free after the cap
    assert len(ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:4])) == 4


def test_infrastructure_errors_are_not_cached(tmp_path):
    runner = FakeRunner(fail_keys={TRAIN[1]})
    ev = make_eval(tmp_path, runner)
    r = ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:2])
    assert r[1].error and ev.cache.count() == 1
    runner.fail_keys.clear()
    r = ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:2])
    assert r[1].error is None and [k for k, _ in runner.jobs[-1][1]] == [TRAIN[1]]


def test_a_batch_that_only_fails_for_infrastructure_stops_the_run(tmp_path):
    from apps_bench.optimizers.scoring import InfrastructureDown

    runner = FakeRunner(fail_keys=set(TRAIN[:3]))
    ev = make_eval(tmp_path, runner)
    with pytest.raises(InfrastructureDown, match="model unreachable"):
        ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:3])
    assert ev.budget.rollouts == 3 and ev.cache.count() == 0  # spent, charged, not cached
    runner.fail_keys.clear()
    assert all(r.error is None for r in ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:3]))
    assert ev.budget.rollouts == 3  # the retry is not charged twice


def test_resume_replays_through_cache_with_same_charges(tmp_path):
    cache = RolloutCache(tmp_path / "c.sqlite")
    first = make_eval(tmp_path, FakeRunner(), cache=cache)
    seq = [
        (PromptSet({"coder": "+"}), TRAIN[:3]),
        (PromptSet({"coder": "++"}), TRAIN[1:5]),
        (PromptSet({"coder": "+"}), TRAIN[:3]),
    ]
    out1 = [first.evaluate(p, k) for p, k in seq]
    runner2 = FakeRunner()
    second = make_eval(tmp_path, runner2, cache=cache)  # a rerun after a kill: fresh budget, same cache
    out2 = [second.evaluate(p, k) for p, k in seq]
    assert runner2.jobs == []
    assert [[r.to_json() for r in o] for o in out1] == [[r.to_json() for r in o] for o in out2]
    assert (second.budget.rollouts, second.budget.task_tokens) == (first.budget.rollouts, first.budget.task_tokens) == (7, 70)
    assert second.budget.fresh_rollouts == 0
    third = make_eval(tmp_path, FakeRunner(), cache=cache)
    third.restore(first.state())
    third.evaluate(*seq[0])
    assert third.budget.rollouts == 7  # already charged in the restored state


def test_objective_strict_first_fraction_breaks_ties():
    r = lambda p, f: Rollout(key=("train", "0"), seed=0, passed=p, pass_fraction=f)  # noqa: E731
    assert objective([r(True, 1.0), r(False, 0.5)]) == Objective(0.5, 0.75)
    assert objective([r(True, 1.0), r(False, 0.0)]) > objective([r(False, 0.9), r(False, 0.9)])
    assert objective([r(False, 0.6)]) > objective([r(False, 0.5)])
    # per-example scores: 999 near-passes never outweigh one pass
    assert example_score(r(True, 1.0)) == PERFECT_SCORE
    assert 999 * example_score(r(False, 1.0)) < 1.0
    assert program_win((True, 1.0), (False, 0.9)) == 1.0 and program_win((False, 0.2), (False, 0.2)) == 0.5
    assert program_win((False, 0.1), (False, 0.2)) == 0.0


def test_rollout_from_attempt_traces_and_first_failure():
    problem = Problem(
        id="4", question="Add.", tests=Suite(("1 2\n", "3 4\n"), ("3\n", "7\n")), split="train", solutions=("SECRET_REFERENCE",)
    )
    ev = [
        TranscriptEvent("analyzer", "analyzer", "input", "QUESTION: Add."),
        TranscriptEvent("analyzer", "analyzer", "reply", "plan"),
        TranscriptEvent("coder", "coder", "input", "QUESTION: Add.\nplan"),
        TranscriptEvent("coder", "coder", "tool_call", "python_exec(...)"),
        TranscriptEvent("coder", "coder", "tool_result", "3"),
        TranscriptEvent("coder", "coder", "reply", "```python\nprint(3)\n```"),
    ]
    attempt = Attempt(program="print(3)", transcript=ev, usage=Usage(prompt_tokens=7, completion_tokens=5, model_calls=2))
    verdict = Verdict("4", False, 2, 2, 1, (Result(0, Outcome.PASS), Result(1, Outcome.WRONG_ANSWER, detail="got 3")), "seed")
    r = rollout_from_attempt(problem, 11, attempt, verdict)
    assert r.key == ("train", "4") and r.seed == 11 and r.pass_fraction == 0.5 and r.task_tokens == 12
    assert r.first_failure.index == 1 and r.first_failure.input == "3 4\n" and r.first_failure.expected == "7\n"
    assert [t.agent for t in r.traces] == ["analyzer", "coder"]
    assert r.traces[1].input == "QUESTION: Add.\nplan" and r.traces[1].output.startswith("```python")
    assert r.traces[1].tool_calls == ("tool_call: python_exec(...)", "tool_result: 3")
    assert Rollout.from_json(r.to_json()) == r
    assert "SECRET_REFERENCE" not in str(r.to_json())
    assert "7\n" in feedback_text(r) and "1/2" in feedback_text(r)
    rounds = traces_from_transcript(
        [TranscriptEvent("d1", "debater", "reply", "a", 0), TranscriptEvent("d1", "debater", "reply", "b", 1)]
    )
    assert [(t.round, t.output) for t in rounds] == [(0, "a"), (1, "b")]


def test_parse_tagged_survives_code_fences_and_rejects_incomplete():
    prompt = "You are a coder.\nEnd with:\n```python\n# solution\n```\nNever print debug output."
    reply = f"<analysis>too chatty</analysis>\n<modification>add a rule</modification>\n<prompt>\n{prompt}\n</prompt>"
    tp = parse_tagged(reply)
    assert tp.prompt == prompt and tp.analysis == "too chatty" and tp.modification == "add a rule"
    assert parse_tagged("```python\nx\n```") is None
    assert parse_tagged("<prompt>truncated reply") is None
    assert parse_tagged("<prompt>  </prompt>") is None
    assert parse_tagged("<PROMPT>a <prompt> b</PROMPT>").prompt == "a <prompt> b"


def test_cached_chat_replays_and_charges_optimizer_tokens_once(tmp_path):
    calls = []

    def chat(messages, seed):
        calls.append(seed)
        return ChatReply(f"<prompt>v{seed}</prompt>", tokens=100)

    cache = RolloutCache(tmp_path / "c.sqlite")
    b = Budget(max_optimizer_tokens=250)
    cc = CachedChat(chat, cache, {"id": "opt"}, b)
    msgs = [{"role": "user", "content": "x"}]
    assert cc(msgs, 1).text == "<prompt>v1</prompt>"
    assert cc(msgs, 1).text == "<prompt>v1</prompt>" and calls == [1]
    cc(msgs, 2)
    cc(msgs, 3)  # starts at 200 < 250
    assert b.optimizer_tokens == 300 and b.optimizer_calls == 3
    with pytest.raises(BudgetExhausted, match="optimizer tokens"):
        cc(msgs, 4)
    cc2 = CachedChat(chat, cache, {"id": "opt"}, Budget())
    assert cc2(msgs, 2).text == "<prompt>v2</prompt>" and calls == [1, 2, 3]
    assert cc2.budget.optimizer_tokens == 100 and cc2.budget.fresh_optimizer_tokens == 0


def test_model_proposer_ksub_variations_without_reference_solutions():
    seen = []

    def chat(messages, seed):
        seen.append(messages)
        n = len(seen)
        if n == 2:
            return ChatReply("no tags at all")
        if n == 3:
            return ChatReply("<prompt>P1</prompt>")  # duplicate of the first: dropped
        return ChatReply(f"<analysis>a</analysis><modification>m</modification><prompt>P{n}</prompt>")

    rollouts = [
        Rollout(
            key=("train", str(i)),
            seed=0,
            passed=i == 0,
            program="x",
            tests_passed=0,
            n_tests=1,
            traces=(RoleTrace("coder", "coder", f"in{i}", f"out{i}"),),
        )
        for i in range(7)
    ]
    questions = {("train", str(i)): f"Question {i}" for i in range(7)}
    mp = ModelProposer(chat, ksub=4, n_traces=5, question_of=questions.__getitem__)
    assert mp("coder", "P0", rollouts) == ["P1", "P4"]
    assert mp.rejected == 2
    user = seen[0][1]["content"]
    assert user.count("### Example") == 5 and "Question 1" in user and "Question 0" not in user  # failures first
    assert "in1" in user and "out1" in user and "<current_prompt>\nP0\n</current_prompt>" in user
    ex = role_examples("coder", rollouts, questions.__getitem__, limit=2)
    assert [e["problem"] for e in ex] == ["Question 1", "Question 2"]
    assert proposal_messages("coder", "P", ex)[0]["role"] == "system"


def test_replayed_tokens_are_reported_apart_not_charged(tmp_path):
    """A partial re-run's replayed answers are not spent: the budget charges the rollout's
    spent tokens and books the replayed ones apart, the same again after a resume."""
    import dataclasses

    class Replaying(FakeRunner):
        def run_batch(self, prompt_set, jobs):
            return [dataclasses.replace(r, replayed_tokens=30) for r in super().run_batch(prompt_set, jobs)]

    ev = make_eval(tmp_path, Replaying(), budget=Budget(max_task_tokens=50))
    ev.evaluate(PromptSet({"coder": "+"}), TRAIN[:4])
    assert (ev.budget.task_tokens, ev.budget.replayed_task_tokens) == (40, 120)
    assert ev.budget.to_json()["replayed_task_tokens"] == 120 and not ev.budget.exhausted  # 40 < 50: replays not charged
    resumed = make_eval(tmp_path, FakeRunner(), cache=RolloutCache(tmp_path / "cache.sqlite"))
    resumed.evaluate(PromptSet({"coder": "+"}), TRAIN[:4])  # from the rollout cache, charged as the first time
    assert (resumed.budget.task_tokens, resumed.budget.replayed_task_tokens, resumed.budget.fresh_rollouts) == (40, 120, 0)
