"""Parity of judge profile `reference` with the original APPS harness, on a recorded corpus.

tests/fixtures/reference/verdicts.jsonl holds what hendrycks/apps' harness (run by
the original's `ref_judge.py`, see record.py: only recording needs it) answered for every
program of the corpus -- each vendored row's (tests/fixtures/apps) first reference solution and the probes of programs.jsonl -- at
the 20-test cap and at all tests. `reference` must give the same strict verdict and the same
result list on every one, through the Judge API, through `python -m apps_bench.judge` and
(the reference solutions, which the gold model answers with) through a `judge=reference`
cell; `seed` must keep its own verdicts (seed_verdicts.jsonl, its rules in docs/judge.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import TIMING_MARGINAL_TRAIN_IDS

from apps_bench.data.rows import parse_row
from apps_bench.judge.core import Judge
from apps_bench.judge.pass_at_1 import counted_tests
from apps_bench.judge.profiles import judge_config
from apps_bench.report.tiers import fraction_passed
from apps_bench.sandbox import SandboxPool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
_spec = importlib.util.spec_from_file_location("reference_corpus", FIXTURES / "record.py")
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)  # type: ignore[union-attr]

CAPS = (20, 0)
# Where `reference` differs from the original on purpose: containment. A return value of a type
# the program defines is never sent to the judge process (its `__eq__` is the program's code),
# so it equals nothing; the original called the lying `__eq__` and passed it.
# Timing-marginal rows (conftest): their verdict is compared when they finish in time; a verdict
# that differs must be a timeout, never anything else.
TIMING_MARGINAL = {f"gold/train:{i}" for i in TIMING_MARGINAL_TRAIN_IDS}
CONTAINED = {
    "call/kth_own_class": "an object whose __eq__ always returns True",
    "call/kth_int_subclass": "an int subclass whose __eq__ always returns True",
}


def _verdicts(name: str) -> dict[tuple[str, int], dict]:
    out = {}
    for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
        v = json.loads(line)
        out[(v["id"], v["max_tests"])] = v
    return out


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return corpus.corpus_rows()


@pytest.fixture(scope="module")
def programs(rows) -> list[dict]:
    return corpus.corpus_programs(rows)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool.from_config(judge_config("seed"), workers=0) as p:
        yield p


def judge_corpus(pool, rows, programs, profile: str, cap: int) -> dict[str, object]:
    """Every corpus program judged by `profile` (its conf file) at test cap `cap`: id -> Verdict."""
    judge = Judge.from_config(pool, judge_config(profile))
    problems = {k: parse_row(r, split=r["split"], max_tests_per_row=cap) for k, r in rows.items()}
    with ThreadPoolExecutor(max_workers=pool.workers) as ex:
        futs = {p["id"]: ex.submit(judge.score, problems[p["problem"]], p["code"]) for p in programs}
        return {k: f.result() for k, f in futs.items()}


def cut_by(cap: int, rows, programs) -> list[dict]:
    """The programs whose problem `cap` changes. On every other row the cap keeps all tests, so the
    judge's input is the one the all-tests run judges (asserted here) and the original's verdict is
    its all-tests verdict (test_the_corpus_covers_every_probe_and_cap): judging them again would
    only repeat that run."""
    if cap <= 0:
        return programs
    whole = {k: parse_row(r, split=r["split"], max_tests_per_row=0) for k, r in rows.items()}
    cut = {k for k, r in rows.items() if parse_row(r, split=r["split"], max_tests_per_row=cap) != whole[k]}
    assert all(len(whole[k].tests.inputs) > cap for k in cut)
    assert all(len(whole[k].tests.inputs) <= cap for k in rows.keys() - cut)
    return [p for p in programs if p["problem"] in cut]


def test_the_corpus_covers_every_probe_and_cap(rows, programs) -> None:
    recorded = _verdicts("verdicts.jsonl")
    ids = {p["id"] for p in programs}
    assert {k for k, _ in recorded} == ids
    assert {c for _, c in recorded} == set(CAPS)
    assert sum(i.startswith("gold/") for i in ids) >= 150
    # the corpus holds passes and every kind of failure of the original
    values = [v["results"] for v in recorded.values()]
    assert any(v == [-2] for v in values) and any(v == [-1] * 21 for v in values)
    assert any(-1 in v and v != [-1] * 21 for v in values) and any(False in v for v in values)
    assert sum(v["passed"] for v in recorded.values()) > 0
    # where a cap keeps every test of a row, the original gave the all-tests verdict (cut_by relies on it)
    for cap in CAPS:
        kept = {p["id"] for p in programs} - {p["id"] for p in cut_by(cap, rows, programs)}
        verdict = lambda i, c: {k: recorded[(i, c)][k] for k in ("passed", "results", "n_tests")}  # noqa: E731
        assert all(verdict(i, cap) == verdict(i, 0) for i in kept)
    assert 0 < len(cut_by(20, rows, programs)) < len(programs)


@pytest.fixture(scope="module", params=CAPS, ids=lambda c: f"max_tests_{c}")
def reference_run(request, pool, rows, programs) -> tuple[int, dict[str, object]]:
    """(cap, id -> Verdict): the corpus programs a cap changes, judged by `reference` once for the tests below."""
    cap = request.param
    return cap, judge_corpus(pool, rows, cut_by(cap, rows, programs), "reference", cap)


def _skipped_by_timing(pid: str, v) -> bool:
    return pid in TIMING_MARGINAL and any(r.outcome.value == "timeout" for r in v.results)


def test_reference_reproduces_every_recorded_verdict(reference_run) -> None:
    recorded = _verdicts("verdicts.jsonl")
    cap, got = reference_run
    wrong = []
    for pid, v in got.items():
        want = recorded[(pid, cap)]
        if pid in CONTAINED:  # the original was fooled; reference must not be
            assert want["passed"] is True and v.passed is False and list(v.reference_results) == [False], pid
            continue
        if _skipped_by_timing(pid, v):
            continue
        if v.passed != want["passed"] or list(v.reference_results) != want["results"]:
            wrong.append(
                f"{pid}: reference {v.passed} {list(v.reference_results)[:8]}, original {want['passed']} {want['results'][:8]}"
            )
        assert v.profile == "reference"
    assert wrong == [], "\n".join(wrong)


def _original_test_case_average(results: list) -> float:
    """What the original's evaluation prints per problem: the mean of `np.asarray(results) > 0`."""
    return sum(1 for x in results if x is True or (type(x) is int and x > 0)) / len(results)


def test_test_case_average_per_problem_is_the_originals(reference_run) -> None:
    """The report's per-problem share of tests passed (a record's verdict, counted as report.cells counts it)
    is what hendrycks/apps' evaluation computes from its own result list, on every program of the corpus:
    partly right ones, compile errors ([-2]) and programs it lost whole ([-1] * 21) among them."""
    recorded = _verdicts("verdicts.jsonl")
    cap, got = reference_run
    wrong, partial = [], 0
    for pid, v in got.items():
        want = recorded[(pid, cap)]
        if pid in CONTAINED or _skipped_by_timing(pid, v):
            continue
        mine = fraction_passed({"passed": v.passed, **counted_tests(v)})
        original = _original_test_case_average(want["results"])
        partial += 0 < original < 1
        if mine != pytest.approx(original, abs=1e-12):
            wrong.append(f"{pid}: {mine:.4f} here, {original:.4f} in the original ({want['results'][:8]})")
    assert wrong == [], "\n".join(wrong)
    assert partial >= (2 if cap == 0 else 1)  # the corpus has programs that pass some tests and fail others


@pytest.mark.parametrize("cap", CAPS, ids=lambda c: f"max_tests_{c}")
def test_seed_keeps_its_own_verdicts(pool, rows, programs, cap) -> None:
    recorded = _verdicts("seed_verdicts.jsonl")
    got = judge_corpus(pool, rows, cut_by(cap, rows, programs), "seed", cap)
    wrong = [
        f"{pid}: seed now {v.passed}, recorded {recorded[(pid, cap)]['passed']}"
        for pid, v in got.items()
        if v.passed != recorded[(pid, cap)]["passed"]
        and not (pid in TIMING_MARGINAL and any(r.outcome.value == "timeout" for r in v.results))
    ]
    assert wrong == [], "\n".join(wrong)


def test_seed_and_reference_differ_on_the_probes(programs) -> None:
    """The seed rules are not the original's: on the corpus they part on at least ten programs."""
    original = _verdicts("verdicts.jsonl")
    seed = _verdicts("seed_verdicts.jsonl")
    assert sum(seed[(p["id"], 0)]["passed"] != original[(p["id"], 0)]["passed"] for p in programs) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("cap", CAPS, ids=lambda c: f"max_tests_{c}")
def test_judge_cli_gives_the_original_verdicts_on_every_program(tmp_path, rows, programs, cap) -> None:
    """`python -m apps_bench.judge --profile reference` on the whole corpus in one command: each
    program gets its own copy of its row (a fresh problem_id, the same tests) so that one
    predictions file holds them all."""
    recorded = _verdicts("verdicts.jsonl")
    rows_file, pred_file, out = tmp_path / "rows.jsonl", tmp_path / "pred.jsonl", tmp_path / "verdicts.jsonl"
    programs = cut_by(cap, rows, programs)
    ids = {p["id"]: str(100_000 + n) for n, p in enumerate(programs)}
    with rows_file.open("w") as f, pred_file.open("w") as g:
        for p in programs:
            row = {k: v for k, v in rows[p["problem"]].items() if k != "split"}
            f.write(json.dumps({**row, "problem_id": int(ids[p["id"]])}) + "\n")
            g.write(json.dumps({"id": ids[p["id"]], "code": p["code"]}) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "apps_bench.judge",
            str(rows_file),
            "--predictions",
            str(pred_file),
            "--profile",
            "reference",
            "--max-tests-per-row",
            str(cap),
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    got = {v["id"]: v for v in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert len(got) == len(programs)
    wrong = []
    for pid, new_id in ids.items():
        v, want = got[new_id], recorded[(pid, cap)]
        assert v["profile"] == "reference"
        if pid in CONTAINED:
            assert (want["passed"], v["passed"]) == (True, False), pid
        elif pid in TIMING_MARGINAL and any(r["outcome"] == "timeout" for r in v["results"]):
            continue
        elif (v["passed"], v["reference_results"]) != (want["passed"], want["results"]):
            wrong.append(f"{pid}: {v['passed']} {v['reference_results'][:8]} vs original {want['passed']} {want['results'][:8]}")
    assert wrong == [], "\n".join(wrong)


if __name__ == "__main__":  # regenerate seed_verdicts.jsonl (the seed profile's own verdicts on the corpus)
    rows_ = corpus.corpus_rows()
    progs = corpus.corpus_programs(rows_)
    with SandboxPool.from_config(judge_config("seed"), workers=0) as p:
        lines = []
        for cap in CAPS:
            for pid, v in judge_corpus(p, rows_, progs, "seed", cap).items():
                lines.append(json.dumps({"id": pid, "max_tests": cap, "passed": v.passed}))
    (FIXTURES / "seed_verdicts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("cap", CAPS, ids=lambda c: f"max_tests_{c}")
def test_a_cell_with_judge_reference_gives_the_original_verdicts(tmp_path, mlflow_template, cap) -> None:
    """`python -m apps_bench judge=reference` (the gold model answers with each row's reference
    solution, as extracted from its reply: stripped) on every train row of the corpus."""
    from conftest import fresh_store, run_cli

    from apps_bench.report.cells import from_dirs

    recorded = _verdicts("verdicts.jsonl")
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    proc = run_cli(
        [
            "dataset=apps",
            f"dataset.path={corpus.DATA / 'train_mini150.jsonl'}",
            "dataset.split=train",
            "model=gold",
            "judge=reference",
            f"max_tests_per_row={cap}",
            "progress=false",
        ],
        tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cell,) = (tmp_path / "outputs" / "cells").iterdir()
    records = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines()]
    assert len(records) == 150
    rows = {p["id"]: p for c in from_dirs(cell, with_roles=False) for p in c.problems}  # the report's rows
    for r in records:
        want = recorded[(f"gold/train:{r['id']}", cap)]
        v = r["verdict"]
        if r["id"] in TIMING_MARGINAL_TRAIN_IDS and any(t["outcome"] == "timeout" for t in v["results"]):
            continue
        assert (v["profile"], r["passed"], v["reference_results"]) == ("reference", want["passed"], want["results"]), r["id"]
        assert fraction_passed(rows[r["id"]]) == pytest.approx(_original_test_case_average(want["results"])), r["id"]
