"""A sweep's parent run belongs to one launch of the sweep (apps_bench/tracking/callbacks.py,
sweep_lock.py, launchers/needs.py): a launch that fails before any cell runs changes no earlier
run, a launcher that cannot run here is refused with the fix, a failed sweep's parent names its
failed cells, a sweep whose cells cannot read their data is refused up front, and a second launch
of a running sweep or cell is refused (exit 2) without touching the first launch's runs.
Real Hydra multiruns through the CLI, real SQLite stores and a real `mlflow server` on 127.0.0.1;
the second launch happens at an event of the first (its job waiting on a file), never after a delay."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, plain_mlflow_server, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, experiment: str = "apps") -> list:
    c = _client(uri)
    exp = c.get_experiment_by_name(experiment)
    return list(c.search_runs([exp.experiment_id])) if exp else []


def _parents(uri: str, experiment: str = "apps") -> list:
    return [r for r in _runs(uri, experiment) if r.data.tags.get("sweep") == "true"]


def _state(run) -> tuple:
    """Everything a later launch must not change about a run."""
    return run.info.status, run.info.end_time, dict(run.data.tags)


def _parent_id(stderr: str) -> str:
    m = re.search(r"MLflow parent run ([0-9a-f]{32})", stderr)
    assert m, stderr[-3000:]
    return m.group(1)


NO_RAY = '''
import sys


class NoRay:
    """As if the `ray` extra were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoRay())
'''


def test_a_launch_that_cannot_start_changes_no_earlier_run_and_says_the_fix(tmp_path: Path, mlflow_template: Path):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    uri = f"sqlite:///{db}"
    first = run_cli(["-m", "seed=0,1", "progress=false"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    [parent] = _parents(uri)
    before, n_runs = _state(parent), len(_runs(uri))
    assert before[0] == "FINISHED"

    # SLURM's tools are not on this host's PATH (none of its folders holds sbatch)
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "sbatch").exists())
    slurm = run_cli(["-m", "hydra/launcher=slurm", "seed=0,1", "progress=false"], tmp_path, env=cli_env(tmp_path, PATH=path))
    assert slurm.returncode == 2 and "Traceback" not in slurm.stderr, slurm.stderr[-3000:]
    assert "hydra/launcher=slurm needs sbatch" in slurm.stderr and "nothing was run" in slurm.stderr

    # the ray extra is missing: an import hook in the command's own interpreter refuses `ray`
    (tmp_path / "noray").mkdir()
    (tmp_path / "noray" / "sitecustomize.py").write_text(NO_RAY)
    env = cli_env(tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path / "noray"), os.environ.get("PYTHONPATH", "")]))
    ray = run_cli(["-m", "hydra/launcher=ray_cluster", "seed=0,1", "progress=false"], tmp_path, env=env)
    assert ray.returncode == 2 and "Traceback" not in ray.stderr, ray.stderr[-3000:]
    assert "hydra/launcher=ray_cluster needs ray" in ray.stderr and "pip install 'apps-bench[ray]'" in ray.stderr

    [after] = _parents(uri)  # no parent run of their own, and the earlier one as it ended
    assert after.info.run_id == parent.info.run_id and _state(after) == before
    assert len(_runs(uri)) == n_runs

    # a launch that does run is this launch's own parent, linked to the earlier one, which it leaves as it was
    again = run_cli(["-m", "seed=0,1", "progress=false"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    new = _parent_id(again.stderr)
    assert new != parent.info.run_id and f"earlier launch's parent run {parent.info.run_id} is left as it ended" in again.stderr
    assert _state(_client(uri).get_run(parent.info.run_id)) == before
    run = _client(uri).get_run(new)
    assert run.info.status == "FINISHED" and run.data.tags["sweep_earlier_run"] == parent.info.run_id
    assert run.data.tags["comparison_cells"] == "2"  # both cells, run by the earlier launch


def test_a_failed_cell_is_named_on_its_sweeps_failed_parent(tmp_path: Path, mlflow_template: Path):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    # two cells in one out_dir: the second finds the first's records there and fails (CellDirConflict)
    r = run_cli(["-m", "seed=0,1", f"out_dir={tmp_path / 'shared'}", "progress=false"], tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Failed to download artifacts" not in r.stderr and "sweep_cells.json" not in r.stderr, r.stderr[-3000:]
    parent = _client(f"sqlite:///{db}").get_run(_parent_id(r.stderr))
    assert parent.info.status == "FAILED"
    missing = parent.data.tags["comparison_missing"]
    assert "single·gold·none·s1 [seed=1" in missing and "s0" not in missing
    assert "1 member cell(s) missing" in r.stderr and "single·gold·none·s1" in r.stderr


def test_a_sweep_whose_cells_cannot_read_their_data_is_refused_up_front(tmp_path: Path):
    # the study's 48 cells read the hub's rows, which this offline machine cannot reach (cli_env: HF_*_OFFLINE)
    r = run_cli(["experiment=study"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "48 of 48 cells of this sweep are refused; nothing was run" in r.stderr
    assert "and 45 more cells: cannot load dataset apps" in r.stderr and "dataset.path=" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2  # the reason once, naming its cells
    assert not (tmp_path / "outputs").exists()


# ----------------------------------------------------------- a second launch, against a real MLflow server


HOLD = '''
import time
from pathlib import Path
from hydra.experimental.callback import Callback


class Hold(Callback):
    """The first launch's job waits, once its sweep has started, until the test releases it."""

    def on_job_start(self, config, **kwargs):
        Path("started").write_text("")
        while not Path("release").exists():
            time.sleep(0.1)
'''

HOLDER = """
import sys
from pathlib import Path
from apps_bench.tracking.cell_lock import CellLock, LockTimes

lock = CellLock(Path(sys.argv[1]), LockTimes(heartbeat_s=10, stale_after_s=120))
lock.acquire()
lock.start_heartbeat()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with plain_mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as s:
        yield s.url


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300  # bounds a hang only
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)


@pytest.mark.parametrize("experiment", ["twice_new", "twice_existing"])
def test_a_second_launch_of_a_running_sweep_is_refused_and_touches_nothing(
    tmp_path: Path, server: str, apps_data_dir: Path, experiment: str
):
    args = [
        "-m",
        "seed=2",
        "allow_any_cell=true",
        "model=gold",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "dataset.split=train",
        "limit=5",
        f"tracking.experiment={experiment}",
        "progress=false",
    ]
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=server)
    if experiment == "twice_existing":  # an earlier, finished launch of the same sweep
        done = run_cli(args, tmp_path, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    earlier = {r.info.run_id: _state(r) for r in _runs(server, experiment)}
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "hold_probe.py").write_text(HOLD)
    held = cli_env(
        tmp_path,
        MLFLOW_TRACKING_URI=server,
        PYTHONPATH=os.pathsep.join([str(tmp_path / "probe"), os.environ.get("PYTHONPATH", "")]),
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args, "+hydra.callbacks.hold._target_=hold_probe.Hold"],
        cwd=tmp_path,
        env=held,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(tmp_path / "started", first)  # the first launch's parent run exists; its cell has not started
        mine = {r.info.run_id for r in _runs(server, experiment)} - set(earlier)
        second = run_cli(args, tmp_path, env=env)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
        assert f"is being launched right now by pid {first.pid}" in second.stderr, second.stderr[-3000:]
        assert "nothing was run" in second.stderr
        now = {r.info.run_id: _state(r) for r in _runs(server, experiment)}
        assert set(now) == set(earlier) | mine and len(mine) == 1  # the first launch's parent, and no run of the second
        assert all(now[k] == v for k, v in earlier.items())
        [parent] = mine
        assert now[parent][0] == "RUNNING"
        (tmp_path / "release").write_text("")
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
    assert first.returncode == 0, err[-3000:]
    assert _client(server).get_run(parent).info.status == "FINISHED"
    cells = [r for r in _runs(server, experiment) if r.data.tags.get("cell_key")]
    assert len(cells) == 1 and cells[0].info.status == "FINISHED"
    [records] = list(tmp_path.glob("outputs/cells/*/records.jsonl"))
    keys = [json.loads(x)["key"] for x in records.read_text().splitlines()]
    assert len(keys) == 5 == len(set(keys))


def test_a_sweep_over_a_cell_another_command_runs_is_refused(tmp_path: Path, server: str):
    args = ["-m", "seed=0", "tracking.experiment=busy_cell", "progress=false"]
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=server)
    done = run_cli(args, tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    before = {r.info.run_id: _state(r) for r in _runs(server, "busy_cell")}
    [folder] = list((tmp_path / "outputs" / "cells").iterdir())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder / "cell.lock")],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        r = run_cli(args, tmp_path, env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert "1 of 1 cells of this sweep are being run by another command" in r.stderr
        assert f"being run right now by pid {holder.pid}" in r.stderr
        assert {x.info.run_id: _state(x) for x in _runs(server, "busy_cell")} == before
    finally:
        holder.communicate(input="", timeout=60)
    assert not (folder / "cell.lock").exists()
