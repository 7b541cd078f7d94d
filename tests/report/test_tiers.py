"""report.tiers: test-case average and strict accuracy per tier, pass@k, on rows built here (the
sweep that checks them against real records is tests/test_tiers_acceptance.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from apps_bench.judge.pass_at_1 import counted_tests
from apps_bench.report.stats import bootstrap_interval
from apps_bench.report.tiers import ALL, apps_figures, fraction_passed, metrics, pass_at_k, pass_at_k_figures, stops_early
from apps_bench.types import Verdict


def _row(key: str, tier: str, passed: int, kept: int, *, run: int | None = None, error: str = "") -> dict:
    return {
        "key": key,
        "difficulty": tier,
        "passed": passed == kept and kept > 0,
        "error": error,
        "tests_passed": passed,
        "tests_run": kept if run is None else run,
        "tests_kept": kept,
    }


def test_pass_at_k_is_the_binomial_estimator_for_every_small_n() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(want), abs=1e-12), (n, c, k)


def test_pass_at_k_stays_finite_where_the_binomials_overflow_a_float() -> None:
    n, c, k = 2000, 3, 1000  # C(2000, 1000) has 600 digits: no float holds it
    want = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(want), rel=1e-9)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_overall_is_weighted_by_problems_and_errors_are_left_out() -> None:
    cell = [
        _row("a", "introductory", 2, 2),
        _row("b", "introductory", 2, 2),
        _row("c", "introductory", 1, 4),
        _row("d", "competition", 0, 5),
        _row("e", "competition", 0, 0, error="sandbox lost"),
    ]
    f = apps_figures([cell], stopped_early=False)
    assert list(f) == ["introductory", "competition", ALL]
    assert f["introductory"].test_case_average.estimate == pytest.approx((1 + 1 + 0.25) / 3)
    assert f["introductory"].strict_accuracy.estimate == pytest.approx(2 / 3)
    assert f["competition"].test_case_average.n_problems == 1  # the infrastructure error is not a wrong answer
    assert f[ALL].test_case_average.estimate == pytest.approx((1 + 1 + 0.25 + 0) / 4)  # not the mean of the tiers' figures
    assert f[ALL].strict_accuracy.estimate == pytest.approx(2 / 4)
    # the interval is pass@1's: the cluster bootstrap over problems, seeds pooled
    two = apps_figures([cell, [_row("a", "introductory", 0, 2)]], stopped_early=False)
    want = bootstrap_interval({"a": [1.0, 0.0], "b": [1.0], "c": [0.25], "d": [0.0]})
    assert two[ALL].test_case_average == want


def test_a_judge_that_stops_at_the_first_failure_gives_a_lower_bound() -> None:
    cut = [_row("a", "interview", 1, 5, run=2), _row("b", "introductory", 3, 3)]
    f = apps_figures([cut], stopped_early=True)
    assert f["interview"].lower_bound and f[ALL].lower_bound and not f["introductory"].lower_bound
    assert not apps_figures([cut], stopped_early=False)[ALL].lower_bound  # every test ran: a short run is the program's own
    m = metrics(f)
    assert m["test_case_average_lower_bound/interview"] == pytest.approx(0.2) and "test_case_average/interview" not in m
    assert m["test_case_average/introductory"] == 1.0 and m["strict_accuracy/all"] == 0.5
    assert stops_early({"judge.stop_on_first_failure": "True"}) and not stops_early({"judge.stop_on_first_failure": "false"})
    assert stops_early({})  # a cell that does not say is not taken to have run every test


def test_pass_at_k_uses_only_problems_judged_in_every_sample() -> None:
    seeds = [
        [_row("a", "interview", 1, 1), _row("b", "interview", 0, 1), _row("c", "competition", 0, 1)],
        [_row("a", "interview", 0, 1), _row("b", "interview", 0, 1), _row("c", "competition", 1, 1)],
        [_row("a", "interview", 0, 1), _row("b", "interview", 0, 1, error="lost")],
    ]
    p = pass_at_k_figures(seeds)
    assert (p.n, p.n_problems, p.left_out) == (3, 1, 2)  # b and c were judged twice only
    assert list(p.by_tier) == ["interview", ALL]
    assert [iv.estimate for iv in p.by_tier["interview"]] == pytest.approx([1 / 3, 2 / 3, 1.0])
    full = pass_at_k_figures(seeds[:2])
    assert (full.n, full.n_problems, full.left_out) == (2, 3, 0)
    assert [iv.estimate for iv in full.by_tier[ALL]] == pytest.approx([(0.5 + 0 + 0.5) / 3, (1 + 0 + 1) / 3])
    assert [iv.estimate for iv in full.by_tier["competition"]] == pytest.approx([0.5, 1.0])


def _verdict(passed: int, run: int, kept: int, reference: tuple | None = None) -> Verdict:
    return Verdict(
        problem_id="x",
        passed=False,
        n_tests=kept,
        tests_run=run,
        tests_passed=passed,
        results=(),
        profile="reference" if reference is not None else "seed",
        reference_results=reference,
    )


def test_counted_tests_follow_the_original_result_list() -> None:
    lost = _verdict(3, 4, 6, (-1,) * 21)
    assert counted_tests(lost) == {"tests_passed": 0, "tests_run": 4, "tests_kept": 6}
    assert counted_tests(_verdict(2, 3, 3, (True, -1, True)))["tests_passed"] == 2
    assert counted_tests(_verdict(2, 2, 5)) == {"tests_passed": 2, "tests_run": 2, "tests_kept": 5}
    assert counted_tests(None) == {"tests_passed": 0, "tests_run": 0, "tests_kept": 0}
    assert fraction_passed(_row("x", "", 0, 0)) == 0.0
