"""Cost per cell group, per agent role, and what a framework adds over its sibling runner.

Tokens and calls per problem are exact (counted at the HTTP transport, apps_bench.models.
metering), and so are they per role: each agent's client names its role, and every call
entry of a record (`usage.calls`) carries it, so a role's tokens and calls are summed from
the calls it made. Turns, replies and tool calls per role are counted from the transcripts.
Records written before calls carried roles fall back to an estimate, marked as such (≈):
a problem's prompt tokens apportioned to its roles by the characters each role was given
(inputs, tool results), its completion tokens by the characters each produced (replies,
tool-call arguments), its model calls by the model steps each role's events show (a
reply, or a tool call not right after one, starts a step).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from apps_bench.report import money
from apps_bench.report.groups import Group, Settings
from apps_bench.tracking.cell_counts import CellCounts, RoleTally


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
    comparability: tuple[str, ...] = ()  # the group's class (its block)
    n_cells: int = 0
    settings: Settings = ()  # the group's (Group.settings): the setting columns
    usd: float | None = None  # the group's cells at their recorded prices (retries included); None = no price
    price: str = ""  # the price the cells were costed at ("mixed" when seeds ran at different prices)

    @property
    def usd_per_cell(self) -> float | None:
        return self.usd / self.n_cells if self.usd is not None and self.n_cells else None

    @property
    def usd_per_problem(self) -> float | None:
        return self.usd / self.n_problems if self.usd is not None and self.n_problems else None

    @property
    def usd_per_solved(self) -> float | None:
        return self.usd / self.n_solved if self.usd is not None and self.n_solved else None


@dataclass(frozen=True)
class RoleRow:
    label: str
    model: str
    role: str
    problems: int  # problems the role made calls in or appears in the transcript of
    turns: float  # per problem with a transcript
    replies: float
    tool_calls: float
    tokens: float  # per problem: counted (measured) or apportioned (not measured)
    calls: float
    token_share: float  # of the group's tokens
    measured: bool = True  # False: the group's records do not say who made each call; tokens/calls estimated
    comparability: tuple[str, ...] = ()
    settings: Settings = ()


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
    # per role, counted on both sides: (role, (tokens base, other), (calls base, other)); a role one
    # side lacks (AutoGen's selector) has 0 there. Empty when either side's roles are estimated.
    roles: tuple[tuple[str, tuple[float, float], tuple[float, float]], ...] = ()
    comparability: tuple[str, ...] = ()
    settings: Settings = ()


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
                label=g.label,
                model=g.model,
                n_problems=n,
                n_solved=solved,
                pass_at_1=g.interval.estimate if g.interval else float("nan"),
                tokens_per_problem=_avg(tokens, n),
                calls_per_problem=_avg(sum(p["model_calls"] for p in probs), n),
                tool_calls_per_problem=_avg(sum(p["tool_calls"] for p in probs), n),
                tokens_per_solved=_avg(tokens, solved),
                solve_s=_avg(sum(p["solve_s"] for p in probs), n),
                tool_s=_avg(sum(p["tool_s"] for p in probs), n),
                judge_s=_avg(sum(p["judge_s"] for p in probs), n),
                comparability=g.comparability,
                n_cells=len(g.cells),
                settings=g.settings,
                **_money(g),
            )
        )
    return out


def _money(g: Group) -> dict:
    """The group's cost in USD, each cell at the price it recorded: none when any cell has no price."""
    prices = [money.price_of(c.price) for c in g.cells]
    if not prices or any(p is None for p in prices):
        return {"usd": None, "price": money.NO_PRICE}
    usd = sum(
        p.usd(sum(x["billed_input_tokens"] for x in c.problems), sum(x["billed_output_tokens"] for x in c.problems))
        for p, c in zip(prices, g.cells)
        if p is not None
    )
    shown = {(p.input_per_mtok, p.output_per_mtok, p.as_of) for p in prices if p is not None}
    if len(shown) > 1:
        return {"usd": usd, "price": "mixed (seeds ran at different prices)"}
    i, o, as_of = shown.pop()
    return {"usd": usd, "price": f"${i:g} / ${o:g} ({as_of})"}


def role_rows(groups: list[Group]) -> list[RoleRow]:
    """Per role of each group: counted from the calls' roles when every record names them, else estimated.
    Summed from each cell's counts (tracking/cell_counts.py): a group's cells are whole cells."""
    out = []
    for g in groups:
        counts = [c.counts for c in g.cells]
        if not counts or any(k is None for k in counts):
            continue  # read without counts (with_roles=False)
        cc = [k for k in counts if k is not None]
        n = sum(len(c.problems) for c in g.cells)
        measured = n > 0 and all(k.measured for k in cc)
        out += _measured(g, cc, n) if measured else _estimated(g, cc)
    return out


def _summed(counts: list[CellCounts]) -> tuple[dict[str, RoleTally], int, int]:
    """The cells' role tallies summed (transcript roles first, in order of appearance), problems with a
    transcript, and their tokens."""
    roles: dict[str, RoleTally] = {}
    for k in counts:  # the transcripts' roles of every cell before a role only records name
        for role, t in k.roles.items():
            if t.transcripts:
                roles.setdefault(role, RoleTally())
    for k in counts:
        for role, t in k.roles.items():
            s = roles.setdefault(role, RoleTally())
            for f in fields(RoleTally):
                setattr(s, f.name, getattr(s, f.name) + getattr(t, f.name))
    return roles, sum(k.covered for k in counts), sum(k.covered_tokens for k in counts)


def _measured(g: Group, counts: list[CellCounts], n: int) -> list[RoleRow]:
    roles, covered, _ = _summed(counts)
    group_tokens = sum(p["total_tokens"] for c in g.cells for p in c.problems)
    return [
        RoleRow(
            label=g.label,
            model=g.model,
            settings=g.settings,
            role=role,
            problems=max(t.transcripts, t.called_in),
            turns=_avg(t.turns, covered),
            replies=_avg(t.replies, covered),
            tool_calls=_avg(t.tool_calls, covered),
            tokens=_avg(t.tokens, n),
            calls=_avg(t.calls, n),
            token_share=t.tokens / group_tokens if group_tokens else float("nan"),
            measured=True,
            comparability=g.comparability,
        )
        for role, t in roles.items()
    ]


def _estimated(g: Group, counts: list[CellCounts]) -> list[RoleRow]:
    """Older records: each problem's exact totals apportioned to the roles its transcript shows."""
    roles, covered, group_tokens = _summed(counts)
    return [
        RoleRow(
            label=g.label,
            model=g.model,
            settings=g.settings,
            role=role,
            problems=t.transcripts,
            turns=_avg(t.turns, covered),
            replies=_avg(t.replies, covered),
            tool_calls=_avg(t.tool_calls, covered),
            tokens=_avg(t.est_tokens, covered),
            calls=_avg(t.est_calls, covered),
            token_share=t.est_tokens / group_tokens if group_tokens else float("nan"),
            measured=False,
            comparability=g.comparability,
        )
        for role, t in roles.items()
        if t.transcripts
    ]


def framework_rows(groups: list[Group], costs: list[CostRow], roles: list[RoleRow] | None = None) -> list[FrameworkRow]:
    """Sibling runners of one flow (same flow, model, optimizer and comparability class, two
    frameworks): the difference is what the framework itself adds, in all and (with `roles`
    counted on both sides) role by role."""
    by_name = {(c.label, c.model, c.comparability, c.settings): c for c in costs}
    role_map: dict[tuple, list[RoleRow]] = {}
    for r in roles or ():
        role_map.setdefault((r.label, r.model, r.comparability, r.settings), []).append(r)
    buckets: dict[tuple, list[Group]] = {}
    for g in groups:
        first = g.cells[0]
        if not first.flow or not first.framework:
            continue
        buckets.setdefault((first.flow, g.model, first.optimizer, g.comparability, g.settings), []).append(g)
    out = []
    for (flow, model, _opt, cls, settings), members in sorted(buckets.items(), key=lambda kv: (kv[0][3], *kv[0][:3], kv[0][4])):
        members = sorted(members, key=lambda g: (g.cells[0].framework != "langgraph", g.cells[0].framework))
        base = members[0]
        for other in members[1:]:
            if other.cells[0].framework == base.cells[0].framework:
                continue
            a, b = by_name[(base.label, model, cls, settings)], by_name[(other.label, model, cls, settings)]
            ra, rb = role_map.get((base.label, model, cls, settings), []), role_map.get((other.label, model, cls, settings), [])
            both = bool(ra and rb) and all(r.measured for r in ra + rb)
            out.append(
                FrameworkRow(
                    flow=flow,
                    model=model,
                    base=base.cells[0].framework,
                    other=other.cells[0].framework,
                    base_label=base.label,
                    other_label=other.label,
                    tokens=(a.tokens_per_problem, b.tokens_per_problem),
                    calls=(a.calls_per_problem, b.calls_per_problem),
                    pass_at_1=(a.pass_at_1, b.pass_at_1),
                    roles=_role_pairs(ra, rb) if both else (),
                    comparability=cls,
                    settings=settings,
                )
            )
    return out


def _role_pairs(base: list[RoleRow], other: list[RoleRow]) -> tuple:
    """Each role of either side (base's order first): its tokens and calls per problem on both."""
    a, b = {r.role: r for r in base}, {r.role: r for r in other}
    names = list(a) + [r for r in b if r not in a]

    def get(rows: dict[str, RoleRow], role: str, measure: str) -> float:
        return getattr(rows[role], measure) if role in rows else 0.0

    return tuple((r, (get(a, r, "tokens"), get(b, r, "tokens")), (get(a, r, "calls"), get(b, r, "calls"))) for r in names)
