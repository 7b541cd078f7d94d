"""Judge.score on the real sandbox: gold solutions, wrong programs, each outcome, stop_on_first_failure."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps_bench import types as T
from apps_bench.data import DEMO_PROBLEMS, load_problems
from apps_bench.judge import Judge, has_sandbox_error, summarize
from apps_bench.judge.profiles import judge_config

O = T.Outcome


@pytest.fixture(scope="module")
def mini150(apps_data_dir):
    from conftest import compose_cell

    return load_problems(
        compose_cell("dataset=apps_train", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}").dataset, max_tests_per_row=0
    )


def stdin_problem(n=4):
    """Echo the doubled number; n tests."""
    return T.Problem(
        id="dbl",
        question="double it",
        tests=T.TestSuite(tuple(f"{i}\n" for i in range(n)), tuple(f"{2 * i}\n" for i in range(n)), None, n),
        difficulty="introductory",
    )


CALL = T.Problem(
    id="add",
    question="add",
    tests=T.TestSuite(([1, 2], [3, 4], [10, -3]), ([3], [7], [7]), "add", 3),
    difficulty="interview",
)


def test_demo_reference_solutions_pass(judge):
    for p in DEMO_PROBLEMS:
        v = judge.score(p, p.solutions[0])
        assert v.passed, (p.id, v.results)
        assert v.tests_run == v.tests_passed == v.n_tests == len(p.tests)
        assert v.profile == "seed" and v.extracted
        assert all(r.outcome is O.PASS for r in v.results)


def test_wrong_program_fails_with_wrong_answer(judge):
    v = judge.score(DEMO_PROBLEMS[0], "input()\nprint('0 0')\n")
    assert not v.passed and v.results[0].outcome is O.WRONG_ANSWER
    assert v.tests_run == 1 and v.tests_passed == 0  # stop_on_first_failure is the profile default


def test_stop_on_first_failure_counts(pool):
    p = stdin_problem(5)
    prog = "n = int(input())\nprint(2 * n if n < 2 else -1)\n"  # passes tests 0, 1; fails 2, 3, 4
    stop = Judge.from_config(pool, judge_config("seed", ["stop_on_first_failure=true"])).score(p, prog)
    assert (stop.passed, stop.n_tests, stop.tests_run, stop.tests_passed) == (False, 5, 3, 2)
    assert [r.outcome for r in stop.results] == [O.PASS, O.PASS, O.WRONG_ANSWER]
    full = Judge.from_config(pool, judge_config("seed", ["stop_on_first_failure=false"])).score(p, prog)
    assert (full.passed, full.n_tests, full.tests_run, full.tests_passed) == (False, 5, 5, 2)
    assert [r.index for r in full.results] == [0, 1, 2, 3, 4]


def test_each_failure_kind(pool):
    j = Judge.from_config(pool, judge_config("seed", ["timeout_s=1.0", "stop_on_first_failure=true"]))
    p = stdin_problem(2)
    cases = {
        "def broken(:\n": O.COMPILE_ERROR,
        "raise ValueError('boom')\n": O.RUNTIME_ERROR,
        "while True:\n    pass\n": O.TIMEOUT,
        "import sys\nsys.exit(3)\n": O.RUNTIME_ERROR,
        "import sys\nsys.stdout.write('x' * 50_000_000)\n": O.OUTPUT_LIMIT,
    }
    for prog, outcome in cases.items():
        v = j.score(p, prog)
        assert not v.passed and v.results[0].outcome is outcome, (prog, v.results)
        assert not has_sandbox_error(v)


def test_normal_exits_count_as_success(judge):
    p = stdin_problem(2)
    for tail in ("import sys\nsys.exit()\n", "import sys\nsys.exit(0)\n", "exit(0)\n"):
        v = judge.score(p, "print(2 * int(input()))\n" + tail)
        assert v.passed, (tail, v.results)


def test_compile_error_fails_every_test_without_stopping(pool):
    v = Judge.from_config(pool, judge_config("seed", ["stop_on_first_failure=false"])).score(stdin_problem(3), "def (:\n")
    assert not v.passed and v.tests_passed == 0
    assert all(r.outcome is O.COMPILE_ERROR for r in v.results) and v.tests_run in (1, 3)


def test_no_program_is_not_run(judge):
    v = judge.score(DEMO_PROBLEMS[0], None)
    assert (v.passed, v.extracted, v.tests_run, v.n_tests) == (False, False, 0, 4)


def test_call_based_targets_solution_class_or_function(judge):
    assert judge.score(CALL, "class Solution:\n    def add(self, a, b):\n        return a + b\n").passed
    assert judge.score(CALL, "def add(a, b):\n    return a + b\n").passed
    assert judge.score(CALL, "def add(a: int, b: int) -> List[int]:\n    return (a + b,)\n").passed  # prelude List, tuple
    v = judge.score(CALL, "def add(a, b):\n    return a - b\n")
    assert not v.passed and v.results[0].outcome is O.WRONG_ANSWER


def test_lying_eq_object_is_not_accepted(judge):
    prog = "class Liar:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\ndef add(a, b):\n    return Liar()\n"
    v = judge.score(CALL, prog)
    assert not v.passed and v.results[0].outcome is not O.PASS


def test_bool_not_accepted_for_number(judge):
    p = T.Problem(id="b", question="q", tests=T.TestSuite(([1],), ([True],), "f", 1))
    assert judge.score(p, "def f(x):\n    return True\n").passed
    assert not judge.score(p, "def f(x):\n    return 1\n").passed


def test_huge_integer_output(judge):
    big = 7**9000
    p = T.Problem(id="big", question="q", tests=T.TestSuite(("9000\n",), (f"{big}\n",), None, 1))
    assert judge.score(p, "print(7 ** int(input()))\n").passed


def test_pool_failure_is_sandbox_error_not_wrong_answer():
    from apps_bench.sandbox import SandboxPool

    closed = SandboxPool.from_config(judge_config("seed"), workers=1)
    closed.close()
    v = Judge.from_config(closed, judge_config("seed")).score(stdin_problem(2), "print(2 * int(input()))\n")
    assert has_sandbox_error(v) and not v.passed
    s = summarize([(stdin_problem(), v)])
    assert s.n_sandbox_errors == 1 and s.n_problems == 0  # never scored as a wrong answer


def test_verdict_json_record(judge):
    v = judge.score(DEMO_PROBLEMS[1], DEMO_PROBLEMS[1].solutions[0])
    rec = json.loads(json.dumps(v.to_json()))
    assert rec["id"] == "demo-call" and rec["passed"] is True and rec["profile"] == "seed"
    assert {r["outcome"] for r in rec["results"]} == {"pass"} and rec["tests_run"] == rec["n_tests"] == 4


def test_gold_solutions_of_train_mini150(judge, mini150):
    problems = mini150.problems
    with ThreadPoolExecutor(4) as ex:
        verdicts = list(ex.map(lambda p: judge.score(p, p.solutions[0]), problems))
    by_id = {p.id: v for p, v in zip(problems, verdicts)}
    assert not any(has_sandbox_error(v) for v in verdicts)
    call = [p for p in problems if p.tests.mode == "call"]
    assert len(call) == 12 and all(by_id[p.id].passed for p in call), {p.id: by_id[p.id].results for p in call}
    failing = {pid for pid, v in by_id.items() if not v.passed}
    assert failing <= KNOWN_GOLD_FAILURES | TIMING_MARGINAL, {
        pid: by_id[pid].results[-1] for pid in failing - KNOWN_GOLD_FAILURES
    }
    for pid, outcome in KNOWN_GOLD_FAILURES_OUTCOME.items():
        assert by_id[pid].results[-1].outcome is outcome, (pid, by_id[pid].results[-1])
    s = summarize(list(zip(problems, verdicts)))
    assert s.n_problems == 150 and s.n_passed == 150 - len(failing)
    assert set(s.by_difficulty) == {"introductory", "interview", "competition"}


# Reference solutions that fail under profile seed, and why (checked by hand; quirks of the data,
# identical under a bare one-process-per-test run):
KNOWN_GOLD_FAILURES_OUTCOME: dict[str, T.Outcome] = {
    # several correct answers; the reference prints a different valid one than the expected output
    **dict.fromkeys(["33", "2023", "2029", "2378", "2386", "2398", "2400"], O.WRONG_ANSWER),
    # written for the APPS reference harness, which wraps code in a function:
    # a top-level `return` / `nonlocal` is a SyntaxError in a real script
    **dict.fromkeys(["2036", "2038", "2046", "2382"], O.COMPILE_ERROR),
}
KNOWN_GOLD_FAILURES: set[str] = set(KNOWN_GOLD_FAILURES_OUTCOME)
TIMING_MARGINAL: set[str] = {"49"}  # its reference solution needs about 4 s on test 0 on this machine


# ---------------------------------------------------------------- summary (pure)


def _v(pid, passed, extracted=True, outcome=O.PASS):
    res = () if not extracted else (T.TestResult(0, outcome),)
    return T.Verdict(pid, passed, 1, len(res), int(passed), res, "seed", extracted=extracted)


def test_summary_pass_at_1_all_extracted_and_tiers():
    items = [
        ("introductory", _v("a", True)),
        ("introductory", _v("b", False, outcome=O.WRONG_ANSWER)),
        ("interview", _v("c", False, extracted=False)),
        ("competition", _v("d", True)),
        ("interview", _v("e", False, outcome=O.SANDBOX_ERROR)),  # infrastructure: not scored
    ]
    s = summarize(items, skipped={"empty_tests": 2})
    assert (s.n_problems, s.n_passed, s.n_extracted, s.n_sandbox_errors) == (4, 2, 3, 1)
    assert s.pass_at_1 == 0.5 and s.pass_at_1_extracted == pytest.approx(2 / 3)
    assert list(s.by_difficulty) == ["introductory", "interview", "competition"]
    assert s.by_difficulty["interview"].n == 1 and s.by_difficulty["interview"].pass_at_1 == 0.0
    d = s.to_dict()
    assert d["n_skipped"] == 2 and d["skipped"] == {"empty_tests": 2} and d["profile"] == "seed"
    assert d["by_difficulty"]["competition"] == {"n": 1, "passed": 1, "pass_at_1": 1.0}
    m = s.metrics()
    assert m["pass_at_1_introductory"] == 0.5 and m["n_sandbox_errors"] == 1
    json.dumps(d)  # plain data


def test_summary_from_verdict_records_and_table():
    recs = [{**_v("a", True).to_json(), "difficulty": "interview"}, {**_v("b", False).to_json(), "difficulty": "interview"}]
    s = summarize(recs, profile="seed", seconds=1.5)
    assert (s.n_problems, s.n_passed) == (2, 1)
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(s.table())
    text = console.export_text()
    assert "pass@1" in text and "0.5000" in text and "interview" in text and "1.50 s" in text


def test_summary_rejects_unknown_items():
    with pytest.raises(TypeError, match="pairs or verdict records"):
        summarize([42])


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="available: reference, seed"):
        judge_config("nonesuch")


def test_a_profile_judges_by_the_rules_class_its_target_names(pool):
    """conf/judge/<profile>.yaml names its rules by `_target_`: the class, not the profile's name, decides
    how a program runs and what a verdict keeps (here the seed's settings under the reference rules)."""
    seed, ref = judge_config("seed"), judge_config("reference")
    assert (seed._target_, ref._target_) == ("apps_bench.judge.rules.SeedRules", "apps_bench.judge.rules.ReferenceRules")
    p, prog = stdin_problem(2), "print(2 * int(input()))\n"
    as_seed = Judge.from_config(pool, seed)
    swapped = Judge.from_config(pool, dataclasses.replace(seed, _target_=ref._target_, program_timeout_s=11.0))
    assert (as_seed.score(p, prog).reference_results, swapped.score(p, prog).reference_results) == (None, (True, True))
    assert (as_seed.score(p, None).reference_results, swapped.score(p, None).reference_results) == (None, (-2,))
    with pytest.raises(ValueError, match="'reference' needs program_timeout_s"):  # the reference rules check their settings
        Judge.from_config(pool, dataclasses.replace(seed, _target_=ref._target_))


@pytest.mark.parametrize(
    "target, why",
    [
        ("apps_bench.judge.rules.Nope", "module apps_bench.judge.rules has no 'Nope'"),
        ("nowhere.Rules", "nowhere.Rules is not in this install"),
        ("apps_bench.judge.compare.compare_stdin", "apps_bench.judge.compare.compare_stdin is not a profile's rules class"),
    ],
)
def test_a_target_that_names_no_rules_is_refused_naming_the_file(pool, target, why):
    with pytest.raises(ValueError) as e:
        Judge.from_config(pool, dataclasses.replace(judge_config("seed"), _target_=target))
    assert str(e.value).startswith(f"judge profile 'seed': {why}") and "check judge._target_ (conf/judge/seed.yaml)" in str(
        e.value
    )


def test_the_rules_class_is_not_in_the_cell_key():
    """Code, like topology._target_: the profile's name and rules version identify a cell."""
    from conftest import compose_cell

    from apps_bench.cell.key import cell_key, identity_of

    plain, swapped = compose_cell(), compose_cell("judge._target_=apps_bench.judge.rules.ReferenceRules")
    assert plain.judge._target_ == "apps_bench.judge.rules.SeedRules" != swapped.judge._target_
    assert "_target_" not in identity_of(plain)["judge"]
    assert cell_key(identity_of(plain)) == cell_key(identity_of(swapped))


def test_call_memory_cap_from_env_reaches_the_program(pool, monkeypatch):
    monkeypatch.setenv("APPS_CALL_BASED_MEMORY_BYTES", "600000000")
    cfg = judge_config("seed")
    assert cfg.call_memory_bytes == 600_000_000 and isinstance(cfg.call_memory_bytes, int)
    j = Judge.from_config(pool, cfg)
    p = T.Problem(id="m", question="q", tests=T.TestSuite(([1],), ([1],), "f", 1))
    v = j.score(p, "def f(x):\n    b = bytearray(1_000_000_000)\n    return 1\n")
    assert not v.passed and v.results[0].outcome is O.MEMORY_LIMIT
    assert j.score(p, "def f(x):\n    b = bytearray(10_000_000)\n    return 1\n").passed
    monkeypatch.setenv("APPS_CALL_BASED_MEMORY_BYTES", "0")
    assert judge_config("seed").call_memory_bytes == 0  # 0 disables the cap


def test_seed_config_defaults(monkeypatch):
    monkeypatch.delenv("APPS_CALL_BASED_MEMORY_BYTES", raising=False)
    cfg = judge_config("seed")
    assert (cfg.profile, cfg.timeout_s, cfg.stop_on_first_failure, cfg.call_memory_bytes, cfg.workers) == (
        "seed",
        4.0,
        True,
        4_000_000_000,
        0,
    )
