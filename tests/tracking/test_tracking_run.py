"""The cell's tracking run (apps_bench/tracking/run.py) and the `tracking` / `debug` config
groups, through the real entrypoint and a real MLflow SQLite store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pytest
from conftest import fresh_store, run_cli


def _cells(cwd: Path) -> list[Path]:
    root = cwd / "outputs" / "cells"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def test_tracking_none_writes_no_store_and_a_later_mlflow_run_logs_the_cell_without_solving(
    tmp_path: Path, mlflow_template: Path
):
    r = run_cli(["tracking=none", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "outputs" / "mlflow.db").exists()
    assert "MLflow run:" not in r.stdout
    [cell] = _cells(tmp_path)
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["n_recorded"] == 2 and summary["pass_at_1"] == 1.0
    # records are ProblemRecords: every line reads back into one and writes out unchanged
    from apps_bench.types import ProblemRecord

    lines = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    assert [ProblemRecord.from_json(x).to_json() for x in lines] == lines
    with pytest.raises(ValueError, match="fields this version does not know: \\['pased'\\]"):
        ProblemRecord.from_json({**lines[0], "pased": True})

    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["progress=false"], tmp_path)  # the same cell: tracking is not part of it
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 already recorded, 0 to run" in r.stderr
    from apps_bench.tracking import mlflow as mlf

    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    c = mlf.client(uri)
    [run] = c.search_runs([c.get_experiment_by_name("apps").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["pass_at_1"] == 1.0 and run.data.metrics["n_recorded"] == 2
    assert run.data.tags["cell_key"] == summary["cell"]["key"]


def test_an_unreachable_endpoint_stops_the_cell_before_any_store_is_touched(tmp_path: Path):
    r = run_cli(
        ["model=openai", "model.base_url=http://127.0.0.1:9/v1", "model.model_id=m", "allow_any_cell=true"],
        tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cannot reach the model endpoint" in r.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()
    assert not (tmp_path / "outputs" / "hydra").exists() or not any((tmp_path / "outputs" / "hydra").rglob("*.yaml"))


def test_debug_fast_runs_two_problems_in_one_process_and_logs_nothing(tmp_path: Path, apps_data_dir: Path):
    rows = apps_data_dir / "train_mini150.jsonl"
    r = run_cli(["debug=fast", "dataset=apps", f"dataset.path={rows}", "dataset.split=train"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    [cell] = _cells(tmp_path)
    recs = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    assert len(recs) == 2 and {x["solver"] for x in recs} == {"main"}  # limit=2, processes=1
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # tracking=none
    assert "--- extracted code ---" in r.stdout  # verbose
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["run"] == {"concurrency": 2, "problems_in_flight": 2, "processes": "1", "solvers": 1}


class _RecordingRun:
    """A Tracker that keeps what `fail` was told; `store_down` makes `fail` raise as a lost store does."""

    run_id = "r"

    def __init__(self, store_down: bool = False) -> None:
        self.failed: list[str] = []
        self.store_down = store_down

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        pass

    def finish(self, **_: Any) -> None:
        pass

    def fail(self, message: str) -> None:
        if self.store_down:
            raise ConnectionError("store down")
        self.failed.append(message)


def test_fail_run_marks_the_run_with_the_error_and_never_hides_it():
    """The one rule of a cell's (and an optimizer cell's) failed run (tracking.run.fail_run)."""
    from concurrent.futures import Future

    from apps_bench.tracking.mlflow import StoreUnavailable
    from apps_bench.tracking.run import Tracker, fail_run

    run = _RecordingRun()
    fail_run(run, RuntimeError("judge blew up"))
    assert run.failed == ["RuntimeError: judge blew up"]

    opening: Future[Tracker] = Future()  # the cell's run, opened on a thread while the first problems ran
    later = _RecordingRun()
    opening.set_result(later)
    fail_run(opening, ValueError("bad row"))
    assert later.failed == ["ValueError: bad row"]

    for interrupt in (KeyboardInterrupt(), SystemExit(1), StoreUnavailable("gone")):  # the rerun resumes the open run
        fail_run(run, interrupt)
    assert run.failed == ["RuntimeError: judge blew up"]

    fail_run(_RecordingRun(store_down=True), RuntimeError("x"))  # the store failing too: swallowed, not raised
    never_opened: Future[Tracker] = Future()
    never_opened.set_exception(ConnectionError("no store"))
    fail_run(never_opened, RuntimeError("x"))
