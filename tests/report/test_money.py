"""Cost in money (apps_bench/report/money.py): retried attempts' tokens are billed, a missing price is
never $0, and half a price is refused before anything of the cell exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import problem_record, run_cli

from apps_bench.report import money
from apps_bench.report.cells import CellData, problem_row
from apps_bench.report.cost import cost_rows
from apps_bench.report.groups import group_cells
from apps_bench.types import ProblemRecord

PRICE = {"input_per_mtok": 3.7, "output_per_mtok": 11.3, "as_of": "2026-12-03"}  # made up (no vendor's)


def _rec(i: int, passed: bool, p: int, c: int, rp: int = 0, rc: int = 0) -> ProblemRecord:
    usage = {
        "prompt_tokens": p,
        "completion_tokens": c,
        "retried_prompt_tokens": rp,
        "retried_completion_tokens": rc,
        "model_calls": 1,
        "calls": [],
    }
    return problem_record(i, passed=passed, usage=usage)


RECORDS = [_rec(0, True, 1000, 200, rp=500, rc=50), _rec(1, False, 3000, 400), _rec(2, True, 2000, 100, rp=2000)]
# by hand: input 1000+500+3000+2000+2000 = 8500, output 200+50+400+100 = 750
USD = 8500 * 3.7 / 1e6 + 750 * 11.3 / 1e6


def test_retried_tokens_are_billed_per_cell_problem_and_solved():
    cost = money.cell_cost(RECORDS, money.price_of(PRICE))
    assert (cost["input_tokens"], cost["output_tokens"]) == (8500, 750)
    assert cost["usd"] == pytest.approx(USD)
    assert cost["usd_per_problem"] == pytest.approx(USD / 3) and cost["usd_per_solved"] == pytest.approx(USD / 2)
    assert money.metrics(cost) == pytest.approx(
        {"cost_usd": USD, "cost_usd_per_problem": USD / 3, "cost_usd_per_solved": USD / 2}
    )
    # the report prices the same records the same way, at the price the cell recorded
    cell = CellData(
        dataset="apps",
        topology="single",
        model="m",
        optimizer="none",
        seed="0",
        key="k",
        judge_profile="seed",
        max_tests_per_row="20",
        selection={},
        complete=True,
        source="x",
        price=dict(PRICE),
        problems=[problem_row(r) for r in RECORDS],
    )
    [row] = cost_rows(group_cells([cell]))
    assert row.usd == pytest.approx(USD) and row.usd_per_solved == pytest.approx(USD / 2)
    assert row.price == "$3.7 / $11.3 (2026-12-03)"


def test_no_price_is_no_figure_never_zero():
    cost = money.cell_cost(RECORDS, money.price_of({"input_per_mtok": None, "output_per_mtok": None, "as_of": None}))
    assert cost["usd"] is None and cost["price"] is None and money.metrics(cost) == {}
    line = money.cost_line(cost, "gold")
    assert line.startswith("cost: no price for model gold") and "$" not in line
    cell = CellData(
        dataset="apps",
        topology="single",
        model="m",
        optimizer="none",
        seed="0",
        key="k",
        judge_profile="seed",
        max_tests_per_row="20",
        selection={},
        complete=True,
        source="x",
        problems=[problem_row(r) for r in RECORDS],
    )
    [row] = cost_rows(group_cells([cell]))
    assert row.usd is None and row.price == money.NO_PRICE


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["model.price.input_per_mtok=3.7"], ["model.price.output_per_mtok=null", "model.price.as_of=null", "both token prices"]),
        (
            ["model.price.input_per_mtok=-1", "model.price.output_per_mtok=1", "model.price.as_of=2026-12-03"],
            ["model.price.input_per_mtok=-1", "USD per million tokens >= 0"],
        ),
    ],
)
def test_a_bad_price_is_refused_before_the_cell_exists(tmp_path: Path, args: list[str], words: list[str]):
    r = run_cli(["dataset=demo", "progress=false", *args], tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "outputs" / "cells").exists() and not (tmp_path / "outputs" / "mlflow.db").exists()
