"""hydra/launcher=ray_cluster on a real Ray cluster: a head started inside the test's network
namespace (Ray does not keep to 127.0.0.1), the sweep run there as docs/clusters.md documents it
(`export RAY_ADDRESS=... MLFLOW_TRACKING_URI=...`, then the cells), logging to the real MLflow
server over HTTP. Ray is stopped by the PIDs it started in the namespace, never `ray stop`
(which matches Ray processes machine-wide)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from launchers.cluster_env import APPS_TRAIN_MINI, GOLD_CELLS, N_PROBLEMS, MlflowServer, Netns, assert_sweep_logged, sweep_runs

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (.ci/run installs it)")
pytestmark = pytest.mark.slow

NAMES = {f"{t}·gold·none·s{s}" for t in ("single", "sequential_langgraph") for s in (0, 1)}
RAY = str(Path(sys.executable).with_name("ray"))


def _env(**extra: str) -> dict[str, str]:
    """This session's environment without a tracking store or parent run of its own (a cell that
    misses the sweep's would then log to a private SQLite file, which the test looks for)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "APPS_BENCH_PARENT_RUN_ID")}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", **extra}


@dataclass
class RayHead:
    address: str  # what `ray start --head` printed for joining: the RAY_ADDRESS a user exports
    temp_dir: Path
    start_dir: Path  # where `ray start` ran (cells must not write here)

    def worker_logs(self) -> list[Path]:
        return sorted((self.temp_dir / "session_latest" / "logs").glob("worker-*.err"))


def _descendants(root: int) -> set[int]:
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(kids)
        todo.extend(kids)
    return out | {root}


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    except (OSError, IndexError):
        return "zombie"


@pytest.fixture(scope="module")
def ray_head(netns: Netns, mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """`ray start --head` inside the namespace, from a directory of its own."""
    temp_dir = Path(tempfile.mkdtemp(prefix="apps-ray-", dir="/tmp"))  # Ray's unix sockets want a short path
    start_dir = tmp_path_factory.mktemp("ray_start")
    env = _env()
    before = set(netns.pids())
    out = netns.run(
        [
            RAY,
            "start",
            "--head",
            "--port=6390",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            "--object-store-memory=200000000",
        ],
        cwd=start_dir,
        env=env,
        timeout=180,
    )
    ray_pids = set(netns.pids()) - before - _descendants(mlflow_server.proc.pid)
    try:
        assert out.returncode == 0, f"ray start failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        found = re.search(r"ray start --address='([^']+)'", out.stdout + out.stderr)
        assert found, f"ray start printed no address:\n{out.stdout[-3000:]}"
        yield RayHead(found.group(1), temp_dir, start_dir)
    finally:
        # every process Ray started in the namespace (the daemons, and workers started since), by PID
        ray_pids |= set(netns.pids()) - before - _descendants(mlflow_server.proc.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in _alive(ray_pids):
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while _alive(ray_pids) and time.monotonic() < deadline:
                time.sleep(0.2)
        left = _alive(ray_pids)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes still running after SIGKILL: {sorted(left)}"


def _sweep(netns: Netns, head: RayHead, server: MlflowServer, cwd: Path, experiment: str, *extra: str):
    """The documented sweep: RAY_ADDRESS and MLFLOW_TRACKING_URI exported, the cells, nothing else."""
    env = _env(RAY_ADDRESS=head.address, MLFLOW_TRACKING_URI=server.uri)
    cmd = [
        sys.executable,
        "-m",
        "apps_bench",
        "-m",
        "hydra/launcher=ray_cluster",
        *GOLD_CELLS,
        f"tracking.experiment={experiment}",
        *extra,
    ]
    t0 = time.monotonic()
    out = netns.run(cmd, cwd=cwd, env=env, timeout=280)
    return out, time.monotonic() - t0


def test_ray_sweep_runs_every_cell_as_a_ray_task_logging_to_the_server(
    netns: Netns, mlflow_server: MlflowServer, ray_head: RayHead, tmp_path: Path
) -> None:
    before_logs = set(ray_head.worker_logs())
    out, wall = _sweep(netns, ray_head, mlflow_server, tmp_path, "ray_sweep")
    assert out.returncode == 0, f"sweep failed ({wall:.0f}s):\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    assert "apps-bench: ray: 4 cells submitted as Ray tasks (CPU=1 each) to 1 node(s)" in out.stderr

    # every cell ran in a Ray worker of this head, each in its own (max_calls=1): Ray's own worker
    # logs carry the task-name marker and that cell's output
    ran = {}
    for log in set(ray_head.worker_logs()) - before_logs:
        text = log.read_text(errors="replace")
        if ":task_name:apps_bench_cell" in text:
            names = set(re.findall(r"apps-bench: cell (\S+) \[", text))
            assert len(names) == 1, (log.name, names)
            ran[names.pop()] = log.name.rsplit("-", 1)[1].split(".")[0]  # the worker's pid
    assert set(ran) == NAMES, ran
    assert len(set(ran.values())) == 4, ran

    # records complete in the driver's working directory; nothing where `ray start` ran
    cells = sorted((tmp_path / "outputs" / "cells").glob("*/records.jsonl"))
    assert len(cells) == 4, cells
    for rec in cells:
        rows = [json.loads(line) for line in rec.read_text().splitlines()]
        assert len(rows) == N_PROBLEMS and all(r["verdict"]["passed"] for r in rows), rec
        assert json.loads((rec.parent / "summary.json").read_text())["complete"] is True
    assert list((tmp_path / "outputs" / "multirun").glob("*/*/[0-3]/.hydra/overrides.yaml"))
    assert not list(ray_head.start_dir.rglob("*")), sorted(ray_head.start_dir.rglob("*"))[:10]
    assert not list(tmp_path.rglob("mlflow.db")), "a cell logged to a private SQLite store"

    # the server: one parent, one FINISHED child per cell with its metrics, artifacts in the artifact root
    assert_sweep_logged(mlflow_server, "ray_sweep", 4, N_PROBLEMS)
    _, kids = sweep_runs(mlflow_server, "ray_sweep")
    assert {k.info.run_name for k in kids} == NAMES
    for k in kids:
        # the cell sized itself to the CPU its Ray task holds (num_cpus=1), not to the node
        assert k.data.tags["prov.cpus_source"] == "ray" and k.data.tags["prov.usable_cpus"] == "1", k.data.tags


def test_ray_cell_no_node_can_hold_is_refused_with_the_fix(
    netns: Netns, mlflow_server: MlflowServer, ray_head: RayHead, tmp_path: Path
) -> None:
    # Ray keeps an infeasible task pending for ever: a sweep that submitted one would hang, never print this
    out, _ = _sweep(netns, ray_head, mlflow_server, tmp_path, "ray_infeasible", "hydra.launcher.ray.remote.num_cpus=64")
    assert out.returncode == 2, f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    assert "no node of the Ray cluster can run a cell: each cell asks CPU=64" in out.stderr, out.stderr[-3000:]
    node_cpus = re.search(r"\(\S+\) has CPU=(\d+)\. ", out.stderr)
    assert node_cpus and 1 <= int(node_cpus.group(1)) < 64, out.stderr[-3000:]
    assert f"Fix: hydra.launcher.ray.remote.num_cpus={node_cpus.group(1)} (or fewer)" in out.stderr
    assert "Nothing was run." in out.stderr
    assert not (tmp_path / "outputs" / "cells").exists()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _cell_workers(netns: Netns) -> dict[int, str]:
    """pid -> command line of the namespace's processes that run a cell task right now."""
    return {p: c for p in netns.pids() if (c := _cmdline(p)).startswith("ray::apps_bench_cell")}


def _wait_for(what: str, check, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_ray_killed_cell_is_retried_from_its_records_and_ctrl_c_ends_every_cell(
    netns: Netns, mlflow_server: MlflowServer, ray_head: RayHead, tmp_path: Path
) -> None:
    """SIGKILL of a cell's worker: Ray runs the task again and the cell resumes from its records.
    Then Ctrl-C on the sweep: it exits, and no cell task, nor any process a cell started, is left."""
    idle = set(netns.pids())
    env = _env(RAY_ADDRESS=ray_head.address, MLFLOW_TRACKING_URI=mlflow_server.uri)
    cmd = [
        sys.executable,
        "-m",
        "apps_bench",
        "-m",
        "hydra/launcher=ray_cluster",
        "seed=0,1",
        "topology=single,sequential_langgraph",
        "model=gold",
        "dataset=apps",
        f"dataset.path={APPS_TRAIN_MINI}",
        "limit=40",
        "tracking.experiment=ray_interrupt",
    ]
    log = tmp_path / "sweep.log"
    driver = netns.popen(cmd, log, cwd=tmp_path, env=env)
    try:

        def recorded() -> Path | None:
            for rec in (tmp_path / "outputs" / "cells").glob("*/records.jsonl"):
                if len(rec.read_text().splitlines()) >= 3:
                    return rec
            return None

        rec = _wait_for("a cell with 3 recorded problems", recorded)
        key = rec.parent.name.rsplit("-", 1)[1]
        victim = next(
            int(lg.name.rsplit("-", 1)[1].split(".")[0])
            for lg in ray_head.worker_logs()
            if f"[{key}]" in lg.read_text(errors="replace") and Path(f"/proc/{lg.name.rsplit('-', 1)[1].split('.')[0]}").exists()
        )
        assert victim in _cell_workers(netns)
        os.kill(victim, signal.SIGKILL)

        def resumed() -> bool:
            for lg in ray_head.worker_logs():
                found = re.search(rf"\[{key}\] .*: 40 problems, (\d+) already recorded", lg.read_text(errors="replace"))
                if found and int(found.group(1)) >= 3:
                    return True
            return False

        _wait_for("Ray's retry of the killed cell, resuming from its records", resumed)
        busy = _wait_for("cells running again", lambda: _cell_workers(netns))
        started = set(netns.pids()) - idle  # the driver, the cells' workers and every process they started
        os.kill(driver.pid, signal.SIGINT)
        rc = driver.wait(60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert rc != 0, log.read_text()[-3000:]
    assert "apps-bench: interrupted" in log.read_text(), log.read_text()[-3000:]
    deadline = time.monotonic() + 30
    while _alive(started) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {p: _cmdline(p) for p in _alive(started)}
    assert not left, f"left running after Ctrl-C (cells were {busy}): {left}"
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows), "a problem was recorded twice across the retry"
