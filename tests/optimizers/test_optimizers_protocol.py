"""The optimizer protocol: pool, splits, manifest, scoring gate, budgets, paired seeds."""

from __future__ import annotations

import json

import pytest
from conftest import optimizer_params

from apps_bench.optimizers.protocol import (
    Budget,
    BudgetExhausted,
    EvalKeyError,
    EvalSet,
    ScoringGate,
    build_pool,
    key_str,
    load_eval_set,
    make_key,
    make_splits,
    manifest_dict,
    parse_key,
    question_hash,
    read_manifest_splits,
    request_seed,
    write_manifest,
)
from apps_bench.types import Problem
from apps_bench.types import TestSuite as Suite


def _p(pid, split="train", difficulty="interview", question=None, n_tests=1) -> Problem:
    tests = Suite(tuple(["1\n"] * n_tests), tuple(["1\n"] * n_tests))
    return Problem(id=str(pid), question=question or f"question {split} {pid}", tests=tests, difficulty=difficulty, split=split)


@pytest.fixture(scope="module")
def train_rows(apps_data_dir):
    from conftest import compose_cell

    from apps_bench.data import load_problems

    res = load_problems(compose_cell("dataset=apps_train", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}").dataset)
    return res.problems


def test_pool_from_real_train_rows_keeps_interview_only(train_rows):
    eval_set = EvalSet(frozenset({("test", str(i)) for i in range(50)}))
    pool = build_pool(train_rows, eval_set=eval_set, source="train")
    assert len(pool.problems) == 50  # train_mini150: 50 interview rows, all with tests
    assert pool.dropped == {"other_difficulty": 100}
    assert all(k[0] == "train" and p.difficulty == "interview" for k, p in pool.problems.items())
    # train ids overlap eval ids numerically; keys carry the split, so they are kept
    assert {k for k in pool.problems if k[1] in {str(i) for i in range(50)}}


def test_pool_drops_eval_questions_and_eval_keys(train_rows):
    victim = next(p for p in train_rows if p.difficulty == "interview")
    # a re-wrapped copy of the question (extra whitespace) still matches
    copy = Problem(id="0", question="  " + victim.question.replace(" ", "  ") + "\n", tests=victim.tests, split="test")
    eval_set = EvalSet(frozenset({("test", "0")})).with_questions([copy])
    pool = build_pool(train_rows, eval_set=eval_set, source="train")
    assert victim.key not in pool.problems and pool.dropped["eval_question"] == 1
    mixed = [_p(8, "test"), _p(9, "test"), _p(203, "test"), _p(204, "test", n_tests=0), _p(5, "train")]
    pool = build_pool(mixed, eval_set=EvalSet(frozenset({("test", "8"), ("test", "9")})), source="test_minus_eval")
    assert pool.keys() == [("test", "203")]
    assert pool.dropped == {"eval_key": 2, "no_tests": 1, "other_split": 1}
    with pytest.raises(ValueError, match="unknown pool source"):
        build_pool(mixed, eval_set=EvalSet(frozenset()), source="everything")


def test_splits_disjoint_reproducible_and_sized():
    pool = build_pool([_p(i) for i in range(30)], eval_set=EvalSet(frozenset()))
    s1 = make_splits(pool, train_size=10, val_size=5, split_seed=1)
    s2 = make_splits(pool, train_size=10, val_size=5, split_seed=1)
    s3 = make_splits(pool, train_size=10, val_size=5, split_seed=2)
    assert s1 == s2 and s1.train != s3.train
    assert len(s1.train) == 10 and len(s1.val) == 5 and not set(s1.train) & set(s1.val)
    # input order does not matter: the pool is sorted before drawing
    rev = build_pool([_p(i) for i in reversed(range(30))], eval_set=EvalSet(frozenset()))
    assert make_splits(rev, train_size=10, val_size=5, split_seed=1) == s1
    with pytest.raises(ValueError, match="pool holds 30 usable problems"):
        make_splits(pool, train_size=25, val_size=10, split_seed=0)


def test_manifest_written_once_and_checked(tmp_path):
    pool = build_pool([_p(i) for i in range(12)], eval_set=EvalSet(frozenset()))
    splits = make_splits(pool, train_size=4, val_size=3, split_seed=0)
    ev = EvalSet(frozenset({("test", str(i)) for i in range(50)}))
    m = manifest_dict(splits, pool, dataset_revision="abc123", eval_set=ev)
    path = write_manifest(tmp_path / "manifest.json", m)
    data = json.loads(path.read_text())
    assert data["dataset_revision"] == "abc123" and data["split_seed"] == 0 and data["eval_keys_excluded"] == 50
    assert data["train"][0] == {
        "split": "train",
        "problem_id": splits.train[0][1],
        "question_sha256": question_hash(pool.problems[splits.train[0]].question),
    }
    assert read_manifest_splits(path) == splits
    write_manifest(path, m)  # same manifest: a resume, accepted
    other = manifest_dict(make_splits(pool, train_size=4, val_size=3, split_seed=1), pool, dataset_revision="abc123", eval_set=ev)
    with pytest.raises(ValueError, match="different split manifest"):
        write_manifest(path, other)


def test_gate_refuses_eval_keys_outside_final_evaluation():
    ev = EvalSet(frozenset({("test", "3")}))
    gate = ScoringGate(ev)
    gate.check([("train", "3"), ("test", "60")])
    with pytest.raises(EvalKeyError, match=r"refusing to score eval problems \['test/3'\]"):
        gate.check([("train", "1"), ("test", "3")])
    with gate.final_evaluation():
        gate.check([("test", "3")])
    with pytest.raises(EvalKeyError):
        gate.check([("test", "3")])  # closed again
    pool = build_pool([_p(i) for i in range(6)], eval_set=ev)
    strict = ScoringGate(ev, make_splits(pool, train_size=2, val_size=2, split_seed=0))
    with pytest.raises(EvalKeyError, match="not in this run's train/val manifest"):
        strict.check([("train", "99")])


def test_eval_set_from_data_module():
    ev = load_eval_set()
    assert ev.keys == frozenset(("test", str(i)) for i in range(50))


def test_keys_roundtrip():
    assert make_key("train", 12) == ("train", "12")
    assert parse_key(key_str(("test", "7"))) == ("test", "7")
    with pytest.raises(ValueError, match="split/problem_id"):
        parse_key("7")


def test_budget_admits_until_cap_overshoot_one_batch():
    b = Budget(max_rollouts=10, max_task_tokens=None, max_optimizer_tokens=50)
    b.admit(8)
    for _ in range(8):
        b.charge_rollout(3, fresh=True)
    b.admit(4)  # 8 < 10: the whole batch may run
    for _ in range(4):
        b.charge_rollout(3, fresh=False)
    assert b.rollouts == 12 and b.fresh_rollouts == 8 and b.task_tokens == 36 and b.fresh_task_tokens == 24
    assert b.overshoot() == {"rollouts": 2, "task_tokens": 0, "optimizer_tokens": 0}
    assert b.overshoot()["rollouts"] < b.largest_batch
    with pytest.raises(BudgetExhausted, match="rollouts 12/10"):
        b.admit(1)
    b.admit(0)  # fully cached batches are always fine
    t = Budget(max_optimizer_tokens=10)
    t.charge_optimizer(11, fresh=True)
    assert t.exhausted_by() == "optimizer tokens 11/10"
    assert Budget.of(optimizer_params("maspo", budget={"rollouts": 5, "tokens": 100}).budget).max_task_tokens == 100
    assert json.loads(json.dumps(b.to_json()))["overshoot"]["rollouts"] == 2


def test_request_seed_paired_and_stable():
    k = ("train", "17")
    assert request_seed(0, k) == request_seed(0, ("train", "17"))
    assert request_seed(0, k) != request_seed(1, k)
    assert request_seed(0, k) != request_seed(0, ("test", "17"))
    assert request_seed(0, k) == 2013905945  # pinned: must not change across versions or processes
    assert 0 <= request_seed(123, k) < 2**31 - 1
