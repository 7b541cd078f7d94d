"""The private parts of MLflow the project reaches into (apps_bench/tracking/mlflow_internals.py),
named one by one: an MLflow upgrade that moves one fails here, not deep inside a cell."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import pytest

from apps_bench.tracking import mlflow_internals as mi


@pytest.mark.parametrize("dotted", mi.PRIVATE)
def test_each_private_name_exists_in_the_installed_mlflow(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"{dotted}: {'.'.join(parts[:cut])} has no {attr!r} in this MLflow"
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{dotted}: no importable module")


def test_the_adapter_reads_a_real_store(tmp_path: Path):
    """What the adapter answers matches a store MLflow itself made: its tables and its schema head."""
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    mi.load_mlflow().MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates and migrates
    mi.forget_engine(uri)
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        [(head,)] = conn.execute("select version_num from alembic_version").fetchall()
    assert mi.store_tables() <= tables and "runs" in mi.store_tables()
    assert mi.latest_schema_revision() == head


def test_forget_engine_lets_a_remade_file_be_opened_afresh(tmp_path: Path):
    """Without forgetting, MLflow's cached engine keeps the deleted file's connection and skips the
    migrations of the new one ("no such table: experiments")."""
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    mlflow = mi.load_mlflow()
    mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    mi.forget_engine(uri)
    db.unlink()
    mlflow.MlflowClient(tracking_uri=uri).create_experiment("again")  # a fresh engine migrates the new file
    mi.forget_engine(uri)
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from experiments where name='again'").fetchone() == (1,)
