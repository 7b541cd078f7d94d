"""The MLflow helper process (tracking/sidecar.py) and the start-up heap policy.

A single-cell command starts the helper before Hydra composes (so mlflow's import overlaps
the cell's own start-up); these tests pin what that must not change: the cell's run still
nests under a sweep whose parent appears after the helper started, an unused helper dies
with the command, and the collector policy leaves library callers alone.
"""

from __future__ import annotations

import gc
import os
import uuid
from pathlib import Path

import pytest

from apps_bench.tracking import sidecar
from apps_bench.tracking.mlflow import PARENT_RUN_ENV

from conftest import cli_env, fresh_store, run_cli


def _processes_with(marker: str) -> list[int]:
    """PIDs whose environment carries `marker` (this test's own children only)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in env:
            found.append(int(pid))
    return found


def test_prestarted_helper_serves_the_run_and_reads_the_sweep_parent_at_open(
    tmp_path: Path, mlflow_template: Path, monkeypatch: pytest.MonkeyPatch
):
    db = fresh_store(mlflow_template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{db}"
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    sidecar.prestart()
    warm = sidecar._PRESTARTED
    assert warm is not None and warm.poll() is None

    from apps_bench.tracking import mlflow as mlf

    c = mlf.client(uri)
    exp = mlf.experiment_id(c, "helper_test", uri)
    parent = c.create_run(exp, run_name="sweep", tags={"sweep": "true"}).info.run_id
    monkeypatch.setenv(PARENT_RUN_ENV, parent)  # as the sweep callback does, after the helper started

    run = sidecar.open_cell_run(
        experiment="helper_test", cell_key="k1", run_name="cell", params={"seed": 0}, tags={"seed": "0"}, uri=uri
    )
    try:
        assert run._proc is warm  # the prestarted process, not a new one
        assert sidecar._PRESTARTED is None
        run.log_metrics({"progress": 0.5}, step=1)
    finally:
        run.fail("test over")
    got = c.get_run(run.run_id)
    assert got.data.tags["mlflow.parentRunId"] == parent
    assert got.data.params["seed"] == "0" and got.data.metrics["progress"] == 0.5
    assert got.info.status == "FAILED"


def test_a_second_run_in_one_process_gets_its_own_helper(tmp_path: Path, mlflow_template: Path):
    db = fresh_store(mlflow_template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{db}"
    runs = []
    try:
        for key in ("a", "b"):
            runs.append(sidecar.open_cell_run(
                experiment="helper_test", cell_key=key, run_name=key, params={}, tags={}, uri=uri
            ))  # fmt: skip
        assert runs[0]._proc is not runs[1]._proc
        assert runs[0].run_id != runs[1].run_id
    finally:
        for r in runs:
            r.fail("test over")


def test_a_command_that_stops_before_its_run_leaves_no_helper(tmp_path: Path):
    """The endpoint check fails before any MLflow run exists: the helper started at the
    command's start must go with it (the run returns only once every holder of its
    stderr is gone, so a helper that lingered would hang this test)."""
    marker = f"apps-bench-test-{uuid.uuid4().hex}"
    env = cli_env(tmp_path, APPS_BENCH_TEST_MARKER=marker)
    r = run_cli(
        ["model=openai", "model.base_url=http://127.0.0.1:9/v1", "model.model_id=m", "allow_any_cell=true"],
        tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cannot reach the model endpoint" in r.stderr
    assert _processes_with(marker) == []
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # the helper never touched a store


def test_settle_heap_freezes_only_when_the_command_turned_the_collector_off():
    from apps_bench.pipeline import _settle_heap

    assert gc.isenabled()
    before = gc.get_freeze_count()
    _settle_heap()  # a library caller (this test process): untouched
    assert gc.isenabled() and gc.get_freeze_count() == before

    gc.disable()
    try:
        _settle_heap()
        assert gc.isenabled()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
        gc.enable()
