"""Plain-text tables of the report (monospace, one line per row, a caption that says the method).

The report fits 120 columns: what makes cells comparable (data, judge profile, test cap,
problem selection: a *block*) is printed once as a header with a letter (`block_header`), and
every table is cut into one section per block, titled with its letter, so rows carry only
short labels (topology, model, role) and two blocks' rows are never mistaken for each other."""

from __future__ import annotations

import math
from typing import Protocol, Sequence

from apps_bench.report import money, stats
from apps_bench.report.cost import CostRow, FrameworkRow, RoleRow
from apps_bench.report.groups import Comparison, Group, Settings, blocks, classes, letter
from apps_bench.types import JsonObject

Blocks = dict[tuple[str, ...], str]  # comparability class -> block letter (groups.blocks)
WIDTH = 120  # what every line of the report fits in


def wrap(text: str, indent: str = "    ") -> str:
    """A long line (a caption, a note, a refusal's reason) folded to WIDTH, continuation lines indented."""
    import textwrap

    return "\n".join(textwrap.fill(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) for line in text.splitlines())


def text_table(title: str, head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()
    out = [title, line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if caption:
        out.append(caption)
    return "\n".join(out)


def _f(x: float, nd: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _n(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.0f}"


def block_header(groups: list[Group]) -> str:
    """Each block once, with its letter: what the tables' `block X` titles refer to."""
    names, labels = blocks(groups), classes(groups)
    lines = ["blocks (cells are compared problem by problem only within one block):"]
    lines += [wrap(f"  {name}  {labels[cls]}", "     ") for cls, name in names.items()]
    return "\n".join(lines)


def sections(
    title: str, head: Sequence[str], rows: Sequence[tuple[tuple[str, ...], list[str]]], names: Blocks | None, caption: str = ""
) -> str:
    """One text table per block (in block order), titled `<title> · block X`; the caption once, at the end.
    Without `names` the blocks are lettered in the rows' order (the order groups.blocks gives them)."""
    if names is None:
        names = {}
        for cls, _ in rows:
            names.setdefault(cls, letter(len(names)))
    parts = []
    for cls, name in names.items():
        mine = [r for c, r in rows if c == cls]
        if mine:
            parts.append(text_table(f"{title} · block {name}", head, mine))
    if caption:
        parts[-1:] = [(parts[-1] if parts else title) + "\n" + wrap(caption, "")]
    return "\n\n".join(parts)


class Shown(Protocol):
    """A table row made from one grouping: a group, a comparison, a cost row."""

    @property
    def settings(self) -> Settings: ...


def setting_keys(items: Sequence[Shown]) -> list[str]:
    """The setting columns of rows made from one grouping (each row's `settings`, keys in one order)."""
    return [k for k, _ in items[0].settings] if items else []


def setting_values(settings: Settings) -> list[str]:
    return [v for _, v in settings]


def _per_seed(g: Group) -> str:
    """pass@1 of each seed's cell (judged problems), as `s0 0.800  s1 0.900`; a range beyond five seeds."""
    vals = []
    for seed, c in sorted(g.by_seed().items(), key=lambda kv: g.seeds.index(kv[0])):
        out = c.outcomes()
        vals.append((seed, sum(out.values()) / len(out) if out else math.nan))
    if len(vals) > 5:
        shown = [v for _, v in vals if not math.isnan(v)]
        return f"{min(shown):.3f}–{max(shown):.3f} over {len(vals)} seeds" if shown else "-"
    return "  ".join(f"s{seed} {_f(v)}" for seed, v in vals)


def pass_rows(groups: list[Group]) -> list[JsonObject]:
    """The pass@1 table as data, one row per topology × model (× comparability block): what the
    printed table shows and what a sweep's parent run logs as its comparison table."""
    names, letters = classes(groups), blocks(groups)
    rows = []
    for g in groups:
        iv = g.interval
        rows.append(
            {
                "topology": g.label,
                "model": g.model,
                "settings": "; ".join(f"{k}={v}" for k, v in g.settings),
                "pass_at_1": None if iv is None or math.isnan(iv.estimate) else iv.estimate,
                "ci_low": None if iv is None or math.isnan(iv.low) else iv.low,
                "ci_high": None if iv is None or math.isnan(iv.high) else iv.high,
                "seeds": ",".join(g.seeds),
                "n_seeds": len(g.seeds),
                "n_problems": iv.n_problems if iv else 0,
                "per_seed": _per_seed(g),
                "block": letters[g.comparability],
                "comparability": names[g.comparability],
            }
        )
    return rows


def pass_table(groups: list[Group], *, header: bool = True) -> str:
    """One row per topology × model, per block: pooled pass@1 [95% CI] (seeds × problems), then each seed's."""
    names = blocks(groups)
    rows = []
    for g, r in zip(groups, pass_rows(groups)):
        cell = (
            "-"
            if r["pass_at_1"] is None
            else (f"{r['pass_at_1']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] ({r['n_seeds']}s × {r['n_problems']}p)")
        )
        rows.append((g.comparability, [r["topology"], r["model"], *setting_values(g.settings), cell, r["per_seed"]]))
    caption = (
        f"pass@1 over every (problem, seed) of the pooled seeds [{stats.METHOD_CELL.format(b=stats.N_BOOT)}]; "
        "(Ns × Np) = seeds × problems; per seed = each seed's cell alone"
    )
    head = ["topology", "model", *setting_keys(groups), "pass@1 [95% CI]", "per seed"]
    table = sections("pass@1 by topology × model", head, rows, names, caption)
    return (block_header(groups) + "\n\n" + table) if header and groups else table


def compare_table(comps: list[Comparison], names: Blocks | None = None) -> str:
    if not comps:
        return "paired comparison: nothing to compare (every cell is the baseline's)"
    rows = []
    refused = []
    for c in comps:
        if c.result is None:
            refused.append(f"  {c.name} [block {(names or {}).get(c.comparability, '?')}]: refused, not compared — {c.refused}")
            continue
        r = c.result
        rows.append(
            (
                c.comparability,
                [
                    c.model,
                    c.label,
                    *setting_values(c.settings),
                    c.baseline,
                    f"{r.diff:+.3f}",
                    f"[{r.low:+.3f}, {r.high:+.3f}]",
                    f"{r.a_only}/{r.b_only}",
                    stats.format_p(r.p_value),
                    stats.format_p(c.p_holm),
                    ",".join(c.seeds),
                    str(r.n_problems),
                ],
            )
        )
    caption = (
        f"Δ = pass@1(topology) − pass@1(baseline) on the same problems and seeds; {stats.METHOD_PAIRED.format(b=stats.N_BOOT)}; "
        "wins/losses = (problem, seed) pairs solved by one side only"
    )
    head = [
        "model",
        "topology",
        *setting_keys(comps),
        "baseline",
        "Δ pass@1",
        "95% CI",
        "wins/losses",
        "McNemar p",
        "Holm p",
        "seeds",
        "problems",
    ]
    text = (
        sections("paired comparison against the baseline", head, rows, names, caption)
        if rows
        else ("paired comparison against the baseline: no comparison could be drawn")
    )
    if refused:
        text += "\nnot comparable:\n" + "\n".join(wrap(x, "    ") for x in refused)
    return text


def cost_table(costs: list[CostRow], names: Blocks | None = None) -> str:
    rows = [
        (
            c.comparability,
            [
                c.label,
                c.model,
                *setting_values(c.settings),
                f"{c.n_problems}",
                _f(c.pass_at_1),
                _n(c.tokens_per_problem),
                _n(c.tokens_per_solved),
                _f(c.calls_per_problem, 2),
                _f(c.tool_calls_per_problem, 2),
                _f(c.solve_s, 2),
                _f(c.tool_s, 2),
                _f(c.judge_s, 2),
            ],
        )
        for c in costs
    ]
    head = [
        "topology",
        "model",
        *setting_keys(costs),
        "probs",
        "pass@1",
        "tok/prob",
        "tok/solved",
        "calls/prob",
        "tools/prob",
        "solve s",
        "tool s",
        "judge s",
    ]
    caption = (
        "per recorded problem (probs) over the pooled seeds (errors included: their tokens were spent); tok = tokens; tokens and calls "
        "counted at the HTTP transport; tools = python_exec calls; solve s = the agents' wall time, tool s = inside "
        "python_exec, judge s = judging"
    )
    return sections("cost per problem", head, rows, names, caption)


def money_table(costs: list[CostRow], names: Blocks | None = None) -> str:
    rows = []
    for c in costs:
        if c.usd is None:
            rows.append((c.comparability, [c.label, c.model, *setting_values(c.settings), money.NO_PRICE, "-", "-", "-"]))
            continue
        per_solved = money.dollars(c.usd_per_solved) if c.n_solved else "- (none solved)"
        rows.append(
            (
                c.comparability,
                [
                    c.label,
                    c.model,
                    *setting_values(c.settings),
                    c.price,
                    money.dollars(c.usd_per_cell),
                    money.dollars(c.usd_per_problem),
                    per_solved,
                ],
            )
        )
    caption = (
        "USD at the price each cell recorded (model.price, per million input / output tokens, as of the date shown); "
        "every billed token counts, retried attempts' included; per cell = mean over the pooled seeds' cells; "
        "no price = the model preset has none (model.price.input_per_mtok / output_per_mtok / as_of)"
    )
    return sections(
        "cost in money",
        ["topology", "model", *setting_keys(costs), "price in / out per Mtok", "$/cell", "$/problem", "$/solved"],
        rows,
        names,
        caption,
    )


def role_table(rows_in: list[RoleRow], names: Blocks | None = None) -> str:
    def est(r: RoleRow, text: str) -> str:
        return text if r.measured else f"≈{text}"

    rows = [
        (
            r.comparability,
            [
                r.label,
                r.model,
                *setting_values(r.settings),
                r.role,
                _f(r.turns, 2),
                _f(r.replies, 2),
                _f(r.tool_calls, 2),
                est(r, _n(r.tokens)),
                est(r, _f(r.calls, 2)),
                f"{100 * r.token_share:.0f}%" if not math.isnan(r.token_share) else "-",
            ],
        )
        for r in rows_in
    ]
    head = [
        "topology",
        "model",
        *setting_keys(rows_in),
        "role",
        "turns",
        "replies",
        "tool calls",
        "tokens",
        "calls",
        "token share",
    ]
    caption = (
        "per problem; tokens and calls counted at the HTTP transport per role (each agent's client names its role; "
        "selector = AutoGen's speaker-selection calls, made by no agent); turns, replies, tool calls counted from the "
        "transcripts"
    )
    if any(not r.measured for r in rows_in):
        caption += (
            "; ≈ estimated, for records from before calls named their role: each problem's exact totals apportioned "
            "to its roles (prompt tokens by characters given, completion tokens by characters produced, calls by the "
            "model steps the events show), per problem with a transcript"
        )
    return sections("cost per agent role", head, rows, names, caption)


def framework_table(rows_in: list[FrameworkRow], names: Blocks | None = None) -> str:
    if not rows_in:
        return "framework overhead: no sibling runners of one flow among these cells (e.g. sequential_langgraph and sequential_crewai)"
    rows = []
    for r in rows_in:
        dt, dc = r.tokens[1] - r.tokens[0], r.calls[1] - r.calls[0]
        rel = f" ({100 * dt / r.tokens[0]:+.0f}%)" if r.tokens[0] else ""
        rows.append(
            (
                r.comparability,
                [
                    r.flow,
                    r.model,
                    *setting_values(r.settings),
                    f"{r.other} vs {r.base}",
                    f"{_n(r.tokens[1])} vs {_n(r.tokens[0])}",
                    f"{dt:+,.0f}{rel}",
                    f"{_f(r.calls[1], 2)} vs {_f(r.calls[0], 2)}",
                    f"{dc:+.2f}",
                    f"{_f(r.pass_at_1[1])} vs {_f(r.pass_at_1[0])}",
                ],
            )
        )
    head = [
        "flow",
        "model",
        *setting_keys(rows_in),
        "frameworks",
        "tokens/problem",
        "Δ tokens",
        "calls/problem",
        "Δ calls",
        "pass@1",
    ]
    caption = "same flow, roles, prompts and limits on two frameworks: the difference is what the framework itself adds"
    text = sections("framework overhead (sibling runners)", head, rows, names, caption)
    per_role = [
        (
            r.comparability,
            [
                r.flow,
                r.model,
                *setting_values(r.settings),
                f"{r.other} vs {r.base}",
                role,
                f"{_n(t[1])} vs {_n(t[0])}",
                f"{t[1] - t[0]:+,.0f}",
                f"{_f(c[1], 2)} vs {_f(c[0], 2)}",
                f"{c[1] - c[0]:+.2f}",
            ],
        )
        for r in rows_in
        for role, t, c in r.roles
    ]
    if per_role:
        head = [
            "flow",
            "model",
            *setting_keys(rows_in),
            "frameworks",
            "role",
            "tokens/problem",
            "Δ tokens",
            "calls/problem",
            "Δ calls",
        ]
        caption = "per problem, counted per role on both sides; a role only one framework has (selector) is 0 on the other"
        text += "\n\n" + sections("framework overhead per role", head, per_role, names, caption)
    return text
