"""hydra/launcher=slurm on a real cluster whose jobs fill the disk (#43): the sweep stops in the cell's one
line with exit 2, its parent run FAILED with that line, and the rerun (space freed) resumes every cell.

The cluster's daemons live in mount namespaces copied when they start, so a tmpfs mounted later is not what
their jobs see: this test mounts the small disk first and starts its own cluster (no accounting) on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli_env
from faults.test_fault_disk import LIMIT, tmpfs
from faults.test_fault_sweep import _keys, _last_sweep_job_logs

from launchers.cluster_env import APPS_TRAIN_MINI, NamespaceUnavailable, Netns, SlurmCluster, skip_without_slurm, start_slurm

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]


@pytest.fixture
def cluster_on_small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Path]]:
    """A SLURM cluster started after a 400 kB tmpfs was mounted: its jobs write to that disk."""
    skip_without_slurm(("munged", "slurmctld", "slurmd"))
    with tmpfs(tmp_path_factory.mktemp("small") / "disk", "size=400k") as disk:
        try:
            ns = Netns.create(f"apps-test-{os.getpid()}-disk", tmp_path_factory.mktemp("netns_disk"))
        except NamespaceUnavailable as exc:
            pytest.skip(f"cluster tests need a private network namespace, which cannot be made here: {exc}")
        try:
            cluster = start_slurm(ns, tmp_path_factory.mktemp("slurm_disk"), ACCOUNTING="0")
            try:
                yield cluster, disk
            finally:
                cluster.stop()
        finally:
            ns.destroy()


def test_a_disk_that_fills_inside_a_slurm_sweep_stops_it_in_one_line_and_the_rerun_resumes(
    cluster_on_small_disk: tuple[SlurmCluster, Path], tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    cluster, disk = cluster_on_small_disk
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the store on another disk: only the sweep's files fill this one
    cmd = [
        sys.executable,
        "-m",
        "apps_bench",
        "-m",
        "hydra/launcher=slurm",
        "seed=0,1",
        "allow_any_cell=true",
        "dataset=apps",
        f"dataset.path={APPS_TRAIN_MINI}",
        "dataset.split=train",
        f"limit={LIMIT}",
        "progress=false",
    ]
    env = cli_env(disk, MLFLOW_TRACKING_URI=uri, **cluster.env)

    r = cluster.ns.run(cmd, cwd=disk, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-4000:]
    assert "Traceback" not in out and "Error executing job" not in out, out[-4000:]
    own = [line for line in r.stderr.splitlines() if line.strip()]
    said = [line for line in own if "no space left" in line]
    assert len(said) == 1 and said[0] == own[-1], r.stderr[-3000:]
    assert said[0].startswith("apps-bench: ") and "Free space" in said[0] and "The sweep stops here" in said[0]
    cells = sorted((disk / "outputs" / "cells").iterdir())
    kept = {cell.name: _keys(cell) for cell in cells}
    assert all(len(set(keys)) == len(keys) < LIMIT for keys in kept.values()) and any(kept.values()), kept
    c = MlflowClient(tracking_uri=uri)
    (parent,) = [x for x in c.search_runs([c.get_experiment_by_name("apps").experiment_id]) if x.data.tags.get("sweep") == "true"]
    assert parent.info.status == "FAILED" and f"apps-bench: {parent.data.tags['error']}" == said[0]

    subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space freed, for the jobs too
    again = cluster.ns.run(cmd, cwd=disk, env=env, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    cells_said = again.stderr + _last_sweep_job_logs(disk)
    for keys in kept.values():
        assert f"{len(keys)} already recorded, {LIMIT - len(keys)} to run" in cells_said, cells_said[-3000:]
    records = {cell.name: _keys(cell) for cell in sorted((disk / "outputs" / "cells").iterdir())}
    assert len(records) == 2 and all(len(k) == len(set(k)) == LIMIT for k in records.values())
    assert all(set(keys) <= set(records[name]) for name, keys in kept.items())  # nothing computed is lost
