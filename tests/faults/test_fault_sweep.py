"""A sweep's cell fails because of its surroundings (#43), through the real CLI: the tracking store lost
while a cell of a multi-cell sweep runs (a real `mlflow server` behind a proxy that dies at a chosen request),
and a small tmpfs that fills while a sweep's first cell writes its records, on the basic launcher (cells in
the launching process), on joblib's (cells in its worker processes, two at once) and on Ray's (a private Ray).

The sweep stops with one line (what failed, that the records are safe, the fix; under joblib at most one per
cell running when it failed) and exit 2, never Hydra's traceback; its parent run is ended FAILED with the line,
or, the store lost, by the rerun's launch once the store answers; the rerun solves only what is not recorded
and logs every cell.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from conftest import cli_env, mlflow_server, run_cli
from faults.http_proxy import DyingProxy, Request
from faults.test_fault_disk import LIMIT, tmpfs

SWEEP = ["-m", "seed=0,1", "model=gold", "dataset=demo", "progress=false"]
LAUNCHERS = {
    "basic": [],
    "joblib": ["hydra/launcher=local_parallel", "hydra.launcher.n_jobs=2"],
    "ray": ["hydra/launcher=ray_cluster"],  # a private Ray on this machine (no RAY_ADDRESS), a cell per CPU
    "slurm_local": ["hydra/launcher=slurm_local"],
}  # submitit's SLURM code path, each cell a local job


def _records(cwd: Path) -> dict[str, list[str]]:
    return {
        c.name: [json.loads(x)["key"] for x in (c / "records.jsonl").read_text().splitlines() if x.strip()]
        for c in sorted((cwd / "outputs" / "cells").iterdir())
    }


def _first_cell_logs() -> Callable[[Request], bool]:
    """Dies at the first request the first cell sends after its run is created (the parent's run is the first
    created): the store goes away while that cell runs."""
    created = [0]

    def dies(request: Request) -> bool:
        if request.path.endswith("/runs/create"):
            created[0] += 1
            return False
        return created[0] == 2 and request.method == "POST"

    return dies


@pytest.mark.slow
def test_a_store_lost_while_a_cell_of_a_sweep_runs_is_one_line_and_the_rerun_logs_it(tmp_path: Path):
    from mlflow import MlflowClient

    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as uri:
        with DyingProxy(uri, _first_cell_logs()).running() as proxy:
            r = run_cli(SWEEP, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=proxy.url), timeout=600)
            assert proxy.dead.is_set()
        out = r.stdout + r.stderr
        assert r.returncode == 2, out[-4000:]
        assert "Traceback" not in out and "Error executing job" not in out, out[-4000:]
        said = [line for line in r.stderr.splitlines() if line.startswith("apps-bench: ") and "does not answer" in line]
        # the first cell's line (its records all safe, only its run waits; or the sweep stops with it), and the
        # sweep stopped once, by a cell, in one line: nothing said again as its parent run ends
        assert 1 <= len(said) <= 2 and said[-1] == r.stderr.strip().splitlines()[-1], r.stderr[-3000:]
        assert "does not answer" in said[-1] and "The sweep stops here" in said[-1], said[-1]
        assert "rerun the same command" in said[-1], said[-1]
        assert sum("The sweep stops here" in line for line in said) == 1
        first = _records(tmp_path)
        assert all(len(keys) == len(set(keys)) for keys in first.values())
        c = MlflowClient(tracking_uri=uri)
        (left,) = [
            x for x in c.search_runs([c.get_experiment_by_name("apps").experiment_id]) if x.data.tags.get("sweep") == "true"
        ]
        assert left.info.status == "RUNNING"  # its launch could not reach the store to end it

        again = run_cli(SWEEP, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), timeout=600)
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        records = _records(tmp_path)
        assert len(records) == 2 and all(sorted(k) == sorted(set(k)) and len(k) == 2 for k in records.values())
        for name, keys in first.items():
            assert set(keys) <= set(records[name])  # nothing computed is lost
        runs = c.search_runs([c.get_experiment_by_name("apps").experiment_id])
        cells = [x for x in runs if x.data.tags.get("cell_key")]
        parents = sorted((x for x in runs if x.data.tags.get("sweep") == "true"), key=lambda x: x.info.start_time)
        assert len(cells) == 2 and all(x.info.status == "FINISHED" for x in cells)
        assert [x.info.status for x in parents] == ["FAILED", "FINISHED"]  # the left one ended by the rerun's launch
        assert parents[0].info.run_id == left.info.run_id and "lost the tracking store" in parents[0].data.tags["error"]
        assert parents[1].info.run_id in parents[0].data.tags["error"]
        assert f"{left.info.run_id}, left RUNNING, is ended FAILED" in again.stderr


def _keys(cell: Path) -> list[str]:
    """The records' keys; a last line torn by the full disk is not a record (the rerun cuts it off), and a cell
    stopped beside the one the disk failed (joblib, Ray) may have made no records file yet."""
    path = cell / "records.jsonl"
    lines = path.read_text().split("\n") if path.exists() else []
    return [json.loads(x)["key"] for x in lines[:-1] if x.strip()]


def _last_sweep_job_logs(cwd: Path) -> str:
    """What the cells of the last sweep said in their submitit jobs' logs (slurm_local; none elsewhere)."""
    sweeps = sorted((cwd / "outputs" / "multirun").glob("*/*"))
    return "".join(p.read_text() for p in sweeps[-1].glob(".submitit/*/*_log.err")) if sweeps else ""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_disk_that_fills_inside_a_sweep_stops_it_in_one_line_and_the_rerun_resumes(
    tmp_path: Path, apps_data_dir: Path, launcher: str
):
    from mlflow import MlflowClient

    rows = apps_data_dir / "train_mini150.jsonl"
    sweep = [
        "-m",
        "seed=0,1",
        "allow_any_cell=true",
        "dataset=apps",
        f"dataset.path={rows}",
        "dataset.split=train",
        f"limit={LIMIT}",
        "progress=false",
        *LAUNCHERS[launcher],
    ]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the store on another disk: only the cells' folders fill this one
    # room for the first cell's files and about half its records; slurm_local: and submitit's job files first
    # (about 90 kB per job, both jobs submitted at once)
    with tmpfs(tmp_path / "disk", "size=400k" if launcher == "slurm_local" else "size=200k") as disk:
        env = cli_env(disk, MLFLOW_TRACKING_URI=uri, RAY_USAGE_STATS_ENABLED="0")
        r = run_cli(sweep, disk, env=env, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 2, out[-4000:]
        assert "Traceback" not in out and "Error executing job" not in out, out[-4000:]
        own = [line for line in r.stderr.splitlines() if "(apps_bench_cell pid=" not in line]  # not ours: Ray's echo
        said = [line for line in own if "no space left" in line]
        assert 1 <= len(said) <= (2 if launcher == "joblib" else 1), r.stderr[-3000:]  # joblib: one per cell running
        assert said[-1] == own[-1].strip(), r.stderr[-3000:]
        assert all(line.startswith("apps-bench: ") and "Free space" in line and "The sweep stops here" in line for line in said)
        cells = sorted((disk / "outputs" / "cells").iterdir())
        assert len(cells) == 1 if launcher == "basic" else len(cells) in (1, 2)  # basic: the next cell did not start
        kept = {cell.name: _keys(cell) for cell in cells}
        assert all(len(set(keys)) == len(keys) < LIMIT for keys in kept.values()) and any(kept.values())
        c = MlflowClient(tracking_uri=uri)
        (parent,) = [
            x for x in c.search_runs([c.get_experiment_by_name("apps").experiment_id]) if x.data.tags.get("sweep") == "true"
        ]
        assert parent.info.status == "FAILED" and f"apps-bench: {parent.data.tags['error']}" in said

        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space freed
        again = run_cli(sweep, disk, env=env, timeout=600)
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        cells_said = again.stderr + _last_sweep_job_logs(disk)
        for keys in kept.values():
            assert f"{len(keys)} already recorded, {LIMIT - len(keys)} to run" in cells_said
        records = {c.name: _keys(c) for c in sorted((disk / "outputs" / "cells").iterdir())}
        assert len(records) == 2 and all(len(k) == len(set(k)) == LIMIT for k in records.values())
        assert all(set(keys) <= set(records[name]) for name, keys in kept.items())  # nothing computed is lost


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_launching_process_finds_the_disk_its_jobs_filled_or_could_not_write(tmp_path: Path):
    """A SLURM job on a full disk may leave neither its result nor its log: the launching process asks the disk
    itself (faults.full_or_read_only), for a folder the cells had not made yet too."""
    from apps_bench.tracking.faults import full_or_read_only

    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        cells = disk / "outputs" / "cells"  # not made yet: the disk holding it is asked
        assert full_or_read_only(cells) is None
        with open(disk / "fill", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"x" * 4096)
        full = full_or_read_only(cells)
        assert full is not None and full.code == 2
        assert full.what.startswith(f"no space left on the disk ({disk})") and "Free space there" in full.fix
        (disk / "fill").unlink()
        assert full_or_read_only(cells) is None
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        ro = full_or_read_only(cells)
        assert ro is not None and ro.what == f"cannot write {disk}: it is on a read-only file system"
