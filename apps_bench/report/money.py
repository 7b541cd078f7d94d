"""Cost in money: a cell's tokens at its model preset's price (`model.price`, USD per million).

Every token a problem was billed for counts, the replies its retries discarded included
(`usage.retried_*_tokens`, as far as the server reported them): prompt tokens at the input
price, completion tokens at the output price. A model with no price gives no figure (None),
shown as "no price", never as $0. The price is not part of a cell's identity (cell.RUN_ONLY):
it is recorded with the cell's summary (summary.json `cost`, the run's `price_*` tags) and the
report prices each cell at its own recorded price.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from apps_bench.types import JsonObject, ProblemRecord

NO_PRICE = "no price"


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    as_of: str

    def usd(self, input_tokens: float, output_tokens: float) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6

    def describe(self) -> str:
        return f"${self.input_per_mtok:g} in / ${self.output_per_mtok:g} out per Mtok, as of {self.as_of}"

    def as_dict(self) -> JsonObject:
        return {"input_per_mtok": self.input_per_mtok, "output_per_mtok": self.output_per_mtok, "as_of": self.as_of}


def price_of(node: object) -> Price | None:
    """A `model.price` node (config dataclass, or the dict a summary or a run's tags recorded) -> Price, or None when unpriced."""
    if node is None:
        return None
    get = node.get if isinstance(node, dict) else lambda k: getattr(node, k, None)
    inp, out = get("input_per_mtok"), get("output_per_mtok")
    if inp in (None, "", "None") or out in (None, "", "None"):
        return None
    return Price(float(inp), float(out), str(get("as_of") or "?"))


def cell_cost(records: Iterable[ProblemRecord], price: Price | None) -> JsonObject:
    """summary.json's `cost`: billed tokens and, with a price, USD per cell, per recorded problem
    (errors included: their tokens were spent) and per solved problem (None when none was solved)."""
    recs = list(records)
    tin = tout = 0
    for r in recs:
        i, o = r.usage.billed_tokens
        tin, tout = tin + i, tout + o
    solved = sum(1 for r in recs if r.passed and not r.error)
    out: JsonObject = {
        "input_tokens": tin,
        "output_tokens": tout,
        "problems": len(recs),
        "solved": solved,
        "price": price.as_dict() if price else None,
    }
    usd = price.usd(tin, tout) if price else None
    out.update(
        usd=usd,
        usd_per_problem=usd / len(recs) if usd is not None and recs else None,
        usd_per_solved=usd / solved if usd is not None and solved else None,
    )
    return out


def dollars(x: float | None) -> str:
    """$ with enough digits for cheap cells (a gold or small-model cell can cost fractions of a cent)."""
    if x is None:
        return "-"
    if x == 0 or abs(x) >= 1:
        return f"${x:,.2f}"
    return f"${x:.2g}" if abs(x) < 0.0001 else f"${x:.4f}"


def cost_line(cost: JsonObject | None, model: str) -> str:
    """The end-of-cell console line."""
    if not cost:
        return f"cost: {NO_PRICE}"
    tokens = f"{cost['input_tokens']:,} input + {cost['output_tokens']:,} output tokens, retried attempts' included"
    price = price_of(cost.get("price"))
    if price is None:
        return (
            f"cost: {NO_PRICE} for model {model} (set model.price.input_per_mtok, .output_per_mtok and .as_of "
            f"to see it in USD); {tokens}"
        )
    per_solved = dollars(cost["usd_per_solved"]) if cost.get("usd_per_solved") is not None else "- (none solved)"
    return (
        f"cost: {dollars(cost['usd'])} for the cell, {dollars(cost['usd_per_problem'])}/problem, "
        f"{per_solved}/solved at {price.describe()}; {tokens}"
    )


def metrics(cost: JsonObject | None) -> dict[str, float]:
    """MLflow metrics of a priced cell (none without a price: a missing metric, never a 0)."""
    if not cost or cost.get("usd") is None:
        return {}
    out = {"cost_usd": cost["usd"]}
    for k in ("usd_per_problem", "usd_per_solved"):
        if cost.get(k) is not None:
            out[f"cost_{k}"] = cost[k]
    return {k: float(v) for k, v in out.items()}


def tags(cost: JsonObject | None) -> dict[str, str]:
    """The price a cell's run was costed at (the report prices its records with it); '' = no price."""
    price = price_of((cost or {}).get("price"))
    if price is None:
        return {"price_input_per_mtok": "", "price_output_per_mtok": "", "price_as_of": ""}
    return {
        "price_input_per_mtok": repr(price.input_per_mtok),
        "price_output_per_mtok": repr(price.output_per_mtok),
        "price_as_of": price.as_of,
    }
