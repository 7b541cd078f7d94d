"""hydra/launcher=slurm on a real single-node SLURM cluster (launchers/slurm_local.sh), every
cell logging over HTTP to a real MLflow server, both inside a namespace this session made."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env

from launchers.cluster_env import (
    GOLD_CELLS,
    N_PROBLEMS,
    REPO,
    MlflowServer,
    SlurmCluster,
    assert_sweep_logged,
    cell_records,
    sweep_runs,
)

pytestmark = pytest.mark.slow


# two cells of the one-call topology, for a test that slows the model down to catch a job mid-cell
SINGLE_CELLS = ["topology=single", *(c for c in GOLD_CELLS if not c.startswith("topology="))]


def sweep_cmd(experiment: str, *extra: str, cells: list[str] = GOLD_CELLS) -> list[str]:
    return [
        sys.executable,
        "-m",
        "apps_bench",
        "-m",
        "hydra/launcher=slurm",
        *cells,
        f"tracking.experiment={experiment}",
        *extra,
    ]


def sweep_env(cwd: Path, cluster: SlurmCluster, server: MlflowServer) -> dict[str, str]:
    return cli_env(cwd, MLFLOW_TRACKING_URI=server.uri, **cluster.env)


def job_logs(cwd: Path) -> dict[str, str]:
    """SLURM job id -> its stderr (submitit's folder of the sweep)."""
    return {p.name.removesuffix("_0_log.err"): p.read_text() for p in cwd.glob("outputs/multirun/*/*/.submitit/*/*_0_log.err")}


def accounted_jobs(cluster: SlurmCluster) -> dict[str, str]:
    out = cluster.run(["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State,JobName"])
    assert out.returncode == 0, out.stderr
    return {r.split("|")[0]: r.split("|")[1] for r in out.stdout.splitlines() if "_" in r.split("|")[0]}


def test_slurm_sweep_runs_every_cell_as_a_job_and_logs_to_the_server(
    slurm_cluster: SlurmCluster, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    before = set(accounted_jobs(slurm_cluster))
    out = slurm_cluster.ns.run(
        sweep_cmd("slurm"), cwd=tmp_path, env=sweep_env(tmp_path, slurm_cluster, mlflow_server), timeout=280
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "sacct" not in out.stderr  # no submitit warning at every poll
    jobs = _settled({j: s for j, s in accounted_jobs(slurm_cluster).items() if j not in before}, slurm_cluster, before)
    assert len(jobs) == 4 and set(jobs.values()) == {"COMPLETED"}, jobs
    logs = job_logs(tmp_path)
    assert set(logs) == set(jobs)
    # each job ran one cell, with the 1 CPU of its allocation
    cells = cell_records(tmp_path)
    assert len(cells) == 4 and all(len(lines) == N_PROBLEMS for lines in cells.values())
    for log in logs.values():
        key = re.search(r"apps-bench: cell \S+ \[(\w+)\]", log).group(1)
        assert sum(name.endswith(key) for name in cells) == 1
    assert_sweep_logged(mlflow_server, "slurm", n_cells=4, n_problems=N_PROBLEMS)


def test_slurm_cancelled_job_ends_the_sweep_and_the_rerun_resumes_it(
    slurm_cluster: SlurmCluster, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    env = sweep_env(tmp_path, slurm_cluster, mlflow_server)
    # slower model replies (a run-only setting: the same cells) so a job can be caught mid-cell
    first = subprocess.Popen(
        slurm_cluster.ns.argv(sweep_cmd("slurm_resume", "model.gold.latency_ms=700", "concurrency=1", cells=SINGLE_CELLS)),
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    victim, cut = _cancel_one_mid_cell(slurm_cluster, tmp_path, first)
    _, err = first.communicate(timeout=240)
    # the sweep ends (no hang), names the cancelled job and how to go on
    assert first.returncode == 1, err[-3000:]
    assert f"job {victim} [" in err and "CANCELLED" in err and "rerun the same command" in err, err[-3000:]
    done_before = {name: lines for name, lines in cell_records(tmp_path).items() if len(lines) == N_PROBLEMS}
    assert len(done_before) == 1
    victim_cell = next(name for name in cell_records(tmp_path) if name not in done_before)
    partial = cell_records(tmp_path)[victim_cell]
    assert cut <= len(partial) < N_PROBLEMS

    again = slurm_cluster.ns.run(sweep_cmd("slurm_resume", cells=SINGLE_CELLS), cwd=tmp_path, env=env, timeout=280)
    assert again.returncode == 0, again.stderr[-4000:]
    after = cell_records(tmp_path)
    for name, lines in done_before.items():
        assert after[name] == lines  # not recomputed
    assert after[victim_cell][: len(partial)] == partial and len(after[victim_cell]) == N_PROBLEMS
    ids = [json.loads(line)["id"] for line in after[victim_cell]]
    assert len(set(ids)) == N_PROBLEMS  # nothing recorded twice
    rerun_logs = [log for job, log in job_logs(tmp_path).items() if job.split("_")[0] != victim.split("_")[0]]
    said = sorted(re.search(r"(\d+) already recorded, (\d+) to run", log).groups() for log in rerun_logs)
    assert said == sorted([("5", "0"), (str(len(partial)), str(N_PROBLEMS - len(partial)))]), said
    # each cell kept one run (the resumed cell continued its own), all finished and complete, nested under the
    # first launch's parent (left FAILED, as it ended); the rerun's own parent links it and covers both cells
    parents, cells = sweep_runs(mlflow_server, "slurm_resume")
    assert len(cells) == 2 and {r.info.status for r in cells} == {"FINISHED"}
    assert all(r.data.metrics["pass_at_1"] == 1.0 for r in cells)
    assert len(parents) == 2, [(p.info.run_id, p.info.status) for p in parents]
    [rerun] = [p for p in parents if "sweep_earlier_run" in p.data.tags]
    [ended] = [p for p in parents if p is not rerun]
    assert rerun.info.status == "FINISHED" and rerun.data.tags["sweep_earlier_run"] == ended.info.run_id
    assert ended.info.status == "FAILED" and rerun.data.tags["comparison_cells"] == "2", rerun.data.tags
    assert {r.data.tags.get("mlflow.parentRunId") for r in cells} == {ended.info.run_id}


def _settled(jobs: dict[str, str], cluster: SlurmCluster, before: set[str]) -> dict[str, str]:
    """Accounting once every job has finished exiting (its result is written before it has)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and {"RUNNING", "COMPLETING"} & set(jobs.values()):
        time.sleep(0.5)
        jobs = {j: s for j, s in accounted_jobs(cluster).items() if j not in before}
    return jobs


def _cancel_one_mid_cell(cluster: SlurmCluster, cwd: Path, sweep: subprocess.Popen) -> tuple[str, int]:
    """scancel the job of the first cell seen with some but not all of its records -> (job, records then)."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and sweep.poll() is None:
        for job, log in job_logs(cwd).items():
            m = re.search(r"apps-bench: cell \S+ \[(\w+)\]", log)
            if not m:
                continue
            lines = next((lines for name, lines in cell_records(cwd).items() if name.endswith(m.group(1))), [])
            if 1 <= len(lines) <= N_PROBLEMS - 2:
                assert cluster.run(["scancel", job]).returncode == 0
                return job, len(lines)
        time.sleep(0.2)
    sweep.kill()
    pytest.fail(f"no cell was caught mid-way; sweep rc {sweep.poll()}")


def test_serve_vllm_sbatch_is_valid_for_sbatch(slurm_cluster: SlurmCluster) -> None:
    script = REPO / "launchers" / "serve_vllm.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # its #SBATCH options parse and the job could be placed (no GPU here: ask for none)
    out = slurm_cluster.run(["sbatch", "--test-only", "--gres=none", "--mem=1G", "--cpus-per-task=1", str(script)])
    assert out.returncode == 0 and "to start at" in out.stderr, out.stderr


def test_slurm_jobs_that_cannot_be_scheduled_end_the_sweep_with_the_fix(
    slurm_cluster: SlurmCluster, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    """More CPUs than the partition's node: SLURM queues the array (reason PartitionConfig) and
    would keep it pending forever; the sweep says so, cancels it and exits."""
    cmd = sweep_cmd("slurm_unschedulable", "hydra.launcher.cpus_per_task=64")
    out = slurm_cluster.ns.run(cmd, cwd=tmp_path, env=sweep_env(tmp_path, slurm_cluster, mlflow_server), timeout=120)
    assert out.returncode == 1, out.stderr[-3000:]
    err = out.stderr
    assert "cannot be scheduled as requested" in err and "(PartitionConfig)" in err, err[-3000:]
    assert "hydra.launcher.partition / cpus_per_task / mem_gb" in err and "Traceback" not in err
    assert "jobs were cancelled" in err and not _queued_jobs(slurm_cluster)


def _queued_jobs(cluster: SlurmCluster) -> list[str]:
    return cluster.run(["squeue", "--noheader", "--format=%i"]).stdout.split()
