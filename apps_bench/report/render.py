"""Plain-text tables of the report (monospace, one line per row, a caption that says the method)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from apps_bench.report import stats
from apps_bench.report.cost import CostRow, FrameworkRow, RoleRow
from apps_bench.report.groups import Comparison, Group, classes


def text_table(title: str, head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths))
    out = [title, line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if caption:
        out.append(caption)
    return "\n".join(out)


def _f(x: float, nd: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _n(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.0f}"


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def pass_rows(groups: list[Group]) -> list[dict[str, Any]]:
    """The pass@1 table as data, one row per topology × model (× comparability class): what the
    printed table shows and what a sweep's parent run logs as its comparison table."""
    names = classes(groups)
    rows = []
    for g in groups:
        iv = g.interval
        rows.append({
            "topology": g.label, "model": g.model,
            "pass_at_1": None if iv is None or math.isnan(iv.estimate) else iv.estimate,
            "ci_low": None if iv is None or math.isnan(iv.low) else iv.low,
            "ci_high": None if iv is None or math.isnan(iv.high) else iv.high,
            "seeds": ",".join(g.seeds), "n_seeds": len(g.seeds), "n_problems": iv.n_problems if iv else 0,
            "comparability": names[g.comparability],
        })  # fmt: skip
    return rows


def pass_table(groups: list[Group]) -> str:
    """Rows = topology label, columns = model: pass@1 [95% CI] (seeds), one block per comparability class."""
    rows_in = pass_rows(groups)
    many = len({r["comparability"] for r in rows_in}) > 1
    models = sorted({r["model"] for r in rows_in})
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows_in:
        cells.setdefault(f"{r['topology']}  [{r['comparability']}]" if many else r["topology"], {})[r["model"]] = r
    rows = []
    for label, row in cells.items():
        out = [label]
        for m in models:
            r = row.get(m)
            if r is None or r["pass_at_1"] is None:
                out.append("-")
                continue
            out.append(f"{r['pass_at_1']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] ({r['n_seeds']}s × {r['n_problems']}p)")
        rows.append(out)
    cls = "" if many or not rows_in else f"; {rows_in[0]['comparability']}"
    caption = (
        f"pass@1 over every (problem, seed) of the pooled seeds [{stats.METHOD_CELL.format(b=stats.N_BOOT)}]; "
        f"(Ns × Np) = seeds × problems{cls}"
    )
    return text_table("pass@1 by topology × model", ["topology", *models], rows, caption)


def compare_table(comps: list[Comparison]) -> str:
    rows = []
    refused = []
    for c in comps:
        if c.result is None:
            refused.append(f"  {c.name}: refused, not compared — {c.refused}")
            continue
        r = c.result
        rows.append([
            c.model, c.label, c.baseline, f"{r.diff:+.3f}", f"[{r.low:+.3f}, {r.high:+.3f}]",
            f"{r.a_only}/{r.b_only}", _p(r.p_value), _p(c.p_holm), ",".join(c.seeds), str(r.n_problems),
        ])  # fmt: skip
    caption = (
        f"Δ = pass@1(topology) − pass@1(baseline) on the same problems and seeds; {stats.METHOD_PAIRED.format(b=stats.N_BOOT)}; "
        "wins/losses = (problem, seed) pairs solved by one side only"
    )
    if not comps:
        return "paired comparison: nothing to compare (every cell is the baseline's)"
    head = ["model", "topology", "baseline", "Δ pass@1", "95% CI", "wins/losses", "McNemar p", "Holm p", "seeds", "problems"]
    text = text_table("paired comparison against the baseline", head, rows, caption)
    if refused:
        text += "\nnot comparable:\n" + "\n".join(refused)
    return text


def cost_table(costs: list[CostRow]) -> str:
    rows = [
        [c.label, c.model, f"{c.n_problems}", _f(c.pass_at_1), _n(c.tokens_per_problem), _n(c.tokens_per_solved),
         _f(c.calls_per_problem, 2), _f(c.tool_calls_per_problem, 2), _f(c.solve_s, 2), _f(c.tool_s, 2), _f(c.judge_s, 2)]
        for c in costs
    ]  # fmt: skip
    head = ["topology", "model", "problems", "pass@1", "tokens/problem", "tokens/solved", "calls/problem",
            "tool calls/problem", "solve s", "tool s", "judge s"]  # fmt: skip
    caption = (
        "per recorded problem over the pooled seeds (errors included: their tokens were spent); tokens and calls "
        "counted at the HTTP transport; solve s = the agents' wall time, tool s = inside python_exec, judge s = judging"
    )
    return text_table("cost per problem", head, rows, caption)


def role_table(rows_in: list[RoleRow]) -> str:
    def est(r: RoleRow, text: str) -> str:
        return text if r.measured else f"≈{text}"

    rows = [
        [r.label, r.model, r.role, _f(r.turns, 2), _f(r.replies, 2), _f(r.tool_calls, 2), est(r, _n(r.tokens)),
         est(r, _f(r.calls, 2)), f"{100 * r.token_share:.0f}%" if not math.isnan(r.token_share) else "-"]
        for r in rows_in
    ]  # fmt: skip
    head = ["topology", "model", "role", "turns", "replies", "tool calls", "tokens", "calls", "token share"]
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
    return text_table("cost per agent role", head, rows, caption)


def framework_table(rows_in: list[FrameworkRow]) -> str:
    if not rows_in:
        return "framework overhead: no sibling runners of one flow among these cells (e.g. sequential_langgraph and sequential_crewai)"
    rows = []
    for r in rows_in:
        dt, dc = r.tokens[1] - r.tokens[0], r.calls[1] - r.calls[0]
        rel = f" ({100 * dt / r.tokens[0]:+.0f}%)" if r.tokens[0] else ""
        rows.append([
            r.flow, r.model, f"{r.other_label} vs {r.base_label}", f"{_n(r.tokens[1])} vs {_n(r.tokens[0])}",
            f"{dt:+,.0f}{rel}", f"{_f(r.calls[1], 2)} vs {_f(r.calls[0], 2)}", f"{dc:+.2f}",
            f"{_f(r.pass_at_1[1])} vs {_f(r.pass_at_1[0])}",
        ])  # fmt: skip
    head = ["flow", "model", "runners", "tokens/problem", "Δ tokens", "calls/problem", "Δ calls", "pass@1"]
    caption = "same flow, roles, prompts and limits on two frameworks: the difference is what the framework itself adds"
    text = text_table("framework overhead (sibling runners)", head, rows, caption)
    per_role = [
        [r.flow, r.model, f"{r.other} vs {r.base}", role, f"{_n(t[1])} vs {_n(t[0])}", f"{t[1] - t[0]:+,.0f}",
         f"{_f(c[1], 2)} vs {_f(c[0], 2)}", f"{c[1] - c[0]:+.2f}"]
        for r in rows_in for role, t, c in r.roles
    ]  # fmt: skip
    if per_role:
        head = ["flow", "model", "frameworks", "role", "tokens/problem", "Δ tokens", "calls/problem", "Δ calls"]
        caption = "per problem, counted per role on both sides; a role only one framework has (selector) is 0 on the other"
        text += "\n\n" + text_table("framework overhead per role", head, per_role, caption)
    return text
