"""The figures published APPS results are given in: test-case average and strict accuracy per
difficulty tier (Hendrycks et al. 2021, Table 2) and pass@k from n samples per problem (Chen et
al. 2021), each with the report's 95% interval.

Pure functions on per-problem rows (report.cells rows, or any mapping with `key`, `difficulty`,
`passed`, `error`, `tests_passed`, `tests_run`, `tests_kept`), one sequence of rows per cell: a
group of seed replicates is several cells, each seed a sample. A row with an infrastructure error
is left out, as for pass@1. A cell's summary uses them too (its MLflow metrics), so this module
imports nothing above report.stats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from apps_bench.report.stats import Interval, bootstrap_interval

TIERS = ("introductory", "interview", "competition")
ALL = "all"  # every problem, weighted by problems (not the mean of the tiers' figures), as Table 2 is
STOP_SETTING = "judge.stop_on_first_failure"  # the judge setting that cuts a failing program's tests short

Rows = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class TierFigures:
    """One tier's figures over a cell, or over a group's seeds pooled (the cluster bootstrap of pass@1)."""

    tier: str
    test_case_average: Interval
    strict_accuracy: Interval
    lower_bound: bool  # the judge stopped failing programs at their first failing test: the average is at least this


@dataclass(frozen=True)
class PassAtK:
    """pass@k for k = 1..n from n samples (seed cells) per problem, on the problems judged in all n."""

    n: int
    by_tier: dict[str, list[Interval]]  # tier -> [pass@1, ..., pass@n]
    n_problems: int
    left_out: int  # problems judged in fewer than n of the cells (an infrastructure error, a cell unfinished)


def fraction_passed(row: Mapping[str, Any]) -> float:
    """The share of a problem's kept tests its program passed (a compile error, a timeout: 0 for those tests)."""
    kept = int(row.get("tests_kept", 0) or 0)
    if kept <= 0:
        return 1.0 if row.get("passed") else 0.0
    return min(1.0, int(row.get("tests_passed", 0) or 0) / kept)


def cut_short(row: Mapping[str, Any]) -> bool:
    """A failing program some of whose kept tests never ran."""
    return not row.get("passed") and int(row.get("tests_run", 0) or 0) < int(row.get("tests_kept", 0) or 0)


def stops_early(settings: Mapping[str, Any]) -> bool:
    """Whether a cell's judge stopped at a program's first failing test (its identity's setting);
    a cell that does not say is taken to have stopped: its average is then only shown as a bound."""
    return str(settings.get(STOP_SETTING, "true")).lower() not in ("false", "0", "no")


def tier_of(row: Mapping[str, Any]) -> str:
    return str(row.get("difficulty") or "") or "(none)"


def _judged(cell: Rows) -> list[Mapping[str, Any]]:
    return [r for r in cell if not r.get("error")]


def _ordered(tiers: set[str]) -> list[str]:
    return [t for t in TIERS if t in tiers] + sorted(tiers - set(TIERS))


def apps_figures(cells: Sequence[Rows], *, stopped_early: bool) -> dict[str, TierFigures]:
    """Tier (introductory, interview, competition, any other, then `all`) -> test-case average and
    strict accuracy over the cells' judged problems, seeds pooled. `stopped_early`: the cells' judge
    stopped at a program's first failing test (`stops_early`); the average is then a lower bound
    wherever a failing program did not run all its kept tests."""
    fractions: dict[str, dict[str, list[float]]] = {}
    strict: dict[str, dict[str, list[float]]] = {}
    cut: dict[str, bool] = {}
    for cell in cells:
        for r in _judged(cell):
            for tier in (tier_of(r), ALL):
                fractions.setdefault(tier, {}).setdefault(str(r["key"]), []).append(fraction_passed(r))
                strict.setdefault(tier, {}).setdefault(str(r["key"]), []).append(float(bool(r.get("passed"))))
                cut[tier] = cut.get(tier, False) or (stopped_early and cut_short(r))
    order = _ordered(set(fractions) - {ALL}) + ([ALL] if ALL in fractions else [])
    return {t: TierFigures(t, bootstrap_interval(fractions[t]), bootstrap_interval(strict[t]), cut[t]) for t in order}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al. (2021), as a product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_figures(cells: Sequence[Rows]) -> PassAtK:
    """pass@1..n per tier (and `all`), n = the number of cells (one sample per problem each), over the
    problems judged in every one of them; the interval resamples problems (report.stats' bootstrap)."""
    n = len(cells)
    passed: dict[str, list[bool]] = {}
    tier: dict[str, str] = {}
    for cell in cells:
        for r in _judged(cell):
            passed.setdefault(str(r["key"]), []).append(bool(r.get("passed")))
            tier[str(r["key"])] = tier_of(r)
    common = {k: v for k, v in passed.items() if len(v) == n}
    by_tier: dict[str, list[Interval]] = {}
    groups = {t: [k for k in common if tier[k] == t] for t in _ordered(set(tier[k] for k in common))}
    groups[ALL] = list(common)
    for t, keys in groups.items():
        if keys:
            by_tier[t] = [bootstrap_interval({key: [pass_at_k(n, sum(common[key]), k)] for key in keys}) for k in range(1, n + 1)]
    return PassAtK(n=n, by_tier=by_tier, n_problems=len(common), left_out=len(passed) - len(common))


def metrics(figures: Mapping[str, TierFigures]) -> dict[str, float]:
    """A cell's figures as MLflow metrics: `test_case_average/<tier>` (`test_case_average_lower_bound/<tier>`
    when the judge cut failing programs short) and `strict_accuracy/<tier>`, `<tier>` one of the tiers or `all`."""
    out: dict[str, float] = {}
    for t, f in figures.items():
        if t not in (*TIERS, ALL):  # a row without a known tier is in `all` only (and MLflow names take no parentheses)
            continue
        name = "test_case_average_lower_bound" if f.lower_bound else "test_case_average"
        out[f"{name}/{t}"] = f.test_case_average.estimate
        out[f"strict_accuracy/{t}"] = f.strict_accuracy.estimate
    return out
