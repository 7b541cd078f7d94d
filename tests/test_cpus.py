"""The CPUs a cell was given (apps_bench/cell/cpus.py), from every source: SLURM's allocation, a Ray
task's `num_cpus`, a joblib sweep's share, the affinity mask; and that a cell sizes its solving
processes and sandbox workers from it and records it (summary and MLflow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

from apps_bench.cell import cpus

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "env,want",
    [
        ({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "3", "SLURM_JOB_CPUS_PER_NODE": "8"}, 3),
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "4"}, 4),
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}, 2),
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "6,2"}, 6),
        ({"SLURM_JOB_ID": "7"}, None),
        ({"SLURM_CPUS_PER_TASK": "3"}, None),  # a leftover variable outside a job says nothing
    ],
)
def test_slurm_allocation(env: dict, want: int | None):
    assert cpus.slurm_cpus(env) == want


def test_a_launchers_share():
    assert cpus.launcher_share({cpus.SHARE_ENV: "3:joblib"}) == (3, "joblib")
    assert cpus.launcher_share({cpus.SHARE_ENV: "0:joblib"}) is None
    assert cpus.launcher_share({}) is None


def _child(code: str, env: dict[str, str], preexec=None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=preexec,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


SHARE = "import json; from apps_bench.cell.cpus import cpu_share; print(json.dumps(cpu_share().to_json()))"


def test_the_least_source_decides_and_says_which():
    host = cpus.affinity_cpus()
    got = _child(SHARE, {"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "1"})
    assert got["cpus"] == 1 and got["source"] == "slurm"  # a tie with a 1-CPU mask goes to the allocation
    assert got["seen"]["affinity"] == host and got["seen"]["slurm"] == 1
    got = _child(SHARE, {"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": str(host + 4)})  # more than the mask
    assert got["cpus"] == host and got["source"] in ("affinity", "cgroup")
    got = _child(SHARE, {cpus.SHARE_ENV: "1:joblib"})
    assert got == {"cpus": 1, "source": "joblib", "seen": {**got["seen"], "joblib": 1.0}}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or cpus.affinity_cpus() < 2, reason="needs 2 CPUs and affinity")
def test_a_pinned_mask_beats_a_larger_slurm_allocation():
    first = min(os.sched_getaffinity(0))
    got = _child(SHARE, {"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "2"}, lambda: os.sched_setaffinity(0, {first}))
    assert got["cpus"] == 1 and got["source"] == "affinity"


class _RayContext:
    """What ray.get_runtime_context() answers in a worker running a task with num_cpus=1.5."""

    class worker:  # noqa: N801 - the attribute Ray's context has
        mode = 1

    def get_assigned_resources(self):
        return {"CPU": 1.5, "memory": 1e9}


def test_a_ray_tasks_num_cpus(monkeypatch: pytest.MonkeyPatch):
    """Ray is not installed with the test extras (the `ray` extra is): a stand-in module with Ray's
    API shape; the real one is exercised by the Ray cluster test. Never imported when absent."""
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert cpus.ray_cpus() is None and "ray" not in sys.modules

    def never_called():
        raise AssertionError("get_runtime_context() starts a local Ray when none is running")

    fake = types.SimpleNamespace(WORKER_MODE=1, get_runtime_context=never_called, is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert cpus.ray_cpus() is None  # imported (e.g. by a test module) but not running: not a Ray worker
    fake.get_runtime_context, fake.is_initialized = _RayContext, lambda: True
    assert cpus.ray_cpus() == 1.5
    share = cpus.cpu_share()
    assert share.seen["ray"] == 1.5 and share.cpus <= 2
    if cpus.affinity_cpus() >= 2 and "cgroup" not in share.seen:
        assert share.cpus == 2 and share.source == "ray"  # ceil(1.5) = 2 ties with the mask: the allocation is named
    fake.WORKER_MODE = 0  # the driver: its resources are not a task's
    assert cpus.ray_cpus() is None
    fake.get_runtime_context = lambda: (_ for _ in ()).throw(RuntimeError("Ray has not been started yet"))
    assert cpus.ray_cpus() is None


def test_a_cell_given_one_cpu_by_slurm_runs_one_solver_and_one_sandbox_worker_and_records_it(
    tmp_path: Path, mlflow_template: Path
):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env = cli_env(tmp_path, SLURM_JOB_ID="42", SLURM_CPUS_PER_TASK="1")
    r = run_cli(["progress=false"], tmp_path, env=env)  # processes=auto, judge.workers=0: from the CPUs
    assert r.returncode == 0, r.stderr[-3000:]
    [cell] = list((tmp_path / "outputs" / "cells").iterdir())
    s = json.loads((cell / "summary.json").read_text())
    assert s["provenance"]["usable_cpus"] == 1 and s["provenance"]["cpus_source"] == "slurm"
    assert s["run"]["solvers"] == 1 and s["provenance"]["sandbox"]["workers"] == 1
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    [run] = c.search_runs([c.get_experiment_by_name("apps").experiment_id])
    assert run.data.tags["prov.cpus_source"] == "slurm" and run.data.tags["prov.usable_cpus"] == "1"
