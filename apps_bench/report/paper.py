"""The APPS paper's layout: rows = model × topology (with the settings that tell groups apart), columns
= the difficulty tiers for test-case average and strict accuracy (Hendrycks et al. 2021, Table 2),
and pass@k from the seeds as samples (Chen et al. 2021). Printed as the report's text tables, or
as CSV, LaTeX or Markdown for a paper (`report --table apps-paper|pass-at-k --format ...`).
The figures are report.tiers'; this module only lays them out."""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from typing import Sequence

from apps_bench.report import stats, tiers
from apps_bench.report.groups import Group, blocks
from apps_bench.report.render import block_header, sections, setting_keys, setting_values
from apps_bench.report.stats import Interval

TABLES = ("apps-paper", "pass-at-k")
FORMATS = ("text", "csv", "latex", "markdown")
METRICS = (("test_case_average", "test-case average"), ("strict_accuracy", "strict accuracy"))
COLUMNS = (*tiers.TIERS, tiers.ALL)
LOWER_BOUND_NOTE = (
    "≥ = a lower bound: the judge stopped each failing program at its first failing test (judge.stop_on_first_failure: "
    "true), so tests after it were never run; run every test with judge.stop_on_first_failure=false "
    "(or re-score: python -m apps_bench.rescore CELL judge.stop_on_first_failure=false)"
)


@dataclass
class PaperRow:
    group: Group
    figures: dict[str, tiers.TierFigures]
    pass_at_k: tiers.PassAtK | None  # None: one seed, no samples to draw k from


def rows_of(groups: Sequence[Group]) -> list[PaperRow]:
    """Each group's tier figures (seeds pooled) and, with two seeds or more, its pass@1..n."""
    out = []
    for g in groups:
        samples = [c.problems for c in g.cells]
        early = any(tiers.stops_early(c.identity) for c in g.cells)
        out.append(
            PaperRow(
                g,
                tiers.apps_figures(samples, stopped_early=early),
                tiers.pass_at_k_figures(samples) if len(samples) > 1 else None,
            )
        )
    return out


def _iv(iv: Interval | None, bound: bool = False, scale: float = 1.0, nd: int = 3) -> str:
    if iv is None or math.isnan(iv.estimate):
        return "-"
    mark = "≥" if bound else ""
    return f"{mark}{scale * iv.estimate:.{nd}f} [{scale * iv.low:.{nd}f}, {scale * iv.high:.{nd}f}]"


def _est(iv: Interval) -> str:
    return "-" if math.isnan(iv.estimate) else f"{iv.estimate:.3f}"


def _fig(row: PaperRow, metric: str, tier: str) -> tuple[Interval | None, bool]:
    f = row.figures.get(tier)
    if f is None:
        return None, False
    return getattr(f, metric), metric == "test_case_average" and f.lower_bound


# ----------------------------------------------------------------------------- text (the report's own tables)


def apps_text(rows: Sequence[PaperRow], *, header: bool = True, compact: bool = False) -> str:
    """The paper's layout (a line per group and metric, the tiers as columns); `compact` (the report's own,
    within its 120 columns): a line per group and tier, the two metrics as columns."""
    groups = [r.group for r in rows]
    lines = []
    for r in rows:
        base = [r.group.label, r.group.model, *setting_values(r.group.settings)]
        if compact:
            for t in COLUMNS:
                cells = [_iv(*_fig(r, metric, t)) for metric, _ in METRICS]
                lines.append((r.group.comparability, [*base, t, f"{len(r.group.seeds)}", *cells]))
            continue
        for metric, name in METRICS:
            cells = [_iv(*_fig(r, metric, t)) for t in COLUMNS]
            lines.append((r.group.comparability, [*base, name, f"{len(r.group.seeds)}", *cells]))
    caption = (
        "APPS paper Table 2's figures per difficulty tier, each seed's cell a sample pooled over the seeds: test-case average = "
        "mean over problems of the share of the kept tests passed (a compile error passes none, a timed-out test fails); "
        "strict accuracy = share of problems passing every kept test (= pass@1); all = every problem, weighted by problems; "
        f"[95% CI: {stats.METHOD_CELL.format(b=stats.N_BOOT)}]; infrastructure errors left out"
    )
    if any(f.lower_bound for r in rows for f in r.figures.values()):
        caption += "; " + LOWER_BOUND_NOTE
    if compact:
        head = ["topology", "model", *setting_keys(groups), "tier", "seeds", *(name for _, name in METRICS)]
        caption += "; the paper's layout (tiers as columns; CSV, LaTeX, Markdown): --table apps-paper"
    else:
        head = ["topology", "model", *setting_keys(groups), "metric", "seeds", *COLUMNS]
    table = sections("APPS table (test-case average, strict accuracy) by tier", head, lines, blocks(groups), caption)
    return (block_header(groups) + "\n\n" + table) if header and groups else table


def pass_at_k_text(rows: Sequence[PaperRow], *, header: bool = True, compact: bool = False) -> str:
    """A line per group and k, the tiers as columns, each with its interval; `compact` (the report's own,
    within its 120 columns): the tiers' estimates, the interval for `all` only."""
    with_k = [r for r in rows if r.pass_at_k is not None]
    if not with_k:
        return "pass@k: every group has one seed (pass@k needs n >= 2 seed cells of one identity: seed=0,1,2)"
    groups = [r.group for r in with_k]
    lines = []
    for r in with_k:
        p = r.pass_at_k
        assert p is not None
        for k in range(1, p.n + 1):
            cells = [
                (_iv(p.by_tier[t][k - 1]) if not compact or t == tiers.ALL else _est(p.by_tier[t][k - 1]))
                if t in p.by_tier
                else "-"
                for t in COLUMNS
            ]
            lines.append(
                (
                    r.group.comparability,
                    [
                        r.group.label,
                        r.group.model,
                        *setting_values(r.group.settings),
                        f"pass@{k}",
                        f"{p.n}",
                        f"{p.n_problems}" + (f" (-{p.left_out})" if p.left_out else ""),
                        *cells,
                    ],
                )
            )
    caption = (
        "pass@k = 1 - C(n-c, k) / C(n, k) per problem (Chen et al. 2021), n = the group's seed cells as samples, c = the "
        "seeds that solved it; mean over the problems judged in all n (problems, with (-m) those judged in fewer, "
        f"left out) [95% CI: {stats.METHOD_CELL.format(b=stats.N_BOOT)}]; pass@1 here is over those problems only, "
        "the headline pass@1 is the table above"
    )
    if compact:
        caption += "; every tier with its interval (and CSV, LaTeX, Markdown): --table pass-at-k"
    head = ["topology", "model", *setting_keys(groups), "k", "n", "problems", *COLUMNS]
    table = sections("pass@k by tier (seeds as samples)", head, lines, blocks(groups), caption)
    return (block_header(groups) + "\n\n" + table) if header else table


# ----------------------------------------------------------------------------- CSV, LaTeX, Markdown


@dataclass
class _Line:
    """One line of an exported table: its labels and its metric columns (an interval, whether a lower bound)."""

    labels: list[str]
    values: list[tuple[Interval | None, bool]]


def _lines(rows: Sequence[PaperRow], table: str) -> tuple[list[str], list[str], list[_Line]]:
    """(label heads, metric heads, lines): apps-paper = one line per group, test-case average then strict
    accuracy per tier; pass-at-k = one line per group and k, pass@k per tier."""
    groups = [r.group for r in rows]
    names = blocks(groups)
    several = len(set(names.values())) > 1
    heads = ["model", "topology", *setting_keys(groups), *(["block"] if several else [])]
    out = []
    for r in rows:
        base = [
            r.group.model,
            r.group.label,
            *setting_values(r.group.settings),
            *([names[r.group.comparability]] if several else []),
        ]
        if table == "apps-paper":
            out.append(_Line([*base, str(len(r.group.seeds))], [_fig(r, m, t) for m, _ in METRICS for t in COLUMNS]))
        elif r.pass_at_k is not None:
            p = r.pass_at_k
            out += [
                _Line(
                    [*base, str(k + 1), str(p.n), str(p.n_problems), str(p.left_out)],
                    [(p.by_tier[t][k] if t in p.by_tier else None, False) for t in COLUMNS],
                )
                for k in range(p.n)
            ]
    if table == "apps-paper":
        return [*heads, "seeds"], [f"{name}: {t}" for _, name in METRICS for t in COLUMNS], out
    return [*heads, "k", "n", "problems", "left out"], [f"pass@k: {t}" for t in COLUMNS], out


def export(rows: Sequence[PaperRow], table: str, fmt: str) -> str:
    """`table` (apps-paper or pass-at-k) as CSV (fractions: estimate, interval, and for the test-case average
    whether it is a lower bound), LaTeX or Markdown (percent with the 95% interval, ≥ marking a lower bound)."""
    heads, metric_heads, lines = _lines(rows, table)
    bound = any(b for line in lines for _, b in line.values)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        names = [_snake(h) for h in metric_heads]
        w.writerow(
            [*map(_snake, heads), *(f"{n}{x}" for n in names for x in ("", "_low", "_high"))]
            + (["test_case_average_is_lower_bound"] if table == "apps-paper" else [])
        )
        for line in lines:
            flat = [
                x
                for iv, _ in line.values
                for x in (("", "", "") if iv is None else (f"{iv.estimate:.6f}", f"{iv.low:.6f}", f"{iv.high:.6f}"))
            ]
            lower = ["true" if any(b for _, b in line.values) else "false"] if table == "apps-paper" else []
            w.writerow([*line.labels, *flat, *lower])
        return buf.getvalue()
    cells = [[*line.labels, *(_iv(iv, b, scale=100.0, nd=1) for iv, b in line.values)] for line in lines]
    note = "Percent [95% CI]." + (" " + LOWER_BOUND_NOTE if bound else "")
    if fmt == "markdown":
        head = [*heads, *metric_heads]
        out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        out += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(out) + "\n\n" + note + "\n"
    if fmt == "latex":
        return _latex(heads, table, cells, note)
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def _snake(head: str) -> str:
    """A CSV column name: `test-case average: all` -> `test_case_average_all`, `pass@k: all` -> `pass_at_k_all`."""
    return re.sub(r"[^a-z0-9.]+", "_", head.lower().replace("@", "_at_")).strip("_")


def _tex(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("&", r"\&"), ("%", r"\%"), ("#", r"\#"), ("≥", r"$\geq$")):
        s = s.replace(a, b)
    return s


def _latex(heads: list[str], table: str, cells: list[list[str]], note: str) -> str:
    """A booktabs tabular: the label columns, then one column group per metric over the tiers."""
    groups = ["Test-case average (\\%)", "Strict accuracy (\\%)"] if table == "apps-paper" else ["pass@$k$ (\\%)"]
    lines = [
        r"\begin{tabular}{" + "l" * len(heads) + "r" * (len(COLUMNS) * len(groups)) + "}",
        r"\toprule",
        " & " * len(heads) + " & ".join(rf"\multicolumn{{{len(COLUMNS)}}}{{c}}{{{g}}}" for g in groups) + r" \\",
        " & ".join([*map(_tex, heads), *(t.capitalize() for _ in groups for t in COLUMNS)]) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(map(_tex, c)) + r" \\" for c in cells]
    lines += [r"\bottomrule", r"\end{tabular}", "% " + note.replace("\n", " ")]
    return "\n".join(lines) + "\n"
