"""The sweep's comparison on its MLflow parent run, so the UI answers "which cell won".

The parent run holds the report's pass@1 table (`render.pass_rows`) as a table artifact, its
text form and its bar chart (`plots.pass_figure`) as a logged figure, and tags naming the
leader and the number of member cells it covers. Publishing belongs to the sweep: the launching
process writes it once, when every cell of the sweep has ended (and again at the end of a rerun
or continuation); a cell only logs its own run. Cells started by hand under a parent run (no
launching process to see the end) publish with `python -m apps_bench.report --sweep ID --publish`.

The comparison covers every member cell (tracking/membership.py) or is not drawn: a member that
has no run, an unfinished run or unreadable records makes `SweepIncomplete`, which names them,
and the parent's `comparison_missing` and `error` tags say the same, never a smaller table.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from apps_bench.report import cells as cellmod
from apps_bench.report import groups, plots, render
from apps_bench.report.table import ReportError
from apps_bench.tracking import faults
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.console import mlflow_ui

TABLE = "sweep_comparison.json"
TEXT = "sweep_comparison.txt"
FIGURE = "sweep_pass_at_1.png"
COLUMNS = ["topology", "model", "settings", "pass_at_1", "ci_low", "ci_high", "seeds", "n_seeds", "n_problems", "per_seed", "block",
           "comparability"]  # fmt: skip


class SweepIncomplete(ReportError):
    """Member cells of a sweep that its figures cannot cover."""

    def __init__(self, sweep: str, missing: list[str]) -> None:
        self.missing = missing
        self.prefix = f"sweep {sweep}: "
        super().__init__(
            f"{self.prefix}{len(missing)} member cell(s) missing, so no comparison is drawn over the others:\n  "
            + "\n  ".join(missing)
            + "\nRerun the sweep's command (the parent run's sweep_overrides tag) to finish them: finished problems "
            "are not solved again."
        )


def leader(rows: list[dict[str, Any]]) -> str:
    """'topology · model (pass@1)' of the best row(s) of the first comparability class (with the settings
    that tell it apart, when cells of one topology and model differ in some)."""
    scored = [r for r in rows if r["pass_at_1"] is not None]
    if not scored:
        return ""
    first = scored[0]["comparability"]
    same = [r for r in scored if r["comparability"] == first]
    best = max(r["pass_at_1"] for r in same)
    return " = ".join(f"{r['topology']} · {r['model']}" + (f" · {r['settings']}" if r["settings"] else "")
                      for r in same if r["pass_at_1"] == best) + f" ({best:.3f})"  # fmt: skip


def publish(uri: str, parent_run_id: str) -> list[dict[str, Any]]:
    """Rewrite the parent run's comparison from its member cells; -> the table's rows.
    SweepIncomplete (after tagging the parent with it) when a member is missing."""
    return _publish(uri, parent_run_id)[0]


def _publish(uri: str, parent_run_id: str) -> tuple[list[dict[str, Any]], str]:
    """`publish`, -> (the table's rows, its text as the parent run holds it)."""
    from mlflow.entities import RunTag


    c = mlf.client(uri)
    found, missing = cellmod.sweep_cells(parent_run_id, uri=uri, with_roles=False)
    if missing:
        err = SweepIncomplete(parent_run_id, missing)
        c.log_text(parent_run_id, str(err) + "\n", TEXT)
        tags = {"comparison_missing": "\n".join(missing)[:5000], "error": str(err)[:5000], "comparison_cells": ""}
        c.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        raise err
    chosen = cellmod.select(found)
    gs = groups.group_cells(chosen)
    rows = render.pass_rows(gs)
    mlf.log_table(c, parent_run_id, rows, TABLE, columns=COLUMNS)
    text = render.pass_table(gs) if gs else "pass@1 by topology × model: this sweep has no cell"
    c.log_text(parent_run_id, text + "\n", TEXT)
    if gs:
        fig = plots.pass_figure(gs)
        try:
            c.log_figure(parent_run_id, fig, FIGURE)
        finally:
            plots.close(fig)
    members = {x.key for x in found if x.run_kind != "rescore"}
    tags = {"comparison_cells": str(len(members)), "comparison_leader": leader(rows)}
    c.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    now = c.get_run(parent_run_id).data.tags  # an earlier publish's complaint no longer holds
    if "comparison_missing" in now:
        c.delete_tag(parent_run_id, "comparison_missing")
    if now.get("error", "").startswith(SweepIncomplete(parent_run_id, []).prefix):
        c.delete_tag(parent_run_id, "error")
    return rows, text


def where_next(uri: str, parent_run_id: str, rows: list[dict[str, Any]]) -> str:
    """The commands that show the sweep again: the whole report (compared against single, or the
    first topology when single did not run; along the first setting that tells its cells apart when
    they share one topology), and the MLflow UI on its store."""
    topologies = [r["topology"] for r in rows]
    base = "single" if "single" in topologies or not topologies else topologies[0]
    compare = f" --compare baseline={base}" if len(set(topologies)) > 1 else ""
    settings = [r["settings"].split("; ")[0] for r in rows if r["settings"]]
    if not compare and settings:  # cells of one topology that differ in a setting: compared along it
        compare = f" --compare {settings[0]}"
    return "\n".join([
        f"full report (comparison, cost, charts): python -m apps_bench.report --sweep {parent_run_id} --tracking-uri {uri}"
        + compare,
        mlflow_ui(uri) + f"   (the sweep's parent run: {parent_run_id})",
    ])  # fmt: skip


def publish_or_say(uri: str, parent_run_id: str) -> list[str] | None:
    """`publish` at the sweep's end, and the comparison printed with where to look next: -> the missing
    members (said on stderr), [] once published, None when the store failed (said on stderr: the cells'
    own runs are complete)."""
    try:
        rows, text = _publish(uri, parent_run_id)
    except SweepIncomplete as exc:
        print(f"apps-bench: {exc}", file=sys.stderr)
        return exc.missing
    except Exception as exc:  # noqa: BLE001 - MLflow, pandas and matplotlib raise their own types
        fault = faults.fault_of(exc, uri)
        said = fault.what if fault is not None else f"{type(exc).__name__}: {exc}"
        print(f"apps-bench: the sweep's comparison on parent run {parent_run_id} was not written: {said}", file=sys.stderr)
        return None
    print(f"\nsweep {parent_run_id}: every cell has ended\n\n{text}\n\n{where_next(uri, parent_run_id, rows)}", flush=True)
    return []


def read(uri: str, parent_run_id: str) -> list[dict[str, Any]]:
    """The rows of the parent run's comparison table as logged (for checks and scripts)."""
    import json


    with tempfile.TemporaryDirectory() as tmp:
        path = Path(mlf.client(uri).download_artifacts(parent_run_id, TABLE, tmp))
        table = json.loads(path.read_text(encoding="utf-8"))
    return [dict(zip(table["columns"], row)) for row in table["data"]]
