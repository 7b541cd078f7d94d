"""Nothing half-made: every refusal exits 2 before anything is written anywhere. An unreachable
model endpoint leaves no cell folder (nor Hydra run folder); re-scoring a cell folder with no
records creates no MLflow run and no re-scoring folder; a report where no cell ever logged
creates no store. Real CLI, real loopback ports, a real SQLite MLflow store."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import cli_env, fresh_store, run_cli

pytestmark = pytest.mark.slow


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "args, env_var", [(["model=qwen"], "VLLM_BASE_URL"), (["model=openai", "allow_any_cell=true"], "OPENAI_BASE_URL")]
)
def test_an_unreachable_endpoint_leaves_no_cell_folder(tmp_path: Path, args: list[str], env_var: str):
    env = cli_env(tmp_path, **{env_var: f"http://127.0.0.1:{_closed_port()}/v1", "MODEL_ID": "some-model"})
    r = run_cli([*args, "progress=false"], tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cannot reach the model endpoint" in r.stderr and env_var in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/: no cell.json, config.yaml, prompts.json


def _half_made_cell(folder: Path, cwd: Path) -> str:
    """The folder an older apps-bench left for a cell refused at its endpoint check: cell.json,
    config.yaml and prompts.json, no records. -> its cell key. (Composed by the CLI itself.)"""
    from omegaconf import OmegaConf

    from apps_bench.cell.key import guard
    from apps_bench.config.schema import cell_data

    composed = run_cli(["--cfg", "job", "model=qwen", "progress=false"], cwd, timeout=120)
    assert composed.returncode == 0, composed.stderr[-2000:]
    data = cell_data(OmegaConf.create(composed.stdout))
    cell = guard(data)
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"key": cell.key, "name": cell.name, "axes": cell.axes()}))
    (folder / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (folder / "prompts.json").write_text("{}")
    return cell.key


def _runs(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    finally:
        con.close()


def test_rescoring_a_cell_with_no_records_is_refused_and_logs_nothing(tmp_path: Path, mlflow_template: Path):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    cell = tmp_path / "outputs" / "cells" / "half-made"
    _half_made_cell(cell, tmp_path)
    before = sorted(p.name for p in cell.iterdir())
    r = subprocess.run(
        [sys.executable, "-m", "apps_bench.rescore", str(cell), "judge=reference"],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "no recorded problems" in r.stderr and "nothing to re-score" in r.stderr
    assert "pass@1" not in r.stdout
    assert sorted(p.name for p in cell.iterdir()) == before  # no rescore/ folder
    assert _runs(db) == 0  # no MLflow run, child of nothing


def test_a_report_where_no_cell_logged_says_so_and_creates_no_store(tmp_path: Path):
    r = run_cli([], tmp_path, module="apps_bench.report", timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "nothing to report" in r.stderr and "--cells-dir" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/mlflow.db made and migrated
