"""A sweep's lifecycle through the real CLI (apps_bench/tracking/callbacks.py): its settings reach
every job through Hydra's own job config, a rerun is a launch with its own parent run, a cell without its
sweep's settings refuses to log elsewhere, and Ctrl-C / SIGTERM end the parent KILLED after the
launchers' cancel hooks ran. Real Hydra multirun (basic and joblib launchers), real SQLite store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import cli_env, fresh_store, plain_mlflow_server, run_cli

from apps_bench.tracking.mlflow import PARENT_RUN_ENV


def _client(db: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def _runs(db: Path) -> list:
    c = _client(db)
    exp = c.get_experiment_by_name("apps")
    return list(c.search_runs([exp.experiment_id])) if exp else []


def _parents(db: Path) -> list:
    return [r for r in _runs(db) if r.data.tags.get("sweep") == "true"]


def _job_env_sets(cwd: Path) -> list[dict]:
    """`hydra.job.env_set` of every job of every sweep, as each job saved its own config."""
    return [
        yaml.safe_load(p.read_text())["hydra"]["job"]["env_set"]
        for p in sorted(cwd.glob("outputs/multirun/**/.hydra/hydra.yaml"))
    ]


def test_every_job_gets_the_sweeps_settings_and_a_rerun_has_its_own_parent(tmp_path: Path, mlflow_template: Path):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["-m", "seed=0,1", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    [parent] = _parents(db)
    pid = parent.info.run_id
    envs = _job_env_sets(tmp_path)
    assert len(envs) == 2 and all(
        e["MLFLOW_TRACKING_URI"] == f"sqlite:///{db}"
        and e[PARENT_RUN_ENV] == pid
        and e["APPS_BENCH_ROOT"] == str(tmp_path.resolve())
        for e in envs
    )

    # the rerun, through another launcher (not part of the sweep): same cells, a parent run of this launch's own
    # that links the earlier one, which stays as it ended
    r2 = run_cli(["-m", "hydra/launcher=local_parallel", "seed=0,1", "progress=false"], tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert f"its earlier launch's parent run {pid} is left as it ended" in r2.stderr
    [parent2] = [p for p in _parents(db) if p.info.run_id != pid]
    assert parent2.info.status == "FINISHED" and parent2.data.tags["sweep_earlier_run"] == pid
    assert parent2.data.tags["comparison_cells"] == "2"
    assert (_client(db).get_run(pid).info.status, _client(db).get_run(pid).info.end_time) == ("FINISHED", parent.info.end_time)
    kids = [x for x in _runs(db) if x.data.tags.get("mlflow.parentRunId") == pid]  # nested where they first ran
    assert sorted(k.data.tags["seed"] for k in kids) == ["0", "1"] and all(k.info.status == "FINISHED" for k in kids)
    envs = _job_env_sets(tmp_path)
    assert len(envs) == 4 and sorted(e[PARENT_RUN_ENV] for e in envs) == sorted(
        [pid, pid, parent2.info.run_id, parent2.info.run_id]
    )
    # joblib ran both cells at once (n_jobs 2): each was given its share of this host's CPUs
    from apps_bench.cell.cpus import usable_cpus

    for cell in (tmp_path / "outputs" / "cells").iterdir():
        prov = json.loads((cell / "summary.json").read_text())["provenance"]
        assert prov["cpus_source"] == "joblib" and prov["usable_cpus"] == max(1, usable_cpus() // 2)
    rep = run_cli(["--sweep", parent2.info.run_id], tmp_path, module="apps_bench.report")
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert "(2s × 2p)" in rep.stdout  # both seeds' cells, whichever launch of the sweep logged them

    # other cells are another sweep: a new parent, linked to none
    r3 = run_cli(["-m", "seed=0,2", "allow_any_cell=true", "progress=false"], tmp_path)
    assert r3.returncode == 0, r3.stderr[-3000:]
    parents = _parents(db)
    assert len(parents) == 3 and sum("sweep_earlier_run" in p.data.tags for p in parents) == 1


def test_a_cell_of_a_sweep_without_its_settings_refuses_to_log_elsewhere(tmp_path: Path):
    r = run_cli(["progress=false"], tmp_path, env=cli_env(tmp_path, **{PARENT_RUN_ENV: "0123abcd"}))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "part of a sweep but did not receive MLFLOW_TRACKING_URI" in r.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists() and not (tmp_path / "outputs" / "cells").exists()

    # a multirun whose jobs get nothing (the sweep's callback removed): every cell refuses
    r = run_cli(["-m", "seed=0,1", "~hydra.callbacks.tracking", "progress=false"], tmp_path)
    assert r.returncode != 0
    assert f"did not receive MLFLOW_TRACKING_URI and {PARENT_RUN_ENV}" in r.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists() and not (tmp_path / "outputs" / "cells").exists()


PROBE = '''
from pathlib import Path
from hydra.experimental.callback import Callback
from apps_bench.tracking.callbacks import active_sweep, on_sweep_interrupt


class Probe(Callback):
    """What a launcher does: register how to cancel what it submitted."""

    def on_multirun_start(self, config, **kwargs):
        uri, run_id = active_sweep()
        on_sweep_interrupt(lambda: Path("cancelled").write_text(run_id))
'''


@pytest.mark.parametrize("sig,launcher", [(signal.SIGTERM, "basic"), (signal.SIGINT, "local_parallel")])
def test_sigterm_and_ctrl_c_cancel_the_sweep_and_end_its_parent_killed(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path, sig: signal.Signals, launcher: str
):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "s62_probe.py").write_text(PROBE)
    env = cli_env(tmp_path, PYTHONPATH=str(tmp_path / "probe"))
    args = [
        "-m",
        f"hydra/launcher={launcher}",
        "seed=0,1",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "dataset.split=train",
        "limit=30",
        "concurrency=1",
        "processes=1",
        "judge.workers=1",
        "model.gold.latency_ms=2000",
        "progress=false",
        "+hydra.callbacks.probe._target_=s62_probe.Probe",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not any(tmp_path.glob("outputs/cells/*/records.jsonl")):  # a cell is solving
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.3)
        os.kill(proc.pid, sig)  # the launching command only, as a shell's Ctrl-C or `kill` would
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert f"{sig.name}: cancelling the sweep" in err
    [parent] = _parents(db)
    assert parent.info.status == "KILLED", err[-3000:]
    assert sig.name in parent.data.tags["error"]
    assert (tmp_path / "cancelled").read_text() == parent.info.run_id  # the launcher's hook ran
    kids = [r for r in _runs(db) if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert kids and all(k.info.status in ("KILLED", "FINISHED") for k in kids)  # the cells it stopped are not RUNNING
    with sqlite3.connect(db) as con:  # nothing of the sweep is left RUNNING by its launching process
        assert con.execute("select status from runs where run_uuid = ?", (parent.info.run_id,)).fetchone()[0] == "KILLED"


# ----------------------------------------------------------- against a real MLflow server (loopback)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    with plain_mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as server:
        yield server.url, server.port


def test_a_server_that_refuses_the_host_name_stops_the_cell_with_the_fix(tmp_path: Path, mlflow_server):
    _, port = mlflow_server
    r = run_cli(["progress=false"], tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=f"http://localhost:{port}"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "refused this client (HTTP 403)" in r.stderr and "MLFLOW_SERVER_ALLOWED_HOSTS" in r.stderr


def test_a_sweep_against_the_server_has_a_parent_per_launch(tmp_path: Path, mlflow_server):
    url, _ = mlflow_server
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=url)
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=url)
    earlier = None
    for attempt in range(2):
        r = run_cli(["-m", "seed=0,1", "tracking.experiment=server_sweep", "progress=false"], tmp_path, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        exp = c.get_experiment_by_name("server_sweep").experiment_id
        parents = c.search_runs([exp], filter_string="tags.sweep = 'true'", order_by=["attributes.start_time DESC"])
        parent = parents[0]
        assert len(parents) == attempt + 1 and all(p.info.status == "FINISHED" for p in parents)
        assert parent.data.tags.get("sweep_earlier_run") == earlier and parent.data.tags["comparison_cells"] == "2"
        kids = c.search_runs([exp], filter_string="tags.cell_key != ''")
        assert len(kids) == 2 and all(k.info.status == "FINISHED" for k in kids)
        earlier = parent.info.run_id
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # nothing went to a local store


def test_a_sweeps_cell_works_in_the_launching_directory_wherever_its_worker_started(tmp_path: Path):
    """As in a Ray worker, which starts in the `ray start` directory: the cell moves to the sweep's."""
    launch, worker = tmp_path / "launch", tmp_path / "worker"
    launch.mkdir()
    worker.mkdir()
    code = (
        "import os; from omegaconf import OmegaConf; from apps_bench.__main__ import _enter_sweep; "
        "_enter_sweep(OmegaConf.create({'tracking': {'backend': 'mlflow'}}), True); print(os.getcwd())"
    )
    env = cli_env(worker, APPS_BENCH_ROOT=str(launch), MLFLOW_TRACKING_URI="sqlite:////x.db", **{PARENT_RUN_ENV: "p"})
    out = subprocess.run([sys.executable, "-c", code], cwd=worker, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(launch)
