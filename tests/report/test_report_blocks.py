"""Issue 25's acceptance for reading the results: a 3 topology × 2 seed × 2 data-file gold sweep
through the real CLI (basic launcher, real SQLite MLflow store, real APPS rows cut into two files),
priced on the command line. Checked against the cells' own records on disk, computed here by hand:

- the report fits 120 columns and names the blocks (one per file) once, short (the file's name, `local`,
  judge profile, test cap, selection), and every table names the block of each of its sections;
- pass@1 per seed beside the pooled interval; the sweep prints its comparison and where to look next;
- the cost in money per cell, per problem and per solved problem (retried tokens included) in the
  end-of-cell line, summary.json, the MLflow metrics and the report; a price is not part of the cell
  (the same cell without one resumes, and says "no price", never $0).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPOLOGIES = ("single", "independent", "sequential_langgraph")
SEEDS = ("0", "1")
FILES = ("part_a.jsonl", "part_b.jsonl")
LIMIT = 3
PRICE_IN, PRICE_OUT, AS_OF = 3.7, 11.3, "2026-12-03"  # made up for the test (no vendor's): USD per million tokens
PRICE = [f"model.price.input_per_mtok={PRICE_IN}", f"model.price.output_per_mtok={PRICE_OUT}", f"model.price.as_of={AS_OF}"]
TITLES = (
    "pass@1 by topology × model",
    "paired comparison against the baseline",
    "cost per problem",
    "cost in money",
    "cost per agent role",
)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("blocks")
    rows = (apps_data_dir / "train_mini150.jsonl").read_text().splitlines(keepends=True)
    data = cwd / "data"
    data.mkdir()
    (data / FILES[0]).write_text("".join(rows[:20]))
    (data / FILES[1]).write_text("".join(rows[20:40]))
    db = fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env = cli_env(cwd)
    args = [
        "-m",
        f"topology={','.join(TOPOLOGIES)}",
        f"seed={','.join(SEEDS)}",
        "dataset=apps",
        f"dataset.path={data / FILES[0]},{data / FILES[1]}",
        f"limit={LIMIT}",
        "model.gold.wrong_fraction=0.3",
        "progress=false",
        *PRICE,
    ]
    r = run_cli(args, cwd, env=env, timeout=800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parent = re.search(r"MLflow parent run (\w+)", r.stderr).group(1)
    uri = f"sqlite:///{db}"
    cells: dict[tuple[str, str, str], Path] = {}
    for d in (cwd / "outputs" / "cells").iterdir():
        info = json.loads((d / "cell.json").read_text())
        path = Path(info["identity"]["dataset"]["path"]).name
        cells[(path, info["axes"]["topology"], str(info["axes"]["seed"]))] = d
    rep = run_cli(
        ["--sweep", parent, "--tracking-uri", uri, "--compare", "baseline=single", "--plots", str(cwd / "charts")],
        cwd,
        env=env,
        module="apps_bench.report",
    )
    assert rep.returncode == 0, rep.stderr[-3000:]
    (cwd / "report.txt").write_text(rep.stdout)  # for the closing note
    return {
        "cwd": cwd,
        "env": env,
        "uri": uri,
        "parent": parent,
        "cells": cells,
        "out": r.stdout,
        "report": rep.stdout,
        "data": data,
    }


def _blocks(report: str) -> dict[str, str]:
    """file name -> block letter, from the report's header."""
    header = report.split("\n\n", 1)[0].splitlines()
    assert header[0].startswith("blocks "), header
    out = {}
    for line in header[1:]:
        letter, label = line.split(None, 1)
        out[re.search(r"file (\S+) \(local\)", label).group(1)] = letter
    return out


def _section(report: str, title: str, letter: str) -> list[str]:
    """The rows of one block's section of a table (title, header and rule left out)."""
    part = report.split(f"{title} · block {letter}\n", 1)[1].split("\n\n", 1)[0]
    return [x for x in part.splitlines()[2:] if x.split()[0] in (*TOPOLOGIES, "gold")]  # the caption left out


def _money(recs: list[dict]) -> tuple[float, int]:
    """USD of these records at the test's price, every billed token (retried attempts' too), by hand."""
    usd = 0.0
    for r in recs:
        u = r["usage"]
        usd += (u["prompt_tokens"] + u["retried_prompt_tokens"]) * PRICE_IN / 1e6
        usd += (u["completion_tokens"] + u["retried_completion_tokens"]) * PRICE_OUT / 1e6
    return usd, sum(1 for r in recs if r["passed"] and not r["error"])


def test_the_report_fits_120_columns_and_every_table_names_its_block(sweep: dict):
    report = sweep["report"]
    assert len(sweep["cells"]) == len(TOPOLOGIES) * len(SEEDS) * len(FILES)
    wide = [x for x in report.splitlines() if len(x) > 120]
    assert not wide, wide
    blocks = _blocks(report)
    assert sorted(blocks) == sorted(FILES) and sorted(blocks.values()) == ["A", "B"]
    header = report.split("\n\n", 1)[0]
    assert "judge seed (rules" in header and "cap 20 tests" in header and f"limit {LIMIT}" in header
    assert str(sweep["data"]) not in report, "an absolute path in the report"
    assert "21e74dd" not in report, "a local file shown with the hub's revision"
    for title in TITLES:
        for letter in ("A", "B"):
            rows = _section(report, title, letter)
            assert {x.split()[0] if not x.startswith("gold") else x.split()[1] for x in rows} == set(TOPOLOGIES) - (
                {"single"} if title.startswith("paired") else set()
            ), (title, letter, rows)


def test_pass_at_1_per_seed_and_pooled_match_the_records(sweep: dict):
    blocks = _blocks(sweep["report"])
    for f, letter in blocks.items():
        rows = _section(sweep["report"], "pass@1 by topology × model", letter)
        for t in TOPOLOGIES:
            row = next(x for x in rows if x.startswith(t + " "))
            per_seed = []
            pooled = []
            for s in SEEDS:
                ok = [r["passed"] for r in _lines(sweep["cells"][(f, t, s)] / "records.jsonl") if not r["error"]]
                per_seed.append(f"s{s} {sum(ok) / len(ok):.3f}")
                pooled += ok
            assert row.endswith("  ".join(per_seed)), row
            assert row.split()[2] == f"{sum(pooled) / len(pooled):.3f}" and f"(2s × {LIMIT}p)" in row, row
    wrong = [r for d in sweep["cells"].values() for r in _lines(d / "records.jsonl") if not r["passed"]]
    assert wrong, "model.gold.wrong_fraction made no difference: the per-seed figures show nothing"


def test_the_sweep_prints_its_comparison_and_where_to_look_next(sweep: dict):
    out, uri, parent = sweep["out"], sweep["uri"], sweep["parent"]
    end = out.split(f"sweep {parent}: every cell has ended", 1)[1]
    table = end.split("\nfull report", 1)[0]
    assert [x for x in table.splitlines() if len(x) > 120] == []
    for letter in ("A", "B"):
        assert f"pass@1 by topology × model · block {letter}" in table
    assert f"python -m apps_bench.report --sweep {parent} --tracking-uri {uri} --compare baseline=single" in end
    assert f"MLflow UI: mlflow ui --backend-store-uri {uri}" in end
    # ... and each cell: its report and the UI on the store it logged to
    assert out.count(f"MLflow UI: mlflow ui --backend-store-uri {uri}") == len(sweep["cells"]) + 1
    for d in sweep["cells"].values():
        assert f"report: python -m apps_bench.report --cells-dir {d}" in out


def test_cost_in_money_matches_the_records(sweep: dict):
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    runs = {
        r.data.tags["cell_key"]: r
        for r in MlflowClient(sweep["uri"]).search_runs(
            [MlflowClient(sweep["uri"]).get_run(sweep["parent"]).info.experiment_id], "tags.cell_key != ''"
        )
    }
    blocks = _blocks(sweep["report"])
    for f, letter in blocks.items():
        rows = _section(sweep["report"], "cost in money", letter)
        for t in TOPOLOGIES:
            recs, usd_cells = [], []
            for s in SEEDS:
                d = sweep["cells"][(f, t, s)]
                mine = _lines(d / "records.jsonl")
                usd, solved = _money(mine)
                recs += mine
                usd_cells.append(usd)
                cost = json.loads((d / "summary.json").read_text())["cost"]  # the cell's own figures
                assert cost["usd"] == pytest.approx(usd) and cost["usd_per_problem"] == pytest.approx(usd / len(mine))
                assert cost["price"] == {"input_per_mtok": PRICE_IN, "output_per_mtok": PRICE_OUT, "as_of": AS_OF}
                m = runs[json.loads((d / "cell.json").read_text())["key"]].data.metrics
                assert m["cost_usd"] == pytest.approx(usd) and m["cost_usd_per_problem"] == pytest.approx(usd / len(mine))
                if solved:
                    assert m["cost_usd_per_solved"] == pytest.approx(usd / solved)
            total, solved = _money(recs)
            assert 0.0001 <= total / len(recs) < 1, "the figures below are printed with 4 decimals in this range"
            row = next(x for x in rows if x.startswith(t + " ")).split("  ")
            row = [x.strip() for x in row if x.strip()]
            assert row[2] == f"${PRICE_IN:g} / ${PRICE_OUT:g} ({AS_OF})", row
            assert row[3] == f"${sum(usd_cells) / len(SEEDS):.4f}", row
            assert row[4] == f"${total / len(recs):.4f}", row
            assert row[5] == (f"${total / solved:.4f}" if solved else "- (none solved)"), row
    first = next(iter(sweep["cells"].values()))
    cost = json.loads((first / "summary.json").read_text())["cost"]
    assert f"cost: ${cost['usd']:.4f} for the cell" in sweep["out"]


def test_a_price_is_not_part_of_the_cell_and_no_price_is_never_zero(sweep: dict):
    """The same cell without a price is the same cell (resumed: nothing solved again) and its cost says no price."""
    d = sweep["cells"][(FILES[0], "single", "0")]
    args = [
        "topology=single",
        "seed=0",
        "dataset=apps",
        f"dataset.path={sweep['data'] / FILES[0]}",
        f"limit={LIMIT}",
        "model.gold.wrong_fraction=0.3",
        "progress=false",
    ]
    r = run_cli(args, sweep["cwd"], env=sweep["env"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{LIMIT} already recorded, 0 to run" in r.stderr and str(d) in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("cost: "))
    assert "cost: no price for model gold" in line and "$" not in line, line
    summary = json.loads((d / "summary.json").read_text())
    assert summary["cost"]["usd"] is None and summary["cost"]["price"] is None
    rep = run_cli(["--cells-dir", str(d)], sweep["cwd"], env=sweep["env"], module="apps_bench.report")
    assert rep.returncode == 0, rep.stderr[-3000:]
    [row] = _section(rep.stdout, "cost in money", "A")
    assert row.split()[:4] == ["single", "gold", "no", "price"] and "$" not in row, row
    # back to priced, for the other tests of the module
    r = run_cli([*args, *PRICE], sweep["cwd"], env=sweep["env"])
    assert r.returncode == 0 and f"{LIMIT} already recorded, 0 to run" in r.stderr


def test_a_baseline_missing_from_the_cells_is_refused_before_anything_is_printed(sweep: dict):
    r = run_cli(
        ["--sweep", sweep["parent"], "--tracking-uri", sweep["uri"], "--compare", "baseline=centralized_langgraph"],
        sweep["cwd"],
        env=sweep["env"],
        module="apps_bench.report",
    )
    assert r.returncode == 2 and r.stdout == "", r.stdout[-2000:]
    assert "baseline=centralized_langgraph: no such topology among the cells" in r.stderr, r.stderr


def test_the_charts_name_their_blocks(sweep: dict):
    from apps_bench.report import cells, groups, plots

    found = cells.select(cells.from_mlflow(sweep=sweep["parent"], uri=sweep["uri"], with_roles=False))
    gs = groups.group_cells(found)
    fig = plots.pass_figure(gs)
    try:
        ax = fig.axes[0]
        assert ax.get_title().endswith("· blocks A, B")
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert sorted(ticks) == sorted(f"{t} [{b}]" for t in TOPOLOGIES for b in "AB"), ticks
        note = "\n".join(t.get_text() for t in fig.texts)
        for f in FILES:
            assert f"file {f} (local)" in note, note
    finally:
        plots.close(fig)
    for name in ("pass_at_1.png", "pareto.png", "forest.png"):
        assert (sweep["cwd"] / "charts" / name).stat().st_size > 5000


def test_another_metric_has_a_row_per_data_file_never_a_mean_across_them(sweep: dict):
    import statistics

    r = run_cli(
        ["--sweep", sweep["parent"], "--tracking-uri", sweep["uri"], "--metric", "latency_mean_s"],
        sweep["cwd"],
        env=sweep["env"],
        module="apps_bench.report",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["topology", "dataset.path", "gold"], r.stdout
    rows = [x.split() for x in lines[3:] if x.split() and x.split()[0] in TOPOLOGIES]
    assert len(rows) == len(TOPOLOGIES) * len(FILES), r.stdout
    for f in FILES:
        for t in TOPOLOGIES:
            means = [
                statistics.fmean(x["latency_s"] for x in _lines(sweep["cells"][(f, t, s)] / "records.jsonl") if not x["error"])
                for s in SEEDS
            ]
            [row] = [x for x in rows if x[:2] == [t, f]]
            assert row[2:] == [f"{statistics.fmean(means):.3f}", "±", f"{statistics.stdev(means):.3f}", f"({len(SEEDS)})"], row
