"""A local SQLite MLflow store survives a SIGKILL at any moment (apps_bench/tracking/sqlite_store.py).

Real MLflow migrations in real processes, killed at many moments: the store is absent or
complete after every kill; a store half-made by MLflow's own in-place creation is remade when it
holds no runs and reported with its fix when it does; a real cell killed across its first
seconds reruns to a complete cell whose MLflow run agrees with its records."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, run_cli

from apps_bench.tracking import sqlite_store

HEAD = None


def _head() -> str:
    global HEAD
    if HEAD is None:
        from mlflow.store.db.utils import _get_latest_schema_revision

        HEAD = _get_latest_schema_revision()
    return HEAD


def _spawn(code: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=cli_env(cwd), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _kill_when(proc: subprocess.Popen, ready, delay: float, timeout: float = 120) -> bool:
    """SIGKILL `proc`'s group `delay` s after `ready()` holds; False if it ended first."""
    end = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > end:
            break
        time.sleep(0.02)
    time.sleep(delay)
    ended = proc.poll() is not None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    proc.stdout.close()
    return not ended


def _migrating(db: Path) -> bool:
    """MLflow's migrations have begun on `db` (alembic_version holds a row) - read without waiting on its writer."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05)
        try:
            return con.execute("SELECT COUNT(*) FROM alembic_version").fetchone()[0] > 0
        finally:
            con.close()
    except sqlite3.Error:
        return False


def _half_made_store(db: Path, cwd: Path) -> None:
    """MLflow's own in-place creation, killed until it leaves a half-made file (the old failure).
    Its migrations take about a second on this kind of machine, so the kill is timed from their start."""
    code = f"from mlflow.tracking import MlflowClient; MlflowClient(tracking_uri='sqlite:///{db}').search_experiments()"
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5):
        db.unlink(missing_ok=True)
        _kill_when(_spawn(code, cwd), lambda: _migrating(db), delay)
        if db.exists() and sqlite_store.schema_problem(db, head=_head()) is not None:
            return
    pytest.fail("could not kill MLflow's in-place migration half-way")


def test_a_new_store_killed_at_any_moment_of_its_creation_is_absent_or_complete(tmp_path: Path):
    db = tmp_path / "s" / "mlflow.db"
    code = f"from pathlib import Path; from apps_bench.tracking import sqlite_store; sqlite_store.ensure_store(Path('{db}'))"
    creating = db.with_name(db.name + sqlite_store.CREATING_SUFFIX)
    leftovers = (db, creating, creating.with_name(creating.name + "-journal"))
    seen_half = 0
    # the migrations take about a second here: most kills land inside them, the last ones after
    for delay in (0.0, 0.1, 0.2, 0.3, 0.5, 0.8, 1.5, 4.0):
        for f in leftovers:  # each creation from nothing, so its kill is timed from its own start
            f.unlink(missing_ok=True)
        killed = _kill_when(_spawn(code, tmp_path), creating.exists, delay)
        if killed and creating.exists():
            seen_half += sqlite_store.schema_problem(creating, head=_head()) is not None
        if db.exists():  # never a half-made store where MLflow looks
            assert sqlite_store.schema_problem(db, head=_head()) is None
    assert seen_half >= 2  # the kills did land mid-migration: the temporary file was half-made
    # a creation killed as it starts leaves its temporary file; the next one clears it and makes a complete store
    for f in leftovers:
        f.unlink(missing_ok=True)
    _kill_when(_spawn(code, tmp_path), creating.exists, 0.0)
    assert creating.exists() and not db.exists()
    sqlite_store.ensure_store(db)
    assert sqlite_store.schema_problem(db, head=_head()) is None and not creating.exists()


def test_cells_creating_one_store_at_once_all_open_it(tmp_path: Path):
    db = tmp_path / "mlflow.db"
    code = (
        "from apps_bench.tracking import mlflow as m; c = m.client('sqlite:///%s'); "
        "print(m.experiment_id(c, 'apps', 'sqlite:///%s'))" % (db, db)
    )
    procs = [_spawn(code, tmp_path) for _ in range(3)]
    outs = [p.communicate(timeout=240)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({o.strip().splitlines()[-1] for o in outs}) == 1  # one experiment, the same for all
    assert sqlite_store.schema_problem(db, head=_head()) is None


def test_a_half_made_store_without_runs_is_remade(tmp_path: Path, capsys):
    db = tmp_path / "mlflow.db"
    _half_made_store(db, tmp_path)
    from apps_bench.tracking import mlflow as mlf

    uri = f"sqlite:///{db}"
    c = mlf._new_client(uri)
    run = c.create_run(mlf.experiment_id(c, "apps", uri))
    assert c.get_run(run.info.run_id).info.status == "RUNNING"
    assert sqlite_store.schema_problem(db, head=_head()) is None
    assert "was incomplete" in capsys.readouterr().err
    # kept, not deleted (with its journal, if the kill left one)
    [aside] = [p for p in tmp_path.iterdir() if ".broken-" in p.name and not p.name.endswith(sqlite_store.SIDE_FILES)]
    assert aside.stat().st_size > 0


def _store_with_a_run(db: Path) -> None:
    from apps_bench.tracking import mlflow as mlf

    c = mlf._new_client(f"sqlite:///{db}")
    c.create_run(mlf.experiment_id(c, "apps", f"sqlite:///{db}"))
    sqlite_store.forget_engine(f"sqlite:///{db}")


def test_a_broken_store_with_runs_stops_the_cell_with_the_commands_that_fix_it(tmp_path: Path):
    db = tmp_path / "outputs" / "mlflow.db"
    _store_with_a_run(db)
    with sqlite3.connect(db) as con:  # an upgrade interrupted inside a batch migration
        con.execute("CREATE TABLE _alembic_tmp_tags (key VARCHAR(250))")
    r = run_cli(["progress=false"], tmp_path)
    assert r.returncode == 2 and "StoreError" not in r.stderr, r.stderr[-3000:]  # a message, not a traceback
    assert "leftover table _alembic_tmp_tags" in r.stderr and "holds 1 runs" in r.stderr
    assert "DROP TABLE _alembic_tmp_tags" in r.stderr and f"mlflow db upgrade sqlite:///{db}" in r.stderr
    assert db.exists() and sqlite_store.runs_in(db) == 1  # left alone
    # the printed drop command is runnable as printed
    drop = next(line.strip() for line in r.stderr.splitlines() if "DROP TABLE" in line)
    subprocess.run(drop, shell=True, check=True, cwd=tmp_path)
    assert sqlite_store.schema_problem(db, head=_head()) is None


def test_an_out_of_date_store_with_runs_is_reported_not_touched(tmp_path: Path):
    db = tmp_path / "outputs" / "mlflow.db"
    _store_with_a_run(db)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'a0000000000a'")
    r = run_cli(["progress=false"], tmp_path)
    # the store is found out while the first problems run: stopping them may make asyncio print
    # its own shutdown noise, but the store's error is the message, not a traceback
    assert r.returncode == 2 and "StoreError" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.rstrip().endswith("(the cells' records are kept; a rerun logs them again).")
    assert f"schema is at revision a0000000000a, this MLflow needs {_head()}" in r.stderr
    assert "holds 1 runs" in r.stderr and f"mlflow db upgrade sqlite:///{db}" in r.stderr
    assert sqlite_store.runs_in(db) == 1


def _kill_a_writer_mid_transaction(db: Path) -> None:
    """A process SIGKILLed inside a write transaction that had spilled pages into the file (as a cell
    killed while logging): it leaves a hot `-journal` that SQLite rolls back on the next open."""
    code = (
        f"import os, sqlite3; con = sqlite3.connect({str(db)!r}, isolation_level=None); con.execute('PRAGMA cache_size=10'); "
        "con.execute('BEGIN IMMEDIATE'); con.execute(\"UPDATE runs SET name = 'half-written'\"); con.execute('CREATE TABLE junk (a)'); "
        "[con.execute('INSERT INTO junk VALUES (randomblob(20000))') for _ in range(50)]; os.kill(os.getpid(), 9)"
    )
    subprocess.run([sys.executable, "-c", code], check=False)
    assert Path(f"{db}-journal").stat().st_size > 0


def test_a_store_whose_writer_was_killed_mid_transaction_keeps_its_runs(tmp_path: Path):
    """Read-only, such a file looks unreadable; it used to be taken for a half-made store with no
    runs and moved aside (its journal left beside the new store)."""
    db = tmp_path / "outputs" / "mlflow.db"
    _store_with_a_run(db)
    _kill_a_writer_mid_transaction(db)
    r = run_cli(["progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "was incomplete" not in r.stderr and not [p for p in db.parent.iterdir() if ".broken-" in p.name]
    assert sqlite_store.runs_in(db) == 2 and sqlite_store.schema_problem(db, head=_head()) is None
    with sqlite3.connect(db) as con:  # the killed transaction was rolled back, not half kept
        assert con.execute("SELECT COUNT(*) FROM runs WHERE name = 'half-written'").fetchone()[0] == 0
        assert not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'junk'").fetchall()


def test_a_deleted_stores_journal_is_not_rolled_into_the_new_store(tmp_path: Path):
    db = tmp_path / "mlflow.db"
    _store_with_a_run(db)
    _kill_a_writer_mid_transaction(db)
    db.unlink()  # "start afresh": the store deleted, its hot journal left behind
    sqlite_store.ensure_store(db)
    assert not Path(f"{db}-journal").exists()
    assert sqlite_store.schema_problem(db, head=_head()) is None and sqlite_store.runs_in(db) == 0


def test_a_store_that_cannot_be_read_is_left_alone_with_the_fix(tmp_path: Path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"these are not the bytes of a SQLite database\n" * 200)
    before = db.read_bytes()
    with pytest.raises(sqlite_store.StoreError) as err:
        sqlite_store.ensure_store(db)
    assert "cannot be read" in str(err.value) and f"mv '{db}' '{db}.bak'" in str(err.value)
    assert db.read_bytes() == before and [p.name for p in tmp_path.iterdir() if ".broken-" in p.name] == []


# --------------------------------------------------------------- a real cell, killed and rerun

N_PROBLEMS = 4
# (event, seconds after it): across the cell's first seconds, and inside the store's creation
KILL_POINTS = [("start", 0.5), ("start", 1.5), ("creating", 0.2), ("creating", 2.0), ("store", 0.0),
               ("record", 0.0)]  # fmt: skip


def test_a_cell_killed_anywhere_in_its_first_seconds_reruns_to_a_complete_cell_and_run(
    tmp_path: Path, apps_data_dir: Path
):
    args = ["dataset=apps", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}", "dataset.split=train",
            f"limit={N_PROBLEMS}", "concurrency=1", "processes=1", "judge.workers=1", "progress=false"]  # fmt: skip
    landed = set()
    for i, (event, delay) in enumerate(KILL_POINTS):
        cwd = tmp_path / f"k{i}"
        cwd.mkdir()
        db = cwd / "outputs" / "mlflow.db"
        ready = {
            "start": lambda: True,
            "creating": lambda db=db: db.with_name("mlflow.db.creating").exists(),
            "store": lambda db=db: db.exists(),
            "record": lambda cwd=cwd: any(cwd.glob("outputs/cells/*/records.jsonl")),
        }[event]
        proc = subprocess.Popen([sys.executable, "-m", "apps_bench", *args, "model.latency_ms=700"], cwd=cwd,
                                env=cli_env(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        if _kill_when(proc, ready, delay):
            landed.add((event, delay))
        r = run_cli(args, cwd)
        assert r.returncode == 0, f"kill {event}+{delay}s: " + r.stdout[-2000:] + r.stderr[-3000:]
        [cell] = list((cwd / "outputs" / "cells").iterdir())
        recs = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
        summary = json.loads((cell / "summary.json").read_text())
        assert len({x["key"] for x in recs}) == len(recs) == N_PROBLEMS and summary["complete"] is True
        from mlflow.tracking import MlflowClient

        from apps_bench.tracking.mlflow import flatten

        c = MlflowClient(tracking_uri=f"sqlite:///{db}")
        [run] = c.search_runs([c.get_experiment_by_name("apps").experiment_id])  # one run, continued
        assert run.info.status == "FINISHED" and run.data.tags["cell_key"] == summary["cell"]["key"]
        assert run.data.metrics["n_recorded"] == N_PROBLEMS and run.data.metrics["pass_at_1"] == summary["pass_at_1"]
        identity = json.loads((cell / "cell.json").read_text())["identity"]
        assert run.data.params == flatten(identity)  # every param, even if the kill cut their logging
        sqlite_store.forget_engine(f"sqlite:///{db}")
    assert len(landed) >= len(KILL_POINTS) - 1, landed  # the kills hit a running cell, not a finished one
