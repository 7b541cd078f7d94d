"""A rerun of a finished cell writes nothing to MLflow, and the last problems of a nearly finished
cell start no more workers than they need: the real CLI, the gold server, a real SQLite store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conftest import cli_env, fresh_store, run_cli


def _args(rows: Path, *extra: str) -> list[str]:
    return [
        "model=gold",
        "dataset=apps",
        f"dataset.path={rows}",
        "dataset.split=train",
        "topology=single",
        "limit=3",
        "progress=false",
        *extra,
    ]


def _store(cwd: Path) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """(every row of the SQLite store, as SQL; every artifact file: its size and modification time)."""
    with sqlite3.connect(cwd / "outputs" / "mlflow.db") as db:
        rows = list(db.iterdump())
    artifacts = {
        str(p.relative_to(cwd)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted((cwd / "mlruns").rglob("*"))
        if p.is_file()
    }
    return rows, artifacts


def test_a_rerun_of_a_finished_cell_writes_nothing_to_mlflow(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    args = _args(apps_data_dir / "train_mini150.jsonl")
    first = run_cli(args, tmp_path, env=cli_env(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    rows, artifacts = _store(tmp_path)
    assert any("records.jsonl" in p for p in artifacts) and any("problems.json" in p for p in artifacts)

    again = run_cli(args, tmp_path, env=cli_env(tmp_path))
    assert again.returncode == 0 and "3 already recorded, 0 to run" in again.stderr, again.stderr[-3000:]
    rows_after, artifacts_after = _store(tmp_path)
    assert artifacts_after == artifacts, "artifacts were uploaded again"
    assert sorted(set(rows_after) - set(rows)) == [] and sorted(set(rows) - set(rows_after)) == []


def test_the_last_problem_of_a_cell_starts_no_more_workers_than_it_needs(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
):
    """One problem left: solved in the cell's own process, on one sandbox worker, not on a pool sized
    for the whole cell (judge.workers=4 here; summary.json's `run.solvers` and `provenance.sandbox.workers`)."""
    import json

    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    args = _args(apps_data_dir / "train_mini150.jsonl", "judge.workers=4", "processes=2")
    first = run_cli(args, tmp_path, env=cli_env(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    [cell] = list((tmp_path / "outputs" / "cells").iterdir())
    summary = json.loads((cell / "summary.json").read_text())
    assert (summary["run"]["solvers"], summary["provenance"]["sandbox"]["workers"]) == (2, 3)  # 3 problems: 3 of the 4
    kept = (cell / "records.jsonl").read_text().splitlines()[:2]
    (cell / "records.jsonl").write_text("\n".join(kept) + "\n")  # as if the cell had been stopped before its last problem

    again = run_cli(args, tmp_path, env=cli_env(tmp_path))
    assert again.returncode == 0 and "2 already recorded, 1 to run" in again.stderr, again.stderr[-3000:]
    summary = json.loads((cell / "summary.json").read_text())
    assert (summary["run"]["solvers"], summary["provenance"]["sandbox"]["workers"]) == (1, 1)
    lines = (cell / "records.jsonl").read_text().splitlines()
    assert lines[:2] == kept and len(lines) == 3  # nothing solved twice
