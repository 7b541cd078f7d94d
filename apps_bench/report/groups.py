"""Cells pooled over seeds (a *group*: the seed replicates of one cell identity, in one
comparability class), their pass@1 intervals, and paired comparisons of every group against a baseline.

A group is the cells whose identity (cell/key.py's key: everything that changes what runs) is equal
but for the seed, so no number is pooled across cells that differ: not across judge profiles,
test caps or problem selections, nor across a model's temperature or a team's size. Groups that
share their axes' labels are told apart by the settings they differ in (`Group.settings`), which
every table shows as columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps_bench.report import stats
from apps_bench.report.cells import (
    CellData,
    ReportError,
    comparability_label,
    incomparable_reason,
    same_value,
    setting_columns,
    setting_values,
)

Settings = tuple[tuple[str, str], ...]  # (flat identity key, value as shown) of the settings a table shows


@dataclass
class Group:
    label: str
    model: str
    comparability: tuple[str, ...]  # CellData.comparability
    cells: list[CellData] = field(default_factory=list)
    interval: stats.Interval | None = None
    settings: Settings = ()  # what tells it apart from groups with the same axes (group_cells sets it)

    @property
    def identity(self) -> dict[str, str]:
        """The identity its cells share (every cell's but the seed)."""
        return dict(self.cells[0].replicate_of) if self.cells else {}

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
        return f"{self.label} · {self.model}" + shown(self.settings)


def shown(settings: Settings) -> str:
    """Settings as a label's tail: ` · model.temperature 0.7`."""
    return "".join(f" · {k} {v}" for k, v in settings)


def _seed_order(s: str) -> tuple[int, str]:
    return (int(s), "") if s.lstrip("-").isdigit() else (1 << 30, s)


def group_cells(cells: list[CellData]) -> list[Group]:
    """Pool the seed replicates of each cell identity (the same topology label, model and every other
    setting) within one comparability class; each group gets its cluster-bootstrap interval and the
    settings that tell it apart. ReportError when two cells cannot be told apart (two cells of one
    identity and seed: their runs' identities read the same although their keys differ)."""
    found: dict[tuple, Group] = {}
    for c in cells:
        g = found.setdefault((c.label, c.model, c.comparability, c.replicate_of), Group(c.label, c.model, c.comparability))
        twin = next((x for x in g.cells if x.seed == c.seed), None)
        if twin is not None:
            raise _indistinct(f"{c.label} · {c.model} s{c.seed}", [twin, c])
        g.cells.append(c)
    out = list(found.values())
    keys = setting_columns([((g.comparability, g.label, g.model), g.identity) for g in out])
    for g, values in zip(out, setting_values([g.identity for g in out], keys)):
        g.settings = tuple(zip(keys, values))
    out.sort(key=lambda g: (g.comparability, g.label, g.model, g.settings))
    seen: dict[tuple, Group] = {}
    for g in out:
        other = seen.setdefault((g.comparability, g.label, g.model, g.settings), g)
        if other is not g:
            raise _indistinct(g.name, [other.cells[0], g.cells[0]])
        g.interval = stats.bootstrap_interval(g.outcomes())
    return out


def _indistinct(name: str, cells: list[CellData]) -> ReportError:
    return ReportError(
        f"cannot tell apart {len(cells)} cells labelled {name} ({', '.join(f'{c.source} [key {c.key}]' for c in cells)}): "
        "nothing the report reads tells them apart, and it never pools cells that differ; narrow the cells "
        "(--experiment, --sweep, --seeds, --model, --judge) so that one of them remains"
    )


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


@dataclass(frozen=True)
class Baseline:
    """What `--compare` pairs every group with: a topology label (`baseline=single`), or one value of a
    setting the cells vary (`model.temperature=0`: each group against the group identical to it but there)."""

    key: str  # "baseline" for a topology label, else a flat identity key (model.temperature)
    value: str

    @property
    def on_setting(self) -> bool:
        return self.key != "baseline"

    def __str__(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def label(self) -> str:
        """How the comparison table names it: the topology, or `setting=value`."""
        return str(self) if self.on_setting else self.value

    def holds(self, g: Group) -> bool:
        if not self.on_setting:
            return g.label == self.value
        have = g.identity.get(self.key)  # a file may be named as the table shows it
        return same_value(have, self.value) or (have is not None and "/" in have and have.rsplit("/", 1)[1] == self.value)


@dataclass
class Comparison:
    model: str
    label: str  # the compared topology label
    baseline: str  # Baseline.label
    cls: str  # comparability class label
    seeds: list[str]
    result: stats.PairedResult | None = None
    p_holm: float | None = None
    refused: str | None = None  # why it was not compared
    pair: tuple[Group, Group] | None = None  # (compared, baseline) when compared
    comparability: tuple[str, ...] = ()  # the compared group's class (its block)
    settings: Settings = ()  # the compared group's (Group.settings)

    def cells(self) -> list[CellData]:
        """The cells the comparison used (its common seeds, both sides)."""
        return [c for g in self.pair or () for c in g.cells if c.seed in self.seeds]

    @property
    def name(self) -> str:
        return f"{self.label}{shown(self.settings)} − {self.baseline} · {self.model}"


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


def compare_to_baseline(
    groups: list[Group], baseline: str | Baseline, *, all_groups: list[Group] | None = None
) -> list[Comparison]:
    """Every group against its baseline, paired; Holm over each model's family of comparisons.
    The baseline of a group is, for a topology label, that label's group of the same model (of the same
    settings where the label has several); for a setting's value, the group identical to it but in that
    setting. A group with no comparable baseline is listed, refused, with the reason (e.g. the baseline
    exists only under another judge profile)."""
    base = baseline if isinstance(baseline, Baseline) else Baseline("baseline", baseline)
    everyone = all_groups if all_groups is not None else groups
    labels = classes(everyone)
    out: list[Comparison] = []
    for g in groups:
        if base.holds(g):
            continue
        cmp = Comparison(
            model=g.model,
            label=g.label,
            baseline=base.label,
            cls=labels[g.comparability],
            seeds=[],
            comparability=g.comparability,
            settings=g.settings,
        )
        bases = _bases(g, base, everyone)
        same = [b for b in bases if b.comparability == g.comparability]
        if len(same) == 1:
            cmp.result, cmp.seeds, cmp.refused = pair(g, same[0])
            cmp.pair = (g, same[0]) if cmp.result is not None else None
        elif same:
            cmp.refused = f"{len(same)} {base.label} groups fit ({'; '.join(b.name for b in same)}): narrow the cells"
        elif bases:
            cmp.refused = incomparable_reason(g.cells[0], bases[0].cells[0]) or "different comparability classes"
        elif base.on_setting:
            cmp.refused = f"no {g.label} · {g.model} cell with {base} that differs from it only in {base.key}"
        else:
            cmp.refused = f"no {base.value} cell for model {g.model}"
        out.append(cmp)
    by_model: dict[tuple[str, str], list[Comparison]] = {}
    for c in out:
        if c.result is not None:
            by_model.setdefault((c.model, c.cls), []).append(c)
    for family in by_model.values():
        for c, p in zip(family, stats.holm([c.result.p_value for c in family])):  # type: ignore[union-attr]
            c.p_holm = p
    return out


def _bases(g: Group, base: Baseline, everyone: list[Group]) -> list[Group]:
    """The groups `g` may be paired with under `base` (any comparability class)."""
    if base.on_setting:
        along = (base.key, f"{base.key}_sha256")  # a file's digest varies with the file

        def rest(x: Group) -> dict[str, str]:
            return {k: v for k, v in x.identity.items() if k not in along}

        return [b for b in everyone if base.holds(b) and b.label == g.label and b.model == g.model and rest(b) == rest(g)]
    bases = [b for b in everyone if base.holds(b) and b.model == g.model]
    same = [b for b in bases if b.comparability == g.comparability]
    if len(same) < 2:
        return bases
    mine = dict(g.settings)  # the label has several groups here: the one with g's values where they differ
    vary = {k for k in mine if len({dict(b.settings).get(k) for b in same}) > 1}
    return [b for b in bases if b.comparability != g.comparability or all(dict(b.settings).get(k) == mine[k] for k in vary)]
