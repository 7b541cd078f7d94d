"""The statistics behind the report: pure functions on per-problem outcomes.

With 50 problems a 4-point difference is two problems: a cell's pass@1 needs an interval,
and two cells on the same problems need a paired test. The unit of resampling is the
*problem*: when several seeds of a cell are pooled, a problem's outcomes over the seeds
move together (the cluster bootstrap), because the problems, not the seeds, are the
sample drawn from the benchmark.

Outcomes are given as `{problem_key: [0/1 per seed, ...]}` (a cell of one seed has
one-element lists). Every function is deterministic for a given `rng_seed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

Outcomes = Mapping[str, Sequence[float]]
N_BOOT = 10_000  # resamples per interval (the seed is fixed: the same records give the same interval)

METHOD_CELL = "95% percentile bootstrap over problems, clustered by problem across seeds (B={b})"
METHOD_PAIRED = "paired bootstrap over problems (B={b}); exact two-sided McNemar over (problem, seed) pairs; Holm per model"


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n_problems: int
    n_outcomes: int


@dataclass(frozen=True)
class PairedResult:
    diff: float  # pass@1(a) - pass@1(b), on the shared problems
    low: float
    high: float
    n_problems: int
    n_pairs: int  # (problem, seed) pairs McNemar counts
    a_only: int  # pairs solved by a, not by b
    b_only: int
    p_value: float


def _problem_means(outcomes: Outcomes) -> tuple[list[str], list[float], list[int]]:
    keys = sorted(outcomes)
    for k in keys:
        if len(outcomes[k]) == 0:
            raise ValueError(f"problem {k!r} has no outcomes")
    return keys, [sum(map(float, outcomes[k])) for k in keys], [len(outcomes[k]) for k in keys]


def pooled_rate(outcomes: Outcomes) -> float:
    """Share of passed outcomes over every (problem, seed)."""
    _, sums, counts = _problem_means(outcomes)
    return sum(sums) / sum(counts) if counts else math.nan


def _percentile(values: Any, alpha: float) -> tuple[float, float]:
    import numpy as np

    lo, hi = np.quantile(values, [alpha / 2, 1 - alpha / 2], method="linear")
    return float(lo), float(hi)


CHUNK_CELLS = 2_000_000  # resampled indices held at once (16 MB): 5000 problems x 10,000 resamples would be 400 MB


def _resampled_ratios(num: Any, den: Any, n_boot: int, rng: Any) -> Any:
    """sum(num[idx]) / sum(den[idx]) for n_boot resamples idx of the problems, in chunks."""
    import numpy as np

    n = len(num)
    step = max(1, CHUNK_CELLS // max(1, n))
    out = []
    for start in range(0, n_boot, step):
        idx = rng.integers(0, n, size=(min(step, n_boot - start), n))
        out.append(num[idx].sum(axis=1) / den[idx].sum(axis=1))
    return np.concatenate(out)


def bootstrap_interval(outcomes: Outcomes, *, n_boot: int = N_BOOT, rng_seed: int = 0, alpha: float = 0.05) -> Interval:
    """pass@1 over all (problem, seed) outcomes with a percentile bootstrap interval that
    resamples whole problems (all of a problem's seeds together)."""
    import numpy as np

    keys, sums, counts = _problem_means(outcomes)
    n = len(keys)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, 0)
    s = np.asarray(sums, dtype=float)
    c = np.asarray(counts, dtype=float)
    lo, hi = _percentile(_resampled_ratios(s, c, n_boot, np.random.default_rng(rng_seed)), alpha)
    return Interval(float(s.sum() / c.sum()), lo, hi, n, int(c.sum()))


def paired_bootstrap(a: Outcomes, b: Outcomes, *, n_boot: int = N_BOOT, rng_seed: int = 0, alpha: float = 0.05) -> PairedResult:
    """Difference a - b on the same problems: per problem, mean over its seeds on each side;
    the interval resamples problems (the pairing is kept). McNemar counts (problem, seed)
    pairs present on both sides (seeds matched by position: the i-th seed of each)."""
    import numpy as np

    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise ValueError(
            f"paired comparison needs the same problems on both sides: {len(only_a)} only in the first "
            f"({', '.join(only_a[:5])}), {len(only_b)} only in the second ({', '.join(only_b[:5])})"
        )
    keys = sorted(a)
    if not keys:
        raise ValueError("paired comparison of no problems")
    d = np.asarray([_mean(a[k]) - _mean(b[k]) for k in keys], dtype=float)
    lo, hi = _percentile(_resampled_ratios(d, np.ones_like(d), n_boot, np.random.default_rng(rng_seed)), alpha)
    a_only = b_only = pairs = 0
    for k in keys:
        for x, y in zip(a[k], b[k]):
            pairs += 1
            a_only += bool(x) and not bool(y)
            b_only += bool(y) and not bool(x)
    return PairedResult(
        diff=float(d.mean()),
        low=lo,
        high=hi,
        n_problems=len(keys),
        n_pairs=pairs,
        a_only=a_only,
        b_only=b_only,
        p_value=mcnemar_exact(a_only, b_only),
    )


def _mean(xs: Sequence[float]) -> float:
    return sum(map(float, xs)) / len(xs)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts b and c: under H0 each
    discordant pair falls either way with probability 1/2, so p = 2 P(Binom(b+c, 1/2) <= min(b, c)), capped at 1.

    Summed in log space from the largest term of the tail down, each term the one before
    times i / (n - i + 1): linear in min(b, c) at worst and stopping once the terms no
    longer change the sum, so 15,000 pairs cost microseconds and a tiny p-value keeps its
    digits instead of underflowing in big-integer division. A p-value below the smallest
    float is 0.0; the report prints anything below `P_FLOOR` as a bound."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got {b}, {c}")
    n = b + c
    k = min(b, c)
    if n == 0 or 2 * k >= n:
        return 1.0  # no discordant pair, or a balanced split: no evidence either way
    total = term = 1.0
    for i in range(k, 0, -1):
        term *= i / (n - i + 1)
        total += term
        if term < total * 1e-17:
            break
    log_top = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2)
    log_p = math.log(2.0) + log_top + math.log(total)
    return min(1.0, math.exp(log_p))


P_FLOOR = 1e-300  # p-values below this print as "< 1e-300": a float holds little more, and 0 would read as exact


def format_p(p: float | None) -> str:
    """A p-value as the report prints it: never 0, a bound below `P_FLOOR`."""
    if p is None:
        return "-"
    if p < P_FLOOR:
        return f"< {P_FLOOR:.0e}"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted
