"""Interrupts and output paths (#43 point 4, the parts of `report` and `plan`): Ctrl-C (SIGINT to the process group)
while the report waits on a real `mlflow server`, held by a proxy until the signal has landed, and `plan --json`
into a folder that does not exist."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, mlflow_server, run_cli
from faults.http_proxy import DyingProxy, Request
from faults.process_group import own_group


def _mlflow_client_call(request: Request) -> bool:
    """The report's first call through MLflow's client (not the store check's one GET)."""
    return request.path.startswith("/api/2.0/mlflow/") and "apps-bench-store-check" not in request.user_agent


@pytest.mark.slow
def test_ctrl_c_during_the_report_is_one_line_and_exit_130(tmp_path: Path):
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as uri, DyingProxy(uri, holds=_mlflow_client_call).running() as proxy:
        with own_group(
            [sys.executable, "-m", "apps_bench.report", "--tracking-uri", proxy.url], tmp_path, cli_env(tmp_path)
        ) as proc:
            assert proxy.held.wait(120), "the report never reached the store"
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground process group
            out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("apps-bench report: interrupted.") and "only reads" in line


def test_plan_json_into_a_missing_folder_is_refused_before_anything(tmp_path: Path):
    r = run_cli(["--json", "nowhere/plan.json"], tmp_path, module="apps_bench.plan", timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "nowhere" in line and "does not exist" in line and "mkdir -p nowhere" in line
    assert r.stdout == "" and list(tmp_path.iterdir()) == []  # no plan printed, nothing written


@pytest.mark.slow
def test_ctrl_c_while_rescore_logs_keeps_its_verdicts_and_the_rerun_judges_nothing_again(tmp_path: Path):
    cell_cwd = tmp_path / "cell"
    cell_cwd.mkdir()
    made = run_cli(["tracking=none", "progress=false"], cell_cwd)
    assert made.returncode == 0, made.stderr[-3000:]
    (cell,) = (cell_cwd / "outputs" / "cells").iterdir()
    (tmp_path / "server").mkdir()
    args = [sys.executable, "-m", "apps_bench.rescore", str(cell), "judge=reference"]
    with mlflow_server(tmp_path / "server") as uri, DyingProxy(uri, holds=_mlflow_client_call).running() as proxy:
        with own_group(args, tmp_path, cli_env(tmp_path, MLFLOW_TRACKING_URI=proxy.url)) as proc:
            assert proxy.held.wait(180), "rescore never reached the store"  # its verdicts are written, its run not yet
            os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-3000:]
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        assert err.rstrip().splitlines()[-1].startswith("apps-bench rescore: interrupted.")  # the last word, once
        assert err.count("interrupted") == 1 and "re-judged so far is kept" in err
        again = subprocess.run(
            args, cwd=tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), capture_output=True, text=True, timeout=300
        )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 recorded, 2 already re-scored, 0 to judge" in again.stderr  # nothing judged twice
