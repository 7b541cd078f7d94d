"""Cell folders an older tree wrote (b38b3ea, tests/fixtures/cells/make_old_cells.py) still resume and re-score:
its command, rerun by this code, finds the folder (the same key), keeps its records byte for byte and solves only
what is missing; re-scoring it under another judge gives the verdicts that tree gave, in a folder of the same key.
One agent and a four-role pipeline, on the two demo problems (stdin and call-based), gold with wrong answers."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli_env, run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cells"
OLD = FIXTURES / "b38b3ea"
RESCORED = json.loads((OLD / "rescored.json").read_text(encoding="utf-8"))


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cases = sys.modules.get("cell_key_cases") or _load("cell_key_cases", FIXTURES / "make_keys.py")
identity = _load("record_identity", REPO / "benchmarks" / "record_identity.py")  # the one list of timing fields


def _old_cell(case) -> Path:
    (folder,) = [p for p in OLD.iterdir() if p.is_dir() and f"-{case.settings['topology']}-" in p.name]
    return folder


def _copy(case, tmp_path: Path) -> Path:
    old = _old_cell(case)
    dest = tmp_path / "outputs" / "cells" / old.name
    shutil.copytree(old, dest)
    return dest


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("case", cases.OLD_CELLS, ids=lambda c: c.id)
def test_an_older_interrupted_cell_resumes_solving_only_what_it_lacks(case, tmp_path: Path):
    cell = _copy(case, tmp_path)
    old_records, old_transcripts = _lines(cell / "records.jsonl"), _lines(cell / "transcripts.jsonl")
    assert len(old_records) == 1  # stopped after its first problem

    proc = run_cli(case.overrides(), tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert [p.name for p in cell.parent.iterdir()] == [cell.name]  # the same cell: no new folder
    assert re.search(r"\b1 already recorded, 1 to run\b", proc.stdout + proc.stderr), proc.stdout[-2000:]
    records = _lines(cell / "records.jsonl")
    assert records[:1] == old_records and _lines(cell / "transcripts.jsonl")[:1] == old_transcripts  # byte for byte
    new = [json.loads(x) for x in records[1:]]
    old = json.loads(old_records[0])
    assert len(new) == 1 and {old["key"], new[0]["key"]} == {"demo/demo-call", "demo/demo-stdin"}
    assert new[0]["cell"] == old["cell"] == cell.name.rsplit("-", 1)[1]

    again = run_cli(case.overrides(), tmp_path)  # complete now: nothing solved twice
    assert again.returncode == 0, again.stderr[-2000:]
    assert _lines(cell / "records.jsonl") == records


@pytest.mark.parametrize("case", cases.OLD_CELLS, ids=lambda c: c.id)
def test_an_older_cell_is_rescored_with_the_verdicts_the_older_code_gave(case, tmp_path: Path):
    cell = _copy(case, tmp_path)
    before = {f.name: f.read_bytes() for f in cell.iterdir()}
    want = RESCORED["cells"][cell.name]

    proc = subprocess.run(
        [sys.executable, "-m", "apps_bench.rescore", str(cell), *RESCORED["args"]],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == want["exit"] == 3, proc.stderr[-2000:]  # an interrupted cell stays incomplete
    assert {f.name: f.read_bytes() for f in cell.iterdir() if f.is_file()} == before  # never overwritten
    (out,) = (cell / "rescore").iterdir()
    assert out.name == want["folder"]  # the key the older code gave these judge settings
    got = {r["key"]: {"passed": r["passed"], "verdict": r["verdict"]} for r in map(json.loads, _lines(out / "records.jsonl"))}
    assert identity.masked(got) == identity.masked(want["verdicts"])
    assert {v["verdict"]["profile"] for v in got.values()} == {"reference"}
