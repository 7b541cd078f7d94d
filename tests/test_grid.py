"""The grid guard through the real CLI: a refused cell runs nothing; one refused cell of a
sweep refuses the whole sweep before any job starts and before any MLflow run exists."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conftest import cli_env, config_dir_preset, run_cli


def _runs_in(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        try:
            return con.execute("select count(*) from runs").fetchone()[0]
        except sqlite3.OperationalError:  # no tables: the store was never initialised
            return 0


def test_refused_cell_exits_nonzero_and_runs_nothing(tmp_path: Path):
    r = run_cli(["seed=7"], tmp_path)
    assert r.returncode != 0
    err = r.stderr
    assert "seed=7" in err and "allow_any_cell=true" in err and "grid" in err
    assert "Traceback" not in err
    assert not (tmp_path / "outputs" / "cells").exists()
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_refused_exclusion_names_the_axis(tmp_path: Path):
    r = run_cli(["model=gold", "optimizer=gepa"], tmp_path)
    assert r.returncode != 0
    assert "model=gold" in r.stderr and "optimizer=gepa" in r.stderr and "allow_any_cell=true" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()


def test_refusal_in_a_multirun_runs_nothing(tmp_path: Path):
    db = tmp_path / "store" / "mlflow.db"
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    r = run_cli(["-m", "seed=0,1,7"], tmp_path, env=env)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "seed=7" in r.stderr and "allow_any_cell=true" in r.stderr
    assert "1 of 3 cells" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()  # no cell ran, not even the allowed ones
    assert _runs_in(db) == 0  # and no MLflow run (not even the sweep's parent) exists


def test_refusal_in_a_declared_sweep(tmp_path: Path):
    # experiment=smoke declares seed=0,1 as data; the command line adds a topology of the user's own, outside the grid
    env = cli_env(tmp_path)
    mine = config_dir_preset(tmp_path / "my_conf", "made_up", "single", group="topology")
    r = run_cli(["experiment=smoke", "topology=made_up", "--config-dir", str(mine)], tmp_path, env=env)
    assert r.returncode != 0
    assert "topology=made_up" in r.stderr and "2 of 2 cells" in r.stderr
    assert _runs_in(tmp_path / "outputs" / "mlflow.db") == 0


def test_seed_flags_point_to_overrides(tmp_path: Path):
    r = run_cli(["--batch", "--limit", "50", "--out-dir", "x"], tmp_path)
    assert r.returncode == 2
    for flag, override in (("--batch", "dataset=apps"), ("--limit", "limit=N"), ("--out-dir", "out_dir=PATH")):
        assert flag in r.stderr and override in r.stderr


def test_help_is_fast_path_and_names_groups(tmp_path: Path):
    r = run_cli(["--help"], tmp_path)
    assert r.returncode == 0
    for word in ("dataset:", "topology:", "model:", "--max-tests-per-row", "allow_any_cell=true"):
        assert word in r.stdout
