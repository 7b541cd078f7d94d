"""The sweep's comparison on its MLflow parent run, so the UI answers "which cell won".

The parent run holds the report's pass@1 table (`render.pass_rows`) with each row's paired
difference against the baseline (the report's `--compare`: `single`, else the first topology)
as a table artifact, its text form and its bar chart (`plots.pass_figure`) as a logged figure,
the same figures as metrics (`metrics_of`: one per row and figure, named so the UI's metric list
reads as the table), and tags naming the leader and the number of member cells it covers. Publishing belongs to the sweep: the launching
process writes it once, when every cell of the sweep has ended (and again at the end of a rerun
or continuation); a cell only logs its own run. Cells started by hand under a parent run (no
launching process to see the end) publish with `python -m apps_bench.report --sweep ID --publish`.

The comparison covers every member cell (tracking/membership.py) or is not drawn: a member that
has no run, an unfinished run or unreadable records makes `SweepIncomplete`, which names them,
and the parent's `comparison_missing` and `error` tags say the same, never a smaller table.
"""

from __future__ import annotations

import math
import re
import sys
import tempfile
from pathlib import Path

from apps_bench.report import cells as cellmod
from apps_bench.report import groups, paper, plots, render
from apps_bench.report.table import ReportError
from apps_bench.tracking import faults
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.console import mlflow_ui
from apps_bench.types import JsonObject

TABLE = "sweep_comparison.json"
TEXT = "sweep_comparison.txt"
FIGURE = "sweep_pass_at_1.png"
PASS_COLUMNS = [
    "topology",
    "model",
    "settings",
    "pass_at_1",
    "ci_low",
    "ci_high",
    "seeds",
    "n_seeds",
    "n_problems",
    "per_seed",
    "block",
    "comparability",
]
# each row against its baseline (groups.compare_to_baseline): empty on the baseline's own rows and on refused ones
DIFF_COLUMNS = [
    "baseline",
    "delta_pass_at_1",
    "delta_ci_low",
    "delta_ci_high",
    "wins",
    "losses",
    "mcnemar_p",
    "holm_p",
    "not_compared",
]
# the APPS paper's figures per difficulty tier (report/tiers.py, seeds pooled); the test-case average is a lower
# bound when the judge stopped failing programs at their first failing test
TIER_COLUMNS = [f"{m}_{t}" for m, _ in paper.METRICS for t in paper.COLUMNS] + ["test_case_average_lower_bound"]
# the table's order: what a reader compares first (the UI shows the first dozen columns without scrolling)
COLUMNS = PASS_COLUMNS[:6] + DIFF_COLUMNS[:-1] + TIER_COLUMNS + PASS_COLUMNS[6:] + DIFF_COLUMNS[-1:]


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


def leader(rows: list[JsonObject]) -> str:
    """'topology · model (pass@1)' of the best row(s) of the first comparability class (with the settings
    that tell it apart, when cells of one topology and model differ in some)."""
    scored = [r for r in rows if r["pass_at_1"] is not None]
    if not scored:
        return ""
    first = scored[0]["comparability"]
    same = [r for r in scored if r["comparability"] == first]
    best = max(r["pass_at_1"] for r in same)
    return (
        " = ".join(
            f"{r['topology']} · {r['model']}" + (f" · {r['settings']}" if r["settings"] else "")
            for r in same
            if r["pass_at_1"] == best
        )
        + f" ({best:.3f})"
    )


def baseline_of(rows: list[JsonObject]) -> groups.Baseline | None:
    """What the sweep's cells are compared against: `single` when it ran, else the first topology; cells of
    one topology that differ in a setting, along the first such setting (the first row's value of it);
    None when there is nothing to compare."""
    topologies = [r["topology"] for r in rows]
    if len(set(topologies)) > 1:
        return groups.Baseline("baseline", "single" if "single" in topologies else topologies[0])
    settings = [r["settings"].split("; ")[0] for r in rows if r["settings"]]
    if settings:
        key, _, value = settings[0].partition("=")
        return groups.Baseline(key, value)
    return None


def comparison_rows(
    gs: list[groups.Group], comps: list[groups.Comparison], base: groups.Baseline | None, tier_rows: list[paper.PaperRow]
) -> list[JsonObject]:
    """The parent's table: the report's pass@1 rows (`render.pass_rows`), each with its paired comparison
    against `base` (the comparison table's figures; empty where the row is the baseline, and the reason
    where the comparison was refused) and its APPS figures per tier (`tier_rows`: paper.rows_of(gs))."""
    by_group = {(c.label, c.model, c.settings, c.comparability): c for c in comps}
    out = []
    for g, row, tier in zip(gs, render.pass_rows(gs), tier_rows):
        cmp = by_group.get((g.label, g.model, g.settings, g.comparability))
        r = cmp.result if cmp is not None else None
        out.append(
            {
                **row,
                **_tier_figures(tier),
                "baseline": base.label if base is not None else None,
                "delta_pass_at_1": r.diff if r else None,
                "delta_ci_low": r.low if r else None,
                "delta_ci_high": r.high if r else None,
                "wins": r.a_only if r else None,
                "losses": r.b_only if r else None,
                "mcnemar_p": r.p_value if r else None,
                "holm_p": cmp.p_holm if cmp is not None else None,
                "not_compared": cmp.refused if cmp is not None else None,
            }
        )
    return out


def _tier_figures(row: paper.PaperRow) -> JsonObject:
    """A group's TIER_COLUMNS: each metric per tier (None where the group has no problem of the tier)."""
    out: JsonObject = {}
    for metric, _ in paper.METRICS:
        for t in paper.COLUMNS:
            f = row.figures.get(t)
            iv = getattr(f, metric) if f is not None else None
            out[f"{metric}_{t}"] = None if iv is None or math.isnan(iv.estimate) else iv.estimate
    out["test_case_average_lower_bound"] = any(f.lower_bound for f in row.figures.values())
    return out


def row_name(row: JsonObject, many_blocks: bool) -> str:
    """A row as a metric name's tail: `sequential_langgraph gold`, then its settings and, when the sweep
    has several blocks, its block (`... block B`); characters MLflow refuses in a metric name become `_`."""
    parts = [row["topology"], row["model"], *row["settings"].replace("=", " ").split("; ")]
    if many_blocks:
        parts.append(f"block {row['block']}")
    name = " ".join(p for p in parts if p)
    return re.sub(r"[^\w.\- ]", "_", name, flags=re.ASCII)[:200]


def metrics_of(rows: list[JsonObject]) -> dict[str, float]:
    """The table's figures as the parent run's metrics, one per row and figure: `pass_at_1/<row>`,
    `pass_at_1_ci_low/<row>`, `pass_at_1_ci_high/<row>`, and for a compared row `delta_vs_<baseline>/<row>`,
    `delta_ci_low_vs_<baseline>/<row>`, `delta_ci_high_vs_<baseline>/<row>`, `mcnemar_p_vs_<baseline>/<row>`,
    `holm_p_vs_<baseline>/<row>` (the UI groups a metric's rows under its prefix)."""
    many = len({r["block"] for r in rows}) > 1
    out: dict[str, float] = {}
    for r in rows:
        name = row_name(r, many)
        vs = "_vs_" + re.sub(r"[^\w.\-]", "_", str(r["baseline"]), flags=re.ASCII)
        for metric, col in (
            ("pass_at_1", "pass_at_1"),
            ("pass_at_1_ci_low", "ci_low"),
            ("pass_at_1_ci_high", "ci_high"),
            ("delta" + vs, "delta_pass_at_1"),
            ("delta_ci_low" + vs, "delta_ci_low"),
            ("delta_ci_high" + vs, "delta_ci_high"),
            ("mcnemar_p" + vs, "mcnemar_p"),
            ("holm_p" + vs, "holm_p"),
        ):
            if r.get(col) is not None:
                out[f"{metric}/{name}"] = float(r[col])
    return out


def publish(uri: str, parent_run_id: str) -> list[JsonObject]:
    """Rewrite the parent run's comparison from its member cells; -> the table's rows.
    SweepIncomplete (after tagging the parent with it) when a member is missing."""
    return _publish(uri, parent_run_id)[0]


def _publish(uri: str, parent_run_id: str) -> tuple[list[JsonObject], str]:
    """`publish`, -> (the table's rows, its text as the parent run holds it)."""
    import time

    from mlflow.entities import Metric, RunTag

    c = mlf.client(uri)
    now_ms = int(time.time() * 1000)
    found, missing = cellmod.sweep_cells(parent_run_id, uri=uri, with_roles=False)
    if missing:
        err = SweepIncomplete(parent_run_id, missing)
        c.log_text(parent_run_id, str(err) + "\n", TEXT)
        tags = {"comparison_missing": "\n".join(missing)[:5000], "error": str(err)[:5000], "comparison_cells": ""}
        c.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        raise err
    chosen = cellmod.select(found)
    gs = groups.group_cells(chosen)
    base = baseline_of(render.pass_rows(gs))
    comps = groups.compare_to_baseline(gs, base) if base is not None else []
    tier_rows = paper.rows_of(gs)
    rows = comparison_rows(gs, comps, base, tier_rows)
    mlf.log_table(c, parent_run_id, rows, TABLE, columns=COLUMNS)
    text = render.pass_table(gs) if gs else "pass@1 by topology × model: this sweep has no cell"
    if comps:
        text += "\n\n" + render.compare_table(comps, groups.blocks(gs))
    c.log_text(parent_run_id, text + "\n", TEXT)
    c.log_batch(parent_run_id, metrics=[Metric(k, v, now_ms, 0) for k, v in metrics_of(rows).items()])
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


def where_next(uri: str, parent_run_id: str, rows: list[JsonObject]) -> str:
    """The commands that show the sweep again: the whole report (compared against single, or the
    first topology when single did not run; along the first setting that tells its cells apart when
    they share one topology), and the MLflow UI on its store."""
    base = baseline_of(rows)
    compare = f" --compare {base}" if base is not None else ""
    return "\n".join(
        [
            f"full report (comparison, cost, charts): python -m apps_bench.report --sweep {parent_run_id} --tracking-uri {uri}"
            + compare,
            mlflow_ui(uri) + f"   (the sweep's parent run: {parent_run_id})",
        ]
    )


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


def read(uri: str, parent_run_id: str) -> list[JsonObject]:
    """The rows of the parent run's comparison table as logged (for checks and scripts)."""
    import json

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(mlf.client(uri).download_artifacts(parent_run_id, TABLE, tmp))
        table = json.loads(path.read_text(encoding="utf-8"))
    return [dict(zip(table["columns"], row)) for row in table["data"]]
