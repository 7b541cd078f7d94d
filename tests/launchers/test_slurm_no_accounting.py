"""hydra/launcher=slurm on a cluster without accounting (no sacct): a cancelled job still ends
the sweep with a message, and SIGTERM or Ctrl-C on the launching command cancels the sweep's jobs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env

from launchers.cluster_env import (
    APPS_TRAIN_MINI,
    NamespaceUnavailable,
    Netns,
    SlurmCluster,
    cell_records,
    skip_without_slurm,
    start_slurm,
)

pytestmark = pytest.mark.slow

# two slow cells (latency is a run-only setting): a job can be caught mid-cell
CELLS = [
    "seed=0,1",
    "topology=single",
    "model=gold",
    "dataset=apps",
    f"dataset.path={APPS_TRAIN_MINI}",
    "limit=5",
    "progress=false",
    "model.gold.latency_ms=700",
    "concurrency=1",
]


@pytest.fixture
def plain_cluster(tmp_path_factory: pytest.TempPathFactory):
    skip_without_slurm(("munged", "slurmctld", "slurmd"))  # no accounting: no slurmdbd, no MariaDB
    try:
        ns = Netns.create(f"apps-test-{os.getpid()}-na", tmp_path_factory.mktemp("netns_na"))
    except NamespaceUnavailable as exc:
        pytest.skip(f"cluster tests need a private network namespace, which cannot be made here: {exc}")
    try:
        cluster = start_slurm(ns, tmp_path_factory.mktemp("slurm_na"), ACCOUNTING="0")
        yield cluster
        cluster.stop()
    finally:
        ns.destroy()


def test_without_accounting_cancel_ends_the_sweep_and_sigterm_or_ctrl_c_cancel_its_jobs(
    plain_cluster: SlurmCluster, tmp_path: Path
) -> None:
    assert plain_cluster.run(["sacct", "--noheader"]).returncode != 0  # really no accounting
    env = cli_env(tmp_path, **plain_cluster.env)
    cmd = [sys.executable, "-m", "apps_bench", "-m", "hydra/launcher=slurm", *CELLS]

    sweep = _start(plain_cluster, cmd, tmp_path, env)
    job = _running_job_with_records(plain_cluster, tmp_path, sweep)
    assert plain_cluster.run(["scancel", job]).returncode == 0
    _, err = sweep.communicate(timeout=120)  # ends; submitit alone would wait forever
    assert sweep.returncode == 1, err[-3000:]
    assert f"job {job} [" in err and "did not finish" in err and "rerun the same command" in err, err[-3000:]
    assert "sacct" not in err.replace("no accounting", "")  # no submitit warning at every poll

    # the rerun, stopped by SIGTERM (a scheduler, `kill`) and then by SIGINT (Ctrl-C) while its jobs
    # run: nothing of it stays queued
    for sig in (signal.SIGTERM, signal.SIGINT):
        for f in tmp_path.glob("outputs/cells/*/records.jsonl"):
            f.unlink()  # both cells have work again
        sweep = _start(plain_cluster, cmd, tmp_path, env)
        _running_job_with_records(plain_cluster, tmp_path, sweep)
        sweep.send_signal(sig)
        _, err = sweep.communicate(timeout=60)
        assert sweep.returncode != 0, sig
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _queued(plain_cluster):
            time.sleep(0.5)
        assert not _queued(plain_cluster), f"{sig!r}: {err[-2000:]}"


def _start(cluster: SlurmCluster, cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        cluster.ns.argv(cmd),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _queued(cluster: SlurmCluster) -> list[str]:
    out = cluster.run(["squeue", "--noheader", "--array", "--format=%i %T"])
    return out.stdout.split("\n") if out.stdout.strip() else []


def _running_job_with_records(cluster: SlurmCluster, cwd: Path, sweep: subprocess.Popen) -> str:
    """A job whose cell has recorded a problem but not all of them."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and sweep.poll() is None:
        for log in cwd.glob("outputs/multirun/*/*/.submitit/*/*_0_log.err"):
            m = re.search(r"apps-bench: cell \S+ \[(\w+)\]", log.read_text())
            lines = next((v for k, v in cell_records(cwd).items() if m and k.endswith(m.group(1))), [])
            if 1 <= len(lines) <= 3 and log.stat().st_mtime > time.time() - 60:
                return log.name.removesuffix("_0_log.err")
        time.sleep(0.2)
    sweep.kill()
    pytest.fail(f"no job caught mid-cell; sweep rc {sweep.poll()}: {sweep.stderr.read()[-2000:] if sweep.stderr else ''}")
