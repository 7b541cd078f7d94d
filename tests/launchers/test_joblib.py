"""hydra/launcher=local_parallel (joblib): cells in parallel on this machine, logging over HTTP
to a real MLflow server (launchers/mlflow_server.sh) in a namespace this session made."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import cli_env

from launchers.cluster_env import GOLD_CELLS, N_PROBLEMS, MlflowServer, Netns, assert_sweep_logged, cell_records, sweep_runs

pytestmark = pytest.mark.slow


def test_joblib_sweep_runs_cells_in_parallel_and_logs_to_the_server(
    netns: Netns, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    cmd = [sys.executable, "-m", "apps_bench", "-m", "hydra/launcher=local_parallel", *GOLD_CELLS, "tracking.experiment=joblib"]
    out = netns.run(cmd, cwd=tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.uri), timeout=280)
    assert out.returncode == 0, out.stderr[-4000:]
    cells = cell_records(tmp_path)
    assert len(cells) == 4 and all(len(lines) == N_PROBLEMS for lines in cells.values())
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # nothing went to a local store
    assert_sweep_logged(mlflow_server, "joblib", n_cells=4, n_problems=N_PROBLEMS)
    # in parallel: some two cell runs were open at the same time
    _, runs = sweep_runs(mlflow_server, "joblib")
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    assert any(b_start < a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans
