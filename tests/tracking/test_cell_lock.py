"""One writer per cell, through the real CLI: a second run of a running cell refuses at once,
naming its holder; a holder killed with `kill -9`, or a stale lock left on another host, is
taken over; a live lock from another host is not. Real gold server, real APPS rows, real
SQLite MLflow store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

pytestmark = pytest.mark.slow

N = 4


def _args(apps_data_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "dataset.split=train",
        f"limit={N}",
        "concurrency=1",
        "processes=1",
        "progress=false",
        f"out_dir={out}",
        *extra,
    ]


def _records(cell: Path) -> list[dict]:
    path = cell / "records.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _start(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_first_record(proc: subprocess.Popen, cell: Path) -> None:
    """Until the running cell has recorded its first problem (it holds its lock from before its start)."""
    deadline = time.monotonic() + 240
    while not _records(cell):
        if proc.poll() is not None:
            pytest.fail("the first run ended before its first record:\n" + proc.stdout.read().decode()[-3000:])
        assert time.monotonic() < deadline, "no record appeared"
        time.sleep(0.1)


def test_a_second_run_of_a_running_cell_refuses_and_solves_nothing(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env, cell = cli_env(tmp_path), tmp_path / "cell"
    first = _start(_args(apps_data_dir, cell, "model.gold.latency_ms=300"), tmp_path, env)
    try:
        _wait_first_record(first, cell)
        os.killpg(first.pid, signal.SIGSTOP)  # the holder stays mid-cell, alive, for as long as the second run takes
        try:
            second = run_cli(_args(apps_data_dir, cell), tmp_path, env=env)
            recorded_meanwhile = len(_records(cell))
            held = (cell / "cell.lock").read_text() if (cell / "cell.lock").exists() else "{}"
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        out = first.communicate(timeout=300)[0].decode()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"pid {first.pid} on host" in second.stderr and "nothing was run" in second.stderr
    assert "to run" not in second.stderr and "Traceback" not in second.stderr  # it never resumed nor solved
    assert recorded_meanwhile < N and json.loads(held).get("pid") == first.pid
    assert first.returncode == 0, out[-3000:]
    keys = [r["key"] for r in _records(cell)]
    assert len(keys) == N and len(set(keys)) == N  # exactly one line per problem
    assert not (cell / "cell.lock").exists()  # given back at the end


def test_a_holder_killed_with_sigkill_is_taken_over(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env, cell = cli_env(tmp_path), tmp_path / "cell"
    first = _start(_args(apps_data_dir, cell, "model.gold.latency_ms=300"), tmp_path, env)
    try:
        _wait_first_record(first, cell)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # the whole cell, its lock left behind
        first.wait(timeout=30)
        first.stdout.close()
    before = {r["key"]: r["completed_at"] for r in _records(cell)}
    assert 1 <= len(before) < N

    r = run_cli(_args(apps_data_dir, cell), tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"took over the lock of {cell} from pid {first.pid}" in r.stderr and "is gone" in r.stderr
    assert f"{len(before)} already recorded, {N - len(before)} to run" in r.stderr
    recs = _records(cell)
    assert sorted(r["key"] for r in recs) == sorted({r["key"] for r in recs}) and len(recs) == N  # no duplicate
    assert all(next(x for x in recs if x["key"] == k)["completed_at"] == t for k, t in before.items())  # kept, not redone
    assert not (cell / "cell.lock").exists()


def test_a_lock_from_another_host_is_taken_over_only_when_stale(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env, cell = cli_env(tmp_path), tmp_path / "cell"
    cell.mkdir()

    def lock(age_s: float) -> None:
        now = time.time()
        (cell / "cell.lock").write_text(
            json.dumps(
                {
                    "host": "node-17.cluster.invalid",
                    "pid": 4242,
                    "token": "t",
                    "started_at": now - 7200,
                    "heartbeat_at": now - age_s,
                }
            )
        )

    lock(age_s=5)  # beating: its holder runs on a node this host cannot see (stale after 120 s: conf/tracking/)
    live = run_cli(_args(apps_data_dir, cell), tmp_path, env=env)
    assert live.returncode == 2, live.stdout[-2000:] + live.stderr[-2000:]
    assert "pid 4242 on host node-17.cluster.invalid" in live.stderr and "120 s" in live.stderr
    assert {p.name for p in cell.iterdir()} == {"cell.lock"}  # nothing written
    assert json.loads((cell / "cell.lock").read_text())["pid"] == 4242

    lock(age_s=900)  # its heartbeat stopped 15 minutes ago: the holder is gone
    stale = run_cli(_args(apps_data_dir, cell), tmp_path, env=env)
    assert stale.returncode == 0, stale.stdout[-3000:] + stale.stderr[-3000:]
    assert "took over the lock" in stale.stderr and "pid 4242 on node-17.cluster.invalid" in stale.stderr
    assert re.search(r"heartbeat is 9\d\d s old, stale after 120 s", stale.stderr), stale.stderr[-2000:]
    keys = [r["key"] for r in _records(cell)]
    assert len(keys) == N == len(set(keys)) and not (cell / "cell.lock").exists()
