"""The sandbox limits live in the judge config (conf/judge/<profile>.yaml `sandbox:`), enter the
cell key, change verdicts where they should, and the sandbox's actual features are recorded.

Through the real entry points: `python -m apps_bench.judge` on real APPS rows, `python -m
apps_bench` on the demo cell (gold server, real sandbox, real SQLite MLflow store)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

from apps_bench.cell.cpus import cgroup_cpu_quota, usable_cpus
from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import SandboxPool
from apps_bench.sandbox.limits import SandboxLimits

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0


def judge_cmd(*args: str, preexec=None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps_bench.judge", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec,
    )


@pytest.fixture
def big_output_row(apps_data_dir: Path, tmp_path: Path) -> Path:
    """Train row 2: one standard-input test whose expected output is 54 bytes; its reference passes."""
    [line] = [x for x in (apps_data_dir / "train_mini150.jsonl").read_text().splitlines() if json.loads(x)["problem_id"] == 2]
    out = json.loads(json.loads(line)["input_output"])["outputs"][0]
    assert len(out) > 40
    path = tmp_path / "rows.jsonl"
    path.write_text(line + "\n")
    return path


# ------------------------------------------------------------------ the judge CLI


def test_a_lower_output_cap_in_the_judge_config_fails_a_passing_program(big_output_row: Path, tmp_path: Path):
    verdicts, summary = tmp_path / "v.jsonl", tmp_path / "s.json"
    r = judge_cmd(
        str(big_output_row), "--gold", "--workers", "1", "--no-progress", "--out", str(verdicts), "--summary", str(summary)
    )
    assert r.returncode == 0, r.stderr
    [v] = [json.loads(x) for x in verdicts.read_text().splitlines()]
    assert v["passed"] is True
    s = json.loads(summary.read_text())
    assert s["judge"]["sandbox"]["output_cap_bytes"] == 8 << 20 and s["pass_at_1"] == 1.0

    r = judge_cmd(
        str(big_output_row),
        "--gold",
        "--workers",
        "1",
        "--no-progress",
        "--out",
        str(verdicts),
        "--summary",
        str(summary),
        "--set",
        "sandbox.output_cap_bytes=16",
    )
    assert r.returncode == 0, r.stderr
    [v] = [json.loads(x) for x in verdicts.read_text().splitlines()]
    assert v["passed"] is False
    assert v["results"][0]["outcome"] == "output_limit" and "16 bytes" in v["results"][0]["detail"]
    s = json.loads(summary.read_text())
    assert s["judge"]["sandbox"]["output_cap_bytes"] == 16 and s["pass_at_1"] == 0.0


def test_the_judge_cli_reports_the_sandbox_features(big_output_row: Path, tmp_path: Path):
    summary = tmp_path / "s.json"
    r = judge_cmd(str(big_output_row), "--gold", "--workers", "1", "--no-progress", "--summary", str(summary))
    assert r.returncode == 0, r.stderr
    feats = json.loads(summary.read_text())["sandbox"]
    assert feats["nice"] == os.nice(0) and feats["workers"] == 1 and "priority_boost" not in feats
    line = next(x for x in r.stdout.splitlines() if x.startswith("sandbox: "))
    assert line.endswith(f"nice={os.nice(0)}; workers: 1")
    if ROOT:
        assert feats["contained"] is True and feats["uid_switch"] is True and feats["pids_cgroup"] is True
        assert line.startswith("sandbox: contained,") and "pid_namespace" in line and "uid_switch" in line


def test_the_judge_cli_composes_the_profile_and_rejects_bad_ones(big_output_row: Path, tmp_path: Path):
    r = judge_cmd(str(big_output_row), "--gold", "--profile", "nope")
    assert r.returncode == 2 and "nope" in r.stderr and "reference, seed" in r.stderr and "Traceback" not in r.stderr
    r = judge_cmd(str(big_output_row), "--gold", "--set", "sandbox.output_cap=3")
    assert r.returncode == 2 and "output_cap" in r.stderr and "SandboxLimits" in r.stderr and "Traceback" not in r.stderr
    r = judge_cmd(str(big_output_row), "--gold", "--set", "sandbox.nproc=0")
    assert r.returncode == 2 and "judge.sandbox.nproc must be > 0" in r.stderr
    # a value given as an interpolation (which a line-by-line read could not see) is honoured
    summary = tmp_path / "s.json"
    r = judge_cmd(
        str(big_output_row),
        "--gold",
        "--no-progress",
        "--summary",
        str(summary),
        "--profile",
        "reference",
        "--set",
        "workers=${oc.decode:'1'}",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(summary.read_text())
    assert s["profile"] == "reference" and s["sandbox"]["workers"] == 1 and s["judge"]["program_timeout_s"] == 11.0


def test_a_missing_limit_is_a_clear_error():
    from omegaconf.errors import MissingMandatoryValue

    from apps_bench.config.schema import JudgeConfig, typed

    limits = judge_config("seed").sandbox.to_dict()
    with pytest.raises(MissingMandatoryValue, match="nofile"):
        typed(SandboxLimits, {k: v for k, v in limits.items() if k != "nofile"})
    judge = dataclasses.asdict(judge_config("seed"))
    del judge["sandbox"]
    with pytest.raises(MissingMandatoryValue, match="sandbox"):
        typed(JudgeConfig, judge)
    with pytest.raises(TypeError, match="SandboxLimits"):
        SandboxPool(1, dict(limits))  # type: ignore[arg-type]


# ------------------------------------------------------------------ usable CPUs


def _in_child(code: str, preexec) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=preexec)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


POOL_PROBE = (
    "from apps_bench.cell.cpus import usable_cpus\n"
    "from apps_bench.judge.profiles import judge_config\n"
    "from apps_bench.sandbox import SandboxPool\n"
    "with SandboxPool.from_config(judge_config('seed')) as p:\n"
    "    print(usable_cpus(), p.workers, p.features['workers'])\n"
)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_workers_zero_follows_the_affinity_mask(big_output_row: Path, tmp_path: Path):
    first = min(os.sched_getaffinity(0))
    pin = lambda: os.sched_setaffinity(0, {first})  # noqa: E731 - as SLURM/Ray/taskset give a job one CPU
    assert _in_child(POOL_PROBE, pin) == "1 1 1"
    # and the judge CLI, whose profile says workers: 0
    summary = tmp_path / "s.json"
    r = judge_cmd(str(big_output_row), "--gold", "--no-progress", "--summary", str(summary), preexec=pin)
    assert r.returncode == 0, r.stderr
    assert json.loads(summary.read_text())["sandbox"]["workers"] == 1
    assert _in_child("from apps_bench.cell.cpus import usable_cpus; print(usable_cpus())", None) == str(usable_cpus())


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


@pytest.mark.skipif(
    not (ROOT and (CPU_CGROUP / "cpu.cfs_quota_us").is_file() and os.access(CPU_CGROUP, os.W_OK)),
    reason="needs root and a writable cgroup-v1 cpu controller",
)
def test_workers_zero_follows_a_cgroup_cpu_quota():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU only: a quota of one CPU changes nothing")
    group = CPU_CGROUP / f"apps-bench-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")  # one CPU's worth
        join = lambda: (group / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731
        assert _in_child(POOL_PROBE, join) == "1 1 1"
        (group / "cpu.cfs_quota_us").write_text("150000")  # 1.5 CPUs: two workers may run
        assert _in_child(POOL_PROBE, join).split()[0] == "2"
    finally:
        group.rmdir()


def test_cgroup_quota_is_read_from_v1_and_v2_files(tmp_path: Path):
    proc = tmp_path / "cgroup"
    v2 = tmp_path / "v2"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu")
    (v2 / "job" / "cpu.max").write_text("200000 100000\n")
    (v2 / "job" / "step" / "cpu.max").write_text("max 100000\n")
    proc.write_text("0::/job/step\n")
    assert cgroup_cpu_quota(proc, v2) == 2.0  # the parent's quota applies to the child
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "slurm").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us").write_text("50000")
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us").write_text("100000")
    proc.write_text("4:memory:/x\n3:cpu,cpuacct:/slurm\n")
    assert cgroup_cpu_quota(proc, v1) == 0.5
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_quota(proc, v1) is None


# ------------------------------------------------------------------ a cell, end to end


@pytest.mark.slow
def test_a_cell_records_its_limits_key_and_sandbox_features(tmp_path: Path, mlflow_template: Path):
    """The demo cell with a 1-byte output cap: both gold answers fail as output_limit, the cell
    is a new one (its key differs from the default cell's), and summary.json and the MLflow run
    record the sandbox's features (tags) and the limits (params)."""
    from mlflow.tracking import MlflowClient

    from apps_bench.cell.key import resolve_cell
    from apps_bench.config.schema import register_configs

    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["judge.sandbox.output_cap_bytes=1", "progress=false"], tmp_path, env=cli_env(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    [cell] = sorted((tmp_path / "outputs" / "cells").iterdir())
    recs = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines()]
    assert sorted(x["id"] for x in recs) == ["demo-call", "demo-stdin"]
    for x in recs:
        assert x["passed"] is False and x["verdict"]["results"][0]["outcome"] == "output_limit", x["verdict"]

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "apps_bench" / "conf")):
        default_key = resolve_cell(compose("config")).key
        capped_key = resolve_cell(compose("config", overrides=["judge.sandbox.output_cap_bytes=1"])).key
    GlobalHydra.instance().clear()
    assert cell.name.endswith(capped_key) and capped_key != default_key

    feats = json.loads((cell / "summary.json").read_text())["provenance"]["sandbox"]
    assert feats["nice"] == os.nice(0) and feats["workers"] >= 1 and "priority_boost" not in feats
    assert json.loads((cell / "cell.json").read_text())["provenance"]["sandbox"] == feats
    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    [run] = c.search_runs([e.experiment_id for e in c.search_experiments()])
    tags, params = run.data.tags, run.data.params
    assert tags["prov.sandbox.nice"] == str(os.nice(0)) and tags["prov.sandbox.contained"] == json.dumps(feats["contained"])
    assert tags["prov.sandbox.uid_switch"] == json.dumps(feats["uid_switch"])
    assert params["judge.sandbox.output_cap_bytes"] == "1" and params["judge.sandbox.nproc"] == "64"
    if ROOT:
        assert feats["contained"] and feats["uid_switch"] and feats["pids_cgroup"]
