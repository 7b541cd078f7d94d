"""A local SQLite MLflow store survives a SIGKILL at any moment (apps_bench/tracking/sqlite_store.py).

Real MLflow migrations in real processes, killed at many moments: the store is absent or
complete after every kill; a store half-made by MLflow's own in-place creation is remade when it
holds no runs and reported with its fix when it does; a real cell killed across its first
seconds reruns to a complete cell whose MLflow run agrees with its records. Every kill is at an event
of the killed process (its Nth SQL statement, its Nth record: kill_at.py), never after N seconds."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import kill_at as kill_at_mod
import pytest
from conftest import cli_env, run_cli

from apps_bench.tracking import mlflow_internals, sqlite_store

HEAD = None


def _head() -> str:
    global HEAD
    if HEAD is None:
        from apps_bench.tracking.mlflow_internals import latest_schema_revision

        HEAD = latest_schema_revision()
    return HEAD


def _spawn(code: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=cli_env(cwd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _run_killed_at(argv: list[str], cwd: Path, kill_at: str = "", count: Path | None = None) -> subprocess.CompletedProcess:
    """Run `argv` (a kill_at.wrap/cli command) to its end, the child killing itself at event `kill_at`
    (kill_at.py: the Nth SQL statement, the Nth record), or counting its events into `count`."""
    extra = {kill_at_mod.KILL_AT: kill_at} if kill_at else {}
    if count is not None:
        extra[kill_at_mod.KILL_COUNT] = str(count)
    log = cwd / f"killed-at-{kill_at.replace(':', '_').replace(' ', '_') or 'none'}.log"
    with open(log, "w") as out:  # a file, not a pipe: a helper outside the killed group cannot hold the test up
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=cli_env(cwd, **extra),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.wait(timeout=300)
    return subprocess.CompletedProcess(argv, proc.returncode, log.read_text(), "")


def _killed(r: subprocess.CompletedProcess) -> bool:
    return r.returncode == -signal.SIGKILL


MIGRATION_STEP = "UPDATE alembic_version"  # one statement per migration: MLflow's ~66 steps to its head


def _half_made_store(db: Path, cwd: Path) -> None:
    """MLflow's own in-place creation, killed as it records its 30th migration (the old failure)."""
    code = f"from mlflow.tracking import MlflowClient; MlflowClient(tracking_uri='sqlite:///{db}').search_experiments()"
    r = _run_killed_at(kill_at_mod.wrap(code), cwd, f"sql:30:{MIGRATION_STEP}")
    assert _killed(r), r.stdout[-2000:] + r.stderr[-2000:]
    assert db.exists() and sqlite_store.schema_problem(db, head=_head()) is not None


@pytest.mark.slow  # 7 interpreters, each importing MLflow
def test_a_new_store_killed_at_any_moment_of_its_creation_is_absent_or_complete(tmp_path: Path):
    db = tmp_path / "s" / "mlflow.db"
    code = f"from pathlib import Path; from apps_bench.tracking import sqlite_store; sqlite_store.ensure_store(Path('{db}'))"
    creating = db.with_name(db.name + sqlite_store.CREATING_SUFFIX)
    leftovers = (db, creating, creating.with_name(creating.name + "-journal"))
    # one creation to its end, counting its SQL statements and migration steps: the kills are spread over them
    count = tmp_path / "count.json"
    assert _run_killed_at(kill_at_mod.wrap(code), tmp_path, count=count).returncode == 0
    assert sqlite_store.schema_problem(db, head=_head()) is None and not creating.exists()
    statements = json.loads(count.read_text())["sql"]
    steps = sum(x.startswith(MIGRATION_STEP) for x in statements)
    assert steps >= 10, statements[:20]  # MLflow migrates its schema step by step: kills between steps exist
    half = [f"sql:{k}:{MIGRATION_STEP}" for k in (1, steps // 3, 2 * steps // 3, steps)]
    for point in ["sql:1", *half, f"sql:{len(statements)}"]:  # first statement, between steps, the very last one
        for f in leftovers:  # each creation from nothing
            f.unlink(missing_ok=True)
        r = _run_killed_at(kill_at_mod.wrap(code), tmp_path, point)
        assert _killed(r), f"{point}: " + r.stdout[-2000:] + r.stderr[-2000:]
        assert not db.exists(), point  # never a half-made store where MLflow looks: only the temporary file
        assert creating.exists(), point
        if point in half:  # killed between migration steps: the temporary file is half-made
            assert sqlite_store.schema_problem(creating, head=_head()) is not None, point
    # the last creation was killed before its move: the next one clears the temporary file and makes a complete store
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
    mlflow_internals.forget_engine(f"sqlite:///{db}")


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
# Where the cell is killed: events of its own, so each kill lands in the same state on any machine. A kill as
# the store's creation begins is the creation test's above; one after the first record is test_resume_after_kill9's.
KILL_POINTS = [
    f"sql:30:{MIGRATION_STEP}",  # half-way through the store's migrations
    "sql:1:INSERT INTO runs",  # the store in place, the cell's MLflow run being created
    "sql:1:INSERT INTO params",  # the run created, its params being logged
    f"record:{N_PROBLEMS}",  # every problem recorded, the run not yet finished
]


@pytest.mark.slow
@pytest.mark.timeout(900)  # 4 kills and 4 reruns of a real cell, each a fresh interpreter: minutes on 2 busy cores
def test_a_cell_killed_anywhere_reruns_to_a_complete_cell_and_run(tmp_path: Path, apps_data_dir: Path):
    args = [
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "dataset.split=train",
        f"limit={N_PROBLEMS}",
        "concurrency=1",
        "processes=1",
        "judge.workers=1",
        "progress=false",
    ]
    for i, point in enumerate(KILL_POINTS):
        cwd = tmp_path / f"k{i}"
        cwd.mkdir()
        db = cwd / "outputs" / "mlflow.db"
        killed = _run_killed_at([*kill_at_mod.cli(), *args], cwd, point)
        assert _killed(killed), f"{point}: the cell ended before its kill point\n" + killed.stdout[-2000:] + killed.stderr[-2000:]
        r = run_cli(args, cwd)
        assert r.returncode == 0, f"killed at {point}: " + r.stdout[-2000:] + r.stderr[-3000:]
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
        mlflow_internals.forget_engine(f"sqlite:///{db}")
