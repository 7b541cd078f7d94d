"""Gold says what it cannot answer: rows without a reference solution, on the shared test rows.

Through the CLI on `test_more.jsonl` rows 17-20 (only row 20 has reference solutions), topology
`single` (its solver is offered python_exec): the start says 3 of 4 rows have no solution and
what that bounds pass@1 to; summary.json and the MLflow run (real SQLite store) carry the same
warning; the "no tool call" warning, which blames the server, does not fire for those rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import fresh_store, run_cli


def test_gold_on_rows_without_solutions_says_so_and_never_blames_the_tools(
    apps_data_dir: Path, tmp_path: Path, mlflow_template: Path
):
    rows = [json.loads(x) for x in (apps_data_dir / "test_more.jsonl").read_text().splitlines()]
    has_solution = [bool(r.get("solutions") and json.loads(r["solutions"])) for r in rows[17:21]]
    assert has_solution == [False, False, False, True]  # the rows this test is about
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(
        [
            "model=gold",
            "dataset=apps",
            f"dataset.path={apps_data_dir / 'test_more.jsonl'}",
            "offset=17",
            "limit=4",
            "topology=single",
            "progress=false",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert (
        "model=gold: 3 of 4 selected problems have no reference solution in their rows; gold gives no program "
        "for them, so they score 0 and this cell's pass@1 is at most 1/4 = 0.2500"
    ) in r.stderr
    assert "no tool call" not in r.stdout + r.stderr

    [summary_path] = tmp_path.glob("outputs/cells/**/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["pass_at_1"] == 0.25
    [warning] = summary["warnings"]
    assert warning.startswith("model=gold gave no program for 3 of 4 problems: their rows have no reference solution")
    assert "at most 1/4 = 0.2500" in warning

    from mlflow.tracking import MlflowClient

    [run] = MlflowClient(f"sqlite:///{db}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{db}").search_experiments()]
    )
    assert run.data.tags["warnings"] == warning and run.data.tags["n_warnings"] == "1"


def test_gold_on_rows_that_all_lack_solutions_scores_zero_and_says_why(apps_data_dir: Path, tmp_path: Path):
    """Rows 0-2 have no solution: gold calls no tool on any problem, which used to read as dropped tools."""
    r = run_cli(
        [
            "model=gold",
            "dataset=apps",
            f"dataset.path={apps_data_dir / 'test_more.jsonl'}",
            "limit=3",
            "topology=single",
            "progress=false",
            "tracking.backend=none",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "3 of 3 selected problems have no reference solution" in r.stderr and "at most 0/3 = 0.0000" in r.stderr
    [summary_path] = tmp_path.glob("outputs/cells/**/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["pass_at_1"] == 0.0
    assert [w[:60] for w in summary["warnings"]] == ["model=gold gave no program for 3 of 3 problems: their rows h"]
    assert "no tool call" not in r.stdout + r.stderr
