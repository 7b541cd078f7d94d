"""A sweep's cell fails because of its surroundings (#43): the tracking store lost while a cell of a
multi-cell sweep runs, through the real CLI against a real `mlflow server` behind a proxy that dies at a
chosen request.

The sweep stops with one line (what failed, that the records are safe, the fix) and exit 2, never Hydra's
traceback; its parent run is ended as any sweep that did not reach its end; the rerun solves only what is
not recorded and logs every cell.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
from conftest import cli_env, mlflow_server, run_cli
from faults.http_proxy import DyingProxy, Request

SWEEP = ["-m", "seed=0,1", "model=gold", "dataset=demo", "progress=false"]


def _records(cwd: Path) -> dict[str, list[str]]:
    return {c.name: [json.loads(x)["key"] for x in (c / "records.jsonl").read_text().splitlines() if x.strip()]
            for c in sorted((cwd / "outputs" / "cells").iterdir())}  # fmt: skip


def _first_cell_logs() -> Callable[[Request], bool]:
    """Dies at the first request the first cell sends after its run is created (the parent's run is the first
    created): the store goes away while that cell runs."""
    created = [0]

    def dies(request: Request) -> bool:
        if request.path.endswith("/runs/create"):
            created[0] += 1
            return False
        return created[0] == 2 and request.method == "POST"

    return dies


@pytest.mark.slow
def test_a_store_lost_while_a_cell_of_a_sweep_runs_is_one_line_and_the_rerun_logs_it(tmp_path: Path):
    from mlflow import MlflowClient

    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as uri:
        with DyingProxy(uri, _first_cell_logs()).running() as proxy:
            r = run_cli(SWEEP, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=proxy.url), timeout=600)
            assert proxy.dead.is_set()
        out = r.stdout + r.stderr
        assert r.returncode == 2, out[-4000:]
        assert "Traceback" not in out and "Error executing job" not in out, out[-4000:]
        said = [line for line in r.stderr.splitlines() if line.startswith("apps-bench: ") and "does not answer" in line]
        # the first cell's line (its records all safe, only its run waits; or the sweep stops with it), and the
        # sweep stopped once, by a cell, in one line: nothing said again as its parent run ends
        assert 1 <= len(said) <= 2 and said[-1] == r.stderr.strip().splitlines()[-1], r.stderr[-3000:]
        assert "does not answer" in said[-1] and "The sweep stops here" in said[-1], said[-1]
        assert sum("The sweep stops here" in line for line in said) == 1
        first = _records(tmp_path)
        assert all(len(keys) == len(set(keys)) for keys in first.values())

        again = run_cli(SWEEP, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), timeout=600)
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        records = _records(tmp_path)
        assert len(records) == 2 and all(sorted(k) == sorted(set(k)) and len(k) == 2 for k in records.values())
        for name, keys in first.items():
            assert set(keys) <= set(records[name])  # nothing computed is lost
        c = MlflowClient(tracking_uri=uri)
        runs = c.search_runs([c.get_experiment_by_name("apps").experiment_id])
        cells = [x for x in runs if x.data.tags.get("cell_key")]
        parents = sorted((x for x in runs if x.data.tags.get("sweep") == "true"), key=lambda x: x.info.start_time)
        assert len(cells) == 2 and all(x.info.status == "FINISHED" for x in cells)
        assert [x.info.status for x in parents][-1] == "FINISHED"
