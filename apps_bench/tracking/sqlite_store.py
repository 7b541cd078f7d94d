"""A local SQLite MLflow store that a SIGKILL at any moment leaves absent or complete.

MLflow creates a SQLite store in place: its schema is ~60 migrations (seconds), each committed
on its own, so a cell killed during its first seconds used to leave a half-made file that every
later cell then failed on ("table _alembic_tmp_tags already exists", "Detected out-of-date
database schema"). Here a new store is migrated in a temporary file next to the target and moved
into place with `os.replace` (atomic on one filesystem), under the store's file lock so parallel
cells never migrate the same file. A half-made store already on disk (a kill under an older
version, an interrupted `mlflow db upgrade`) is recognized: with no runs in it, it is moved aside
and made again; with runs, the cell stops with the exact commands that repair it; one that cannot
be read at all is left alone, with the command that moves it aside. A store whose writer was
killed inside a transaction (its hot `-journal` beside it) is neither: SQLite rolls that
transaction back on the first read, and the store is used as it is.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

from apps_bench.errors import AppsBenchError
from apps_bench.tracking import mlflow_internals as mi

CREATING_SUFFIX = ".creating"  # the temporary file a new store is migrated in (same directory)
ELSEWHERE = (
    "or point this run at another store: MLFLOW_TRACKING_URI=sqlite:////path/to/new.db "
    "(the cells' records are kept; a rerun logs them again)."
)
SIDE_FILES = ("-journal", "-wal", "-shm")  # SQLite's own files beside a database, which belong to it


class StoreError(AppsBenchError):
    """The tracking store cannot be used as it is; the message says how to fix it."""


def lock_path(db: Path) -> str:
    return str(db) + ".lock"


def ensure_store(db: Path) -> None:
    """Make `db` a complete MLflow SQLite store: create it atomically when absent, remake a
    half-created one that holds no runs, raise StoreError (with the fix) for one that does."""
    from filelock import FileLock

    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_path(db)):
        if not db.exists() or db.stat().st_size == 0:
            _create(db)
            return
        problem = schema_problem(db, tables=mi.store_tables())
        if problem is not None:
            repair(db, problem)


def schema_problem(db: Path, head: str | None = None, tables: set[str] | None = None) -> str | None:
    """What makes `db` not a complete MLflow store (None when nothing is seen), read with sqlite3.

    `tables`: the tables it must hold (default: the core ones). Without `head` (MLflow's latest
    schema revision, ~1 s to compute) a store whose revision is merely old passes; MLflow's own
    check then reports it and `diagnose` is called with `head`."""
    try:
        con = _connect(db)
        try:
            present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            revs = [r[0] for r in con.execute("SELECT version_num FROM alembic_version")] if "alembic_version" in present else []
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        return f"not a readable SQLite database ({exc})"
    tmp = sorted(t for t in present if t.startswith("_alembic_tmp_"))
    if tmp:
        return f"a schema migration was interrupted (leftover table {', '.join(tmp)})"
    if not revs:
        return "its schema was never finished (no alembic_version row)"
    missing = (tables or {"experiments", "runs", "tags", "params", "metrics", "latest_metrics"}) - present
    if missing:
        shown = ", ".join(sorted(missing)[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return f"its schema was never finished (no table {shown})"
    if head is not None and revs[0] != head:
        return f"its schema is at revision {revs[0]}, this MLflow needs {head}"
    return None


def runs_in(db: Path) -> int | None:
    """Runs the store holds: 0 when it has no runs table, None when it cannot be read at all."""
    try:
        con = _connect(db)
        try:
            present = con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='runs'").fetchone()
            return int(con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]) if present else 0
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return None


def _connect(db: Path) -> sqlite3.Connection:
    """`db` opened for reading, never created. A writer killed inside a transaction (a cell
    SIGKILLed while logging) leaves a hot `-journal`: SQLite rolls that transaction back before
    anything reads the file, which needs write access, so such a file is opened read-write, as
    MLflow's own open would; read-only, it looks unreadable."""
    mode = "rw" if Path(f"{db}-journal").exists() else "ro"
    return sqlite3.connect(f"file:{db}?mode={mode}", uri=True, timeout=30)


def repair(db: Path, problem: str) -> None:
    """A half-made store with no runs is moved aside (`<db>.broken-<time>`) and made again; one with
    runs is left alone and reported with the commands that fix it. Call under the store's lock."""
    n = runs_in(db)
    if n is None:
        raise StoreError(
            f"the MLflow store {db} cannot be read: {problem}. apps-bench does not remake a store it cannot "
            f"read (it may hold runs). Move it aside:\n  mv '{db}' '{db}.bak'\n{ELSEWHERE}"
        )
    if n:
        raise StoreError(fix_message(db, problem, n))
    aside = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
    for side in SIDE_FILES:  # its journal goes with it: beside the new store it would be rolled back into it
        if Path(f"{db}{side}").exists():
            os.replace(f"{db}{side}", f"{aside}{side}")
    os.replace(db, aside)
    print(
        f"apps-bench: the MLflow store {db} was incomplete ({problem}) and held no runs: "
        f"moved it to {aside.name} and created a new one.",
        file=sys.stderr,
    )
    _create(db)


def fix_message(db: Path, problem: str, n_runs: int) -> str:
    uri = f"sqlite:///{db}"
    drop = ""
    if "_alembic_tmp_" in problem:
        names = problem.split("leftover table ", 1)[1].rstrip(")").split(", ")
        stmts = "; ".join(f"DROP TABLE {t}" for t in names)
        drop = f"  python -c \"import sqlite3; c = sqlite3.connect('{db}'); c.executescript('{stmts};')\"\n"
    return (
        f"the MLflow store {db} is not usable: {problem}. It holds {n_runs} runs, so apps-bench does not "
        f"remake it. Back it up, then repair it:\n  cp '{db}' '{db}.bak'\n{drop}  mlflow db upgrade {uri}\n"
        f"{ELSEWHERE}"
    )


def diagnose(db: Path, exc: BaseException) -> None:
    """MLflow refused to open `db` (`exc`): remake it if it is a half-made store without runs,
    else raise StoreError with the fix; re-raise `exc` when the store looks complete."""
    from filelock import FileLock

    with FileLock(lock_path(db)):
        problem = schema_problem(db, head=mi.latest_schema_revision()) if db.exists() else None
        if problem is None:
            raise exc
        repair(db, problem)


def _create(db: Path) -> None:
    """Migrate a new store in `<db>.creating`, then move it into place. Call under the store's lock."""
    tmp = db.with_name(db.name + CREATING_SUFFIX)
    for leftover in (tmp, *(Path(f"{tmp}{side}") for side in SIDE_FILES)):  # a creation killed earlier
        leftover.unlink(missing_ok=True)
    _migrate(f"sqlite:///{tmp}")
    for side in SIDE_FILES:  # left by an empty or deleted file that stood here: never paired with the new store
        Path(f"{db}{side}").unlink(missing_ok=True)
    os.replace(tmp, db)
    _fsync_dir(db.parent)


def _migrate(uri: str) -> None:
    mi.load_mlflow().MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates and migrates the schema
    mi.forget_engine(uri)  # close the file before it moves


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
