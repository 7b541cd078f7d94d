"""Cost per cell group, per agent role, and what a framework adds over its sibling runner.

Tokens and calls per problem are exact (counted at the HTTP transport, apps_bench.models.
metering). The transport does not know which agent sent a request, so the per-role split
comes from the transcripts: turns, replies and tool calls per role are counted exactly;
a problem's prompt tokens are apportioned to its roles by the characters each role was
given (inputs, tool results), its completion tokens by the characters each produced
(replies, tool-call arguments), its model calls by the model steps each role's events show (a reply, or a tool call not
right after one, starts a step).
The role table says so in its caption.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps_bench.report.groups import Group


@dataclass(frozen=True)
class CostRow:
    label: str
    model: str
    n_problems: int  # recorded, errors included (their tokens were spent)
    n_solved: int
    pass_at_1: float
    tokens_per_problem: float
    calls_per_problem: float
    tool_calls_per_problem: float
    tokens_per_solved: float  # nan when nothing was solved
    solve_s: float  # per problem: the agents' wall time (model and python_exec)
    tool_s: float  # per problem: inside python_exec (the sandbox)
    judge_s: float  # per problem: judging, apart from solving


@dataclass(frozen=True)
class RoleRow:
    label: str
    model: str
    role: str
    problems: int  # problems with a transcript that the role appears in
    turns: float  # per problem
    replies: float
    tool_calls: float
    tokens: float  # apportioned, per problem
    calls: float  # apportioned, per problem
    token_share: float  # of the group's tokens on problems with transcripts


@dataclass(frozen=True)
class FrameworkRow:
    flow: str
    model: str
    base: str  # framework of the reference runner (langgraph when one side is)
    other: str
    base_label: str
    other_label: str
    tokens: tuple[float, float]  # per problem: base, other
    calls: tuple[float, float]
    pass_at_1: tuple[float, float]


def _avg(total: float, n: int) -> float:
    return total / n if n else float("nan")


def cost_rows(groups: list[Group]) -> list[CostRow]:
    out = []
    for g in groups:
        probs = [p for c in g.cells for p in c.problems]
        n = len(probs)
        solved = sum(bool(p["passed"]) and not p["error"] for p in probs)
        tokens = sum(p["total_tokens"] for p in probs)
        out.append(
            CostRow(
                label=g.label, model=g.model, n_problems=n, n_solved=solved,
                pass_at_1=g.interval.estimate if g.interval else float("nan"),
                tokens_per_problem=_avg(tokens, n), calls_per_problem=_avg(sum(p["model_calls"] for p in probs), n),
                tool_calls_per_problem=_avg(sum(p["tool_calls"] for p in probs), n),
                tokens_per_solved=_avg(tokens, solved),
                solve_s=_avg(sum(p["solve_s"] for p in probs), n), tool_s=_avg(sum(p["tool_s"] for p in probs), n),
                judge_s=_avg(sum(p["judge_s"] for p in probs), n),
            )  # fmt: skip
        )
    return out


def role_rows(groups: list[Group]) -> list[RoleRow]:
    out = []
    for g in groups:
        acc: dict[str, list[float]] = {}  # role -> [problems, turns, replies, tool_calls, tokens, calls]
        covered = 0
        group_tokens = 0.0
        for c in g.cells:
            for p in c.problems:
                uses = c.roles.get(p["key"])
                if not uses:
                    continue
                covered += 1
                group_tokens += p["total_tokens"]
                cin = sum(u.chars_in for u in uses.values()) or 1
                cout = sum(u.chars_out for u in uses.values()) or 1
                steps = sum(u.steps for u in uses.values()) or 1
                for role, u in uses.items():
                    a = acc.setdefault(role, [0.0] * 6)
                    a[0] += 1
                    a[1] += u.turns
                    a[2] += u.replies
                    a[3] += u.tool_calls
                    a[4] += p["prompt_tokens"] * u.chars_in / cin + p["completion_tokens"] * u.chars_out / cout
                    a[5] += p["model_calls"] * u.steps / steps
        for role, a in acc.items():
            out.append(
                RoleRow(
                    label=g.label, model=g.model, role=role, problems=int(a[0]),
                    turns=_avg(a[1], covered), replies=_avg(a[2], covered), tool_calls=_avg(a[3], covered),
                    tokens=_avg(a[4], covered), calls=_avg(a[5], covered),
                    token_share=a[4] / group_tokens if group_tokens else float("nan"),
                )  # fmt: skip
            )
    return out


def framework_rows(groups: list[Group], costs: list[CostRow]) -> list[FrameworkRow]:
    """Sibling runners of one flow (same flow, model, optimizer and comparability class, two
    frameworks): the difference is what the framework itself adds."""
    by_name = {(c.label, c.model): c for c in costs}
    buckets: dict[tuple, list[Group]] = {}
    for g in groups:
        first = g.cells[0]
        if not first.flow or not first.framework:
            continue
        buckets.setdefault((first.flow, g.model, first.optimizer, g.comparability), []).append(g)
    out = []
    for (flow, model, _opt, _cls), members in sorted(buckets.items(), key=lambda kv: kv[0][:3]):
        members = sorted(members, key=lambda g: (g.cells[0].framework != "langgraph", g.cells[0].framework))
        base = members[0]
        for other in members[1:]:
            if other.cells[0].framework == base.cells[0].framework:
                continue
            a, b = by_name[(base.label, model)], by_name[(other.label, model)]
            out.append(
                FrameworkRow(
                    flow=flow, model=model, base=base.cells[0].framework, other=other.cells[0].framework,
                    base_label=base.label, other_label=other.label,
                    tokens=(a.tokens_per_problem, b.tokens_per_problem), calls=(a.calls_per_problem, b.calls_per_problem),
                    pass_at_1=(a.pass_at_1, b.pass_at_1),
                )  # fmt: skip
            )
    return out
