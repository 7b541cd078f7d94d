"""The report's statistics against values computed by hand on small fixed tables."""

from __future__ import annotations

import math

import pytest

from apps_bench.report.stats import bootstrap_interval, format_p, holm, mcnemar_exact, paired_bootstrap, pooled_rate


def test_mcnemar_exact_by_hand():
    # b=1, c=6: n=7, P(X<=1) = (C(7,0)+C(7,1))/2^7 = 8/128; two-sided = 16/128
    assert mcnemar_exact(1, 6) == pytest.approx(0.125, abs=1e-12)
    assert mcnemar_exact(6, 1) == pytest.approx(0.125, abs=1e-12)
    # b=0, c=5: 2 * 1/32
    assert mcnemar_exact(0, 5) == pytest.approx(0.0625, abs=1e-12)
    # b=2, c=8: n=10, (1+10+45)/1024 * 2 = 112/1024
    assert mcnemar_exact(2, 8) == pytest.approx(112 / 1024, abs=1e-12)
    assert mcnemar_exact(3, 3) == 1.0  # a balanced split is capped at 1
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pair: no evidence
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_holm_by_hand():
    # sorted 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped
    assert holm([0.02]) == pytest.approx([0.02])
    assert holm([]) == []


def test_bootstrap_two_problems_exact_distribution():
    # resampling 2 problems {1, 0}: means 0 (1/4), 0.5 (1/2), 1 (1/4): the 95% interval is [0, 1]
    iv = bootstrap_interval({"a": [1], "b": [0]}, n_boot=4000, rng_seed=3)
    assert iv.estimate == 0.5 and iv.low == 0.0 and iv.high == 1.0


def test_bootstrap_interval_matches_the_binomial_answer():
    # 30 of 50 passed: the bootstrap distribution of the mean is Binomial(50, 0.6)/50, whose
    # 2.5% and 97.5% quantiles are 23/50 = 0.46 and 36/50 = 0.72 (exact binomial quantiles)
    outcomes = {f"p{i}": [1.0 if i < 30 else 0.0] for i in range(50)}
    iv = bootstrap_interval(outcomes, n_boot=20_000, rng_seed=0)
    assert iv.estimate == pytest.approx(0.6)
    assert iv.low == pytest.approx(0.46, abs=0.021) and iv.high == pytest.approx(0.72, abs=0.021)
    # fixed seed: the same interval every time; another seed: close but not identical
    assert bootstrap_interval(outcomes, n_boot=20_000, rng_seed=0) == iv


def test_bootstrap_clusters_by_problem_when_seeds_are_pooled():
    one_seed = {f"p{i}": [1.0 if i < 30 else 0.0] for i in range(50)}
    three_same = {k: v * 3 for k, v in one_seed.items()}  # seeds agree: no new information
    a = bootstrap_interval(one_seed, rng_seed=1)
    b = bootstrap_interval(three_same, rng_seed=1)
    assert (b.low, b.high) == pytest.approx((a.low, a.high))  # clustered: the same width
    naive = bootstrap_interval({f"{k}/{s}": [x] for k, v in three_same.items() for s, x in enumerate(v)}, rng_seed=1)
    assert naive.high - naive.low < 0.75 * (a.high - a.low)  # 150 independent draws would be too narrow
    assert b.n_problems == 50 and b.n_outcomes == 150


def test_pooled_rate_counts_every_outcome():
    assert pooled_rate({"a": [1, 0], "b": [1, 1]}) == 0.75
    assert math.isnan(bootstrap_interval({}).estimate)


def test_paired_bootstrap_and_mcnemar_counts():
    # 10 problems; a solves 0-7, b solves 0-1 and 8: a-only = 6 (2..7), b-only = 1 (8)
    a = {f"p{i}": [1.0 if i < 8 else 0.0] for i in range(10)}
    b = {f"p{i}": [1.0 if i in (0, 1, 8) else 0.0] for i in range(10)}
    r = paired_bootstrap(a, b, n_boot=20_000, rng_seed=0)
    assert r.diff == pytest.approx(0.5)
    assert (r.a_only, r.b_only, r.n_pairs, r.n_problems) == (6, 1, 10, 10)
    assert r.p_value == pytest.approx(0.125)
    # exact bootstrap distribution of the mean difference (multinomial over +1 x6, -1 x1, 0 x3):
    # P(<= 0.0) = 0.023, P(<= 0.1) = 0.057, P(<= 0.8) = 0.964, P(<= 0.9) = 0.994 -> [0.1, 0.9]
    assert 0.0 <= r.low <= 0.1 and r.low == pytest.approx(0.1, abs=0.05)
    assert r.high == pytest.approx(0.9, abs=1e-9)
    same = paired_bootstrap(a, a)
    assert (same.diff, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_refuses_different_problems():
    with pytest.raises(ValueError, match="same problems"):
        paired_bootstrap({"a": [1], "b": [0]}, {"a": [1], "c": [0]})


def _exact_log_p(b: int, c: int) -> float:
    """The two-sided McNemar log p-value from big integers (math.log takes any int)."""
    n, k = b + c, min(b, c)
    return math.log(2) + math.log(sum(math.comb(n, i) for i in range(k + 1))) - n * math.log(2)


@pytest.mark.parametrize("b,c", [(1, 40), (30, 70), (400, 600), (1450, 1550), (2000, 3000), (100, 14_900), (6000, 9000)])
def test_mcnemar_exact_at_study_size_keeps_its_digits(b, c):
    p = mcnemar_exact(b, c)
    want = _exact_log_p(b, c)
    if want > math.log(1e-300):
        assert p == pytest.approx(math.exp(want), rel=1e-9)
    else:  # below what a float holds well: never reported as an exact 0
        assert p < 1e-300
        assert format_p(p) == "< 1e-300" and format_p(holm([p, 0.5])[0]) == "< 1e-300"


def test_mcnemar_exact_agrees_with_scipy():
    from scipy import stats as scipy_stats  # mlflow depends on scipy: always installed

    for b, c in [(3, 9), (120, 180), (700, 800), (2500, 2600), (7400, 7600)]:
        assert mcnemar_exact(b, c) == pytest.approx(scipy_stats.binomtest(min(b, c), b + c, 0.5).pvalue, rel=1e-9)


def test_format_p_never_prints_zero():
    assert format_p(0.0) == "< 1e-300" and format_p(5e-301) == "< 1e-300"
    assert format_p(2e-7) == "2e-07" and format_p(0.0123) == "0.012" and format_p(None) == "-"
