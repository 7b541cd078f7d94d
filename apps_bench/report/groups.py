"""Cells pooled over seeds (a *group*: one topology label x model in one comparability
class), their pass@1 intervals, and paired comparisons of every group against a baseline.

A group never mixes judge profiles, test caps or problem selections: those are part of
its identity, so two profiles of the same cells are two groups, never one pooled number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps_bench.report import stats
from apps_bench.report.cells import CellData, comparability_label, incomparable_reason


@dataclass
class Group:
    label: str
    model: str
    comparability: tuple[str, ...]  # CellData.comparability
    cells: list[CellData] = field(default_factory=list)
    interval: stats.Interval | None = None

    @property
    def seeds(self) -> list[str]:
        return sorted((c.seed for c in self.cells), key=_seed_order)

    def by_seed(self) -> dict[str, CellData]:
        return {c.seed: c for c in self.cells}

    def outcomes(self, seeds: list[str] | None = None) -> dict[str, list[float]]:
        """problem key -> passed (0/1) per seed, over `seeds` (default: all of the group's)."""
        cells = self.by_seed()
        out: dict[str, list[float]] = {}
        for s in seeds if seeds is not None else self.seeds:
            for key, passed in cells[s].outcomes().items():
                out.setdefault(key, []).append(float(passed))
        return out

    @property
    def name(self) -> str:
        return f"{self.label} · {self.model}"


def _seed_order(s: str) -> tuple[int, str]:
    return (int(s), "") if s.lstrip("-").isdigit() else (1 << 30, s)


def group_cells(cells: list[CellData]) -> list[Group]:
    """Pool seeds of the same topology label and model within one comparability class;
    each group gets its cluster-bootstrap interval."""
    groups: dict[tuple[str, str, tuple[str, str, str, str]], Group] = {}
    for c in cells:
        g = groups.setdefault((c.label, c.model, c.comparability), Group(c.label, c.model, c.comparability))
        g.cells.append(c)
    out = sorted(groups.values(), key=lambda g: (g.comparability, g.label, g.model))
    for g in out:
        g.interval = stats.bootstrap_interval(g.outcomes())
    return out


def classes(groups: list[Group]) -> dict[tuple[str, ...], str]:
    """Comparability class -> a readable label (dataset, judge profile, cap, selection); two
    classes whose short labels read the same (e.g. two files of one name) show their whole selection."""
    out = {g.comparability: comparability_label(g.cells[0]) for g in groups}
    seen: dict[str, int] = {}
    for label in out.values():
        seen[label] = seen.get(label, 0) + 1
    for g in groups:
        if seen[out[g.comparability]] > 1:
            sel = g.cells[0].selection
            out[g.comparability] += " · " + ", ".join(f"{k}={v}" for k, v in sel.items() if v not in ("", "None", "null"))
    return out


def blocks(groups: list[Group]) -> dict[tuple[str, ...], str]:
    """Comparability class -> its block letter (A, B, ... in the groups' order; AA after Z): what
    every table and chart of the report names its rows by, the header saying what each is."""
    out: dict[tuple[str, ...], str] = {}
    for g in groups:
        out.setdefault(g.comparability, letter(len(out)))
    return out


def letter(n: int) -> str:
    """The n-th block's name (0 -> A, 25 -> Z, 26 -> AA)."""
    name = ""
    while True:
        name = chr(ord("A") + n % 26) + name
        n = n // 26 - 1
        if n < 0:
            return name


@dataclass
class Comparison:
    model: str
    label: str  # the compared topology label
    baseline: str
    cls: str  # comparability class label
    seeds: list[str]
    result: stats.PairedResult | None = None
    p_holm: float | None = None
    refused: str | None = None  # why it was not compared
    pair: tuple[Group, Group] | None = None  # (compared, baseline) when compared
    comparability: tuple[str, ...] = ()  # the compared group's class (its block)

    def cells(self) -> list[CellData]:
        """The cells the comparison used (its common seeds, both sides)."""
        return [c for g in self.pair or () for c in g.cells if c.seed in self.seeds]

    @property
    def name(self) -> str:
        return f"{self.label} − {self.baseline} · {self.model}"


def pair(a: Group, b: Group) -> tuple[stats.PairedResult | None, list[str], str | None]:
    """Paired comparison of group a against group b on their common seeds, or the reason it is refused."""
    if a.comparability != b.comparability:
        reason = incomparable_reason(a.cells[0], b.cells[0]) or "different comparability classes"
        return None, [], reason
    common = [s for s in a.seeds if s in set(b.seeds)]
    if not common:
        return None, [], f"no seed in common ({a.label}: {', '.join(a.seeds)}; {b.label}: {', '.join(b.seeds)})"
    for s in common:
        why = incomparable_reason(a.by_seed()[s], b.by_seed()[s])
        if why:
            return None, common, f"seed {s}: {why}"
    return stats.paired_bootstrap(a.outcomes(common), b.outcomes(common)), common, None


def compare_to_baseline(groups: list[Group], baseline: str, *, all_groups: list[Group] | None = None) -> list[Comparison]:
    """Every group against the baseline label of the same model, paired; Holm over each
    model's family of comparisons. A group with no comparable baseline is listed, refused,
    with the reason (e.g. the baseline exists only under another judge profile)."""
    everyone = all_groups if all_groups is not None else groups
    labels = classes(everyone)
    out: list[Comparison] = []
    for g in groups:
        if g.label == baseline:
            continue
        bases = [b for b in everyone if b.label == baseline and b.model == g.model]
        same = [b for b in bases if b.comparability == g.comparability]
        cmp = Comparison(model=g.model, label=g.label, baseline=baseline, cls=labels[g.comparability], seeds=[],
                         comparability=g.comparability)  # fmt: skip
        if same:
            cmp.result, cmp.seeds, cmp.refused = pair(g, same[0])
            cmp.pair = (g, same[0]) if cmp.result is not None else None
        elif bases:
            cmp.refused = incomparable_reason(g.cells[0], bases[0].cells[0]) or "different comparability classes"
        else:
            cmp.refused = f"no {baseline} cell for model {g.model}"
        out.append(cmp)
    by_model: dict[tuple[str, str], list[Comparison]] = {}
    for c in out:
        if c.result is not None:
            by_model.setdefault((c.model, c.cls), []).append(c)
    for family in by_model.values():
        for c, p in zip(family, stats.holm([c.result.p_value for c in family])):  # type: ignore[union-attr]
            c.p_holm = p
    return out
