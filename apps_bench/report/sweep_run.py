"""The sweep's comparison on its MLflow parent run, so the UI answers "which cell won".

The parent run holds the report's pass@1 table (`render.pass_rows`) as a table artifact, its
text form and its bar chart (`plots.pass_figure`) as a logged figure, and tags naming the
leader. It is rewritten whole, from the store's current state, each time a cell of the sweep
finishes (in the cell's own process, wherever it runs: it knows the parent from
APPS_BENCH_PARENT_RUN_ID), when the sweep starts and when it ends (in the launching process).

Concurrent writers: every write is a complete table computed from the store at that moment;
the last writer wins. On a SQLite store (one file, so one filesystem for every writer) the
read-and-write is serialised under a lock beside the store, so the last writer has read every
cell finished before it. Against an MLflow server cells on other hosts cannot share a lock:
a write may then miss a cell finishing at the same moment, and the launching process's
rewrite at the sweep's end makes the table whole.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

TABLE = "sweep_comparison.json"
TEXT = "sweep_comparison.txt"
FIGURE = "sweep_pass_at_1.png"
COLUMNS = ["topology", "model", "pass_at_1", "ci_low", "ci_high", "seeds", "n_seeds", "n_problems", "comparability"]


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    if not uri.startswith("sqlite:///"):
        yield
        return
    from filelock import FileLock

    with FileLock(uri[len("sqlite:///") :] + ".comparison.lock", timeout=600):
        yield


def leader(rows: list[dict[str, Any]]) -> str:
    """'topology · model (pass@1)' of the best row(s) of the first comparability class."""
    scored = [r for r in rows if r["pass_at_1"] is not None]
    if not scored:
        return ""
    first = scored[0]["comparability"]
    same = [r for r in scored if r["comparability"] == first]
    best = max(r["pass_at_1"] for r in same)
    return " = ".join(f"{r['topology']} · {r['model']}" for r in same if r["pass_at_1"] == best) + f" ({best:.3f})"


def publish(uri: str, parent_run_id: str) -> list[dict[str, Any]]:
    """Rewrite the parent run's comparison from the sweep's finished cells; -> the table's rows."""
    from apps_bench.report import cells as cellmod
    from apps_bench.report import groups, plots, render
    from apps_bench.tracking import mlflow as mlf

    c = mlf.client(uri)
    with _store_lock(uri):
        chosen = cellmod.select(cellmod.from_mlflow(sweep=parent_run_id, uri=uri, with_roles=False))
        gs = groups.group_cells(chosen)
        rows = render.pass_rows(gs)
        mlf.log_table(c, parent_run_id, rows, TABLE, columns=COLUMNS)
        text = render.pass_table(gs) if gs else "pass@1 by topology × model: no cell of this sweep has finished yet"
        c.log_text(parent_run_id, text + "\n", TEXT)
        if gs:
            fig = plots.pass_figure(gs)
            try:
                c.log_figure(parent_run_id, fig, FIGURE)
            finally:
                plots.close(fig)
        from mlflow.entities import RunTag

        tags = {"comparison_cells": str(len(chosen)), "comparison_leader": leader(rows)}
        c.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return rows


def publish_quietly(uri: str, parent_run_id: str) -> None:
    """`publish`, for a cell's end and the sweep's: a comparison that cannot be written is said
    on stderr, never the cell's failure (its own run is already complete)."""
    try:
        publish(uri, parent_run_id)
    except Exception as exc:  # noqa: BLE001 - MLflow, pandas and matplotlib raise their own types
        print(f"apps-bench: the sweep's comparison on parent run {parent_run_id} was not updated: {exc}", file=sys.stderr)


def read(uri: str, parent_run_id: str) -> list[dict[str, Any]]:
    """The rows of the parent run's comparison table as logged (for checks and scripts)."""
    import json

    from apps_bench.tracking import mlflow as mlf

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(mlf.client(uri).download_artifacts(parent_run_id, TABLE, tmp))
        table = json.loads(path.read_text(encoding="utf-8"))
    return [dict(zip(table["columns"], row)) for row in table["data"]]
