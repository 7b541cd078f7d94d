"""Cell folders written before the model settings nested (gold's under `model.gold`, the local server's under
`model.local`): their config.yaml holds a flat model section. The fixture is such a folder, written by the
tree before the nesting (`python -m apps_bench model=gold model.wrong_fraction=0.3 limit=1 tracking=none`).
The cell key hashes the flat layout (config.flat_model), so the same cell typed in today's spelling is that
folder: it resumes with nothing to do, and it re-scores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from conftest import compose_cell, run_cli

from apps_bench.cell.key import cell_key, identity_of, resolve_cell

CELL = "demo-single-gold-none-s0-f15a67f410e1"
OLD = Path(__file__).resolve().parent / "fixtures" / "flat_model_cell" / CELL
ARGS = ["model=gold", "model.gold.wrong_fraction=0.3", "limit=1"]


def _old_cell(cwd: Path) -> Path:
    dest = cwd / "outputs" / "cells" / CELL
    shutil.copytree(OLD, dest)
    return dest


def test_a_flat_config_yaml_and_todays_spelling_give_the_old_key():
    data = yaml.safe_load((OLD / "config.yaml").read_text(encoding="utf-8"))
    assert data["model"]["wrong_fraction"] == 0.3 and "gold" not in data["model"]  # the flat layout
    key = json.loads((OLD / "cell.json").read_text(encoding="utf-8"))["key"]
    assert cell_key(identity_of(data)) == key  # read as rescore reads it
    today = resolve_cell(compose_cell(*ARGS))
    assert today.key == key and today.dir_name == CELL
    assert dict(today.identity)["model"] == json.loads((OLD / "cell.json").read_text(encoding="utf-8"))["identity"]["model"]


def test_an_old_cell_folder_resumes_with_nothing_to_solve(tmp_path: Path):
    old = _old_cell(tmp_path)
    records = (old / "records.jsonl").read_bytes()
    r = run_cli([*ARGS, "tracking=none", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "outputs" / "cells").iterdir()] == [CELL]  # no second folder
    assert (old / "records.jsonl").read_bytes() == records  # nothing solved again, nothing lost


def test_an_old_cell_folder_rescores(tmp_path: Path):
    old = _old_cell(tmp_path)
    r = run_cli([str(old), "judge=reference", "--no-mlflow"], tmp_path, module="apps_bench.rescore")
    assert r.returncode == 0, r.stderr
    [out] = (old / "rescore").iterdir()
    rescored = [json.loads(line) for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["key"] for r in rescored] == ["demo/demo-stdin"]
    assert json.loads((out / "cell.json").read_text(encoding="utf-8"))["rescore_of"] == CELL.rsplit("-", 1)[1]
