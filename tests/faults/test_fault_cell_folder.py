"""A cell's folder deleted while the cell runs (#43 point 4), through the real CLI: the cell stops at its next record
with one line saying what happened (not that its lock was taken over, nor that its records are kept: they went
with the folder) and the fix, exit 2, no traceback; the rerun solves the cell again, every problem once."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, run_cli
from faults.process_group import own_group

ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "apps" / "train_mini150.jsonl"
LIMIT = 30
CELL = [
    "allow_any_cell=true",
    "dataset=apps",
    f"dataset.path={ROWS}",
    "dataset.split=train",
    f"limit={LIMIT}",
    "model=gold",
    "model.gold.latency_ms=200",
    "concurrency=1",
    "tracking=none",
    "progress=false",
    "tracking.cell_lock.heartbeat_s=0.2",
]  # a problem a model call of 200 ms: beats between records


def _records(cell: Path) -> list[str]:
    try:
        return [json.loads(x)["key"] for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        return []


@pytest.mark.slow
def test_a_cell_folder_deleted_while_the_cell_runs_is_one_line_and_the_rerun_solves_it(tmp_path: Path):
    with own_group([sys.executable, "-m", "apps_bench", *CELL], tmp_path, cli_env(tmp_path)) as proc:
        cells = tmp_path / "outputs" / "cells"
        deadline = time.monotonic() + 300  # a bound on a hang only: the event is the third record seen
        while proc.poll() is None and time.monotonic() < deadline:
            found = list(cells.glob("*/records.jsonl")) if cells.is_dir() else []
            if found and len(_records(found[0].parent)) >= 3:
                shutil.rmtree(found[0].parent)
                break
            time.sleep(0.05)
        else:
            pytest.fail("the cell never recorded three problems")
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err and "taken over" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("apps-bench: the cell's folder ") and "was deleted while this run wrote to it" in line, err[-3000:]
    assert "rerun the same command" in line and "kept" not in line
    assert not any(cells.iterdir())  # the run wrote nothing more: no folder made again

    again = run_cli(CELL, tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    (cell,) = cells.iterdir()
    keys = _records(cell)
    assert len(keys) == len(set(keys)) == LIMIT
