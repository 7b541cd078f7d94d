"""A sweep's members: the cells it names, recorded on its parent run, found by their cell keys.

MLflow's `mlflow.parentRunId` tag holds one parent, so it cannot say that a cell run belongs to a
sweep launched after the cell first ran (alone, or in another sweep), nor to two sweeps. The
parent run therefore records its member cells as data (`sweep_cells.json`: the key, name and
overrides of every cell, written when the sweep starts, before any cell runs), and a sweep's cell
runs are, for each member key, the run that key finds in the experiment (the same lookup a
resuming cell makes: its latest run that is not a re-scoring), whichever sweep created it.

`mlflow.parentRunId` is kept for MLflow's UI: a cell run without a parent is nested under the
first sweep that includes it; a run already nested under an earlier sweep stays there, and both
sweeps list it (each finds it by its key). A parent without a member list (made before member
lists, or by hand for cells started under it) falls back to its nested children.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

ARTIFACT = "sweep_cells.json"


@dataclass(frozen=True)
class Member:
    key: str
    name: str
    overrides: str  # the cell's overrides on the sweep's command line: how to run it again

    def describe(self) -> str:
        return f"{self.name} [{self.overrides}]"


def record(c: MlflowClient, parent_run_id: str, members: Iterable[Member]) -> None:
    """Write the member list on the parent run (whole: a rerun of the same sweep writes the same list)."""
    c.log_dict(parent_run_id, {"cells": [asdict(m) for m in members]}, ARTIFACT)


def read(c: MlflowClient, parent_run_id: str) -> list[Member] | None:
    """The parent's member list; None when it has none (see the module's docstring)."""
    if ARTIFACT not in {f.path for f in c.list_artifacts(parent_run_id)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(c.download_artifacts(parent_run_id, ARTIFACT, tmp))
        data = json.loads(path.read_text(encoding="utf-8"))
    return [Member(**m) for m in data["cells"]]


def cell_run(c: MlflowClient, experiment_id: str, key: str) -> Run | None:
    """The run a cell key finds: its latest run that is not a re-scoring (as `CellRun.open` resumes it)."""
    found = c.search_runs(
        [experiment_id], filter_string=f"tags.cell_key = '{key}'", order_by=["attributes.start_time DESC"], max_results=20
    )
    return next((r for r in found if r.data.tags.get("run_kind") != "rescore"), None)


def member_runs(
    c: MlflowClient, parent_run_id: str, members: list[Member] | None = None
) -> tuple[list[Member] | None, dict[str, Run]]:
    """(member list or None, member key -> its run) of a sweep; a member without a run is absent
    from the dict. `members`: the list when the caller has it (the launching process, which wrote it:
    no artifact download, which MLflow cannot do at interpreter exit); else it is read from the parent.
    Without a member list: the parent's nested children, by their keys."""
    parent = c.get_run(parent_run_id)
    exp = parent.info.experiment_id
    members = members if members is not None else read(c, parent_run_id)
    if members is None:
        kids = c.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=5000)
        return None, {r.data.tags.get("cell_key", r.info.run_id): r for r in kids}
    runs: dict[str, Run] = {}
    for m in members:
        r = cell_run(c, exp, m.key)
        if r is not None:
            runs[m.key] = r
    return members, runs
