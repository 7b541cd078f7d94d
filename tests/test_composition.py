"""How the command line composes a cell, through the real CLI: presets of the user's own folder
(`--config-dir`) are selected like packaged ones in a cell, a real multirun, `plan`, `check` and the
report, and one of a packaged preset's name takes its place (and so changes the cell key); a preset
file that does not parse is named with its path and line (exit 2, nothing written); and a job finds
its cell and its store in the launching folder, whatever folder Hydra gives it (`hydra.job.chdir=true`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import APPS_DATA_DIR, CONF_DIR, cli_env, config_dir_preset, fresh_store, run_cli

ROWS = [
    "dataset=apps",
    f"dataset.path={APPS_DATA_DIR / 'train_mini150.jsonl'}",
    "dataset.split=train",
    "limit=3",
    "progress=false",
    "judge.workers=2",
]


def _cells(cwd: Path) -> dict[str, Path]:
    """model (as the folder names it) -> the cell folder, for the cells of one topology, optimizer and seed."""
    root = cwd / "outputs" / "cells"
    return {p.name.split("-")[2]: p for p in sorted(root.iterdir())} if root.is_dir() else {}


def _records(cell: Path) -> list[dict]:
    return [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]


def _plan(args: list[str], cwd: Path) -> list[dict]:
    r = run_cli([*args, "--json", "-"], cwd, module="apps_bench.plan")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout)["cells"]


def _model_tags(db: Path) -> dict[str, str]:
    """run name -> its `model` tag, for every run of the store that has one."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_name: r.data.tags["model"] for r in client.search_runs(exps) if "model" in r.data.tags}


def test_config_dir_presets_in_a_sweep_plan_and_report(tmp_path: Path, mlflow_template: Path):
    """A new preset (`defaults: [gold, _self_]`) and an overlay of the packaged gold (every answer
    wrong) in one real multirun: each cell runs its own preset and is named by it, the overlay takes
    effect (0 of 3 passed, where the packaged gold passes 3 of 3) under a key of its own, and plan and
    report accept the presets as they accept packaged ones."""
    mine = config_dir_preset(tmp_path / "my_conf", "goldslow", "gold", **{"gold.latency_ms": 1})
    gold = (CONF_DIR / "model" / "gold.yaml").read_text()
    assert "wrong_fraction: 0.0" in gold
    (mine / "model" / "gold.yaml").write_text(gold.replace("wrong_fraction: 0.0", "wrong_fraction: 1.0"))
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    sweep = ["--config-dir", str(mine), "model=gold,goldslow", "allow_any_cell=true", *ROWS]

    planned = _plan(["-m", *sweep], tmp_path)
    assert [(c["axes"]["model"], c["state"]) for c in planned] == [("gold", "new"), ("goldslow", "new")]
    packaged = _plan([*ROWS, "model=gold"], tmp_path)  # the packaged gold's cell, for the same rows
    assert packaged[0]["key"] != planned[0]["key"]  # the overlay's wrong_fraction is part of its cell's identity

    r = run_cli(["-m", *sweep], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cells = _cells(tmp_path)
    assert set(cells) == {"gold", "goldslow"}
    assert {m: c.name.rsplit("-", 1)[1] for m, c in cells.items()} == {c["axes"]["model"]: c["key"] for c in planned}
    for model, cell in cells.items():
        records = _records(cell)
        assert len(records) == 3 and not any(rec["passed"] for rec in records), (model, records)
    assert re.search(r"latency_ms: 1\b", (cells["goldslow"] / "config.yaml").read_text())
    tags = _model_tags(db)
    assert {"gold", "goldslow"} <= set(tags.values())
    assert all(("goldslow" in name) == (model == "goldslow") for name, model in tags.items())

    assert [c["state"] for c in _plan(["-m", *sweep], tmp_path)] == ["done", "done"]  # found again, not new
    report = run_cli(
        ["--cells-dir", str(tmp_path / "outputs" / "cells"), "--model", "goldslow", "--config-dir", str(mine)],
        tmp_path,
        module="apps_bench.report",
    )
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert "goldslow" in report.stdout and "0.000" in report.stdout


@pytest.mark.parametrize("module,multirun", [("apps_bench", False), ("apps_bench", True), ("apps_bench.plan", False)])
def test_a_preset_file_that_does_not_parse_is_named_with_its_line(tmp_path: Path, module: str, multirun: bool):
    mine = config_dir_preset(tmp_path / "my_conf", "goldslow", "gold")
    path = mine / "model" / "goldslow.yaml"
    path.write_text(path.read_text() + "latency_ms: [5\nwrong_fraction: 0\n")
    line = len(path.read_text().splitlines())  # where YAML finds the unclosed list's end missing
    args = ["--config-dir", str(mine), "model=goldslow,gold" if multirun else "model=goldslow", "allow_any_cell=true", *ROWS]
    r = run_cli(["-m", *args] if multirun else args, tmp_path, module=module)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"model=goldslow: the preset's file does not parse: {path}, line {line}," in r.stderr, r.stderr
    assert f"Fix: correct line {line} of {path}" in r.stderr
    assert "no such model" not in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_broken_overlay_of_the_default_preset_is_named_too(tmp_path: Path):
    """DIR/model/gold.yaml replaces the gold every cell runs by default: checked without `model=` on the line."""
    mine = tmp_path / "my_conf"
    (mine / "model").mkdir(parents=True)
    path = mine / "model" / "gold.yaml"
    path.write_text((CONF_DIR / "model" / "gold.yaml").read_text().replace("max_tokens: 4096", "max_tokens: {4096"))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("max_tokens:"))
    r = run_cli(["--config-dir", str(mine), *ROWS], tmp_path)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"model=gold: the preset's file does not parse: {path}, line " in r.stderr and "Traceback" not in r.stderr
    assert f"(while parsing a flow mapping at line {line})" in r.stderr, r.stderr  # where the unclosed `{` is
    assert not (tmp_path / "outputs").exists()


def test_the_server_check_takes_a_config_dir_preset(tmp_path: Path):
    mine = config_dir_preset(tmp_path / "my_conf", "goldslow", "gold", **{"gold.latency_ms": 1})
    r = run_cli(["--config-dir", str(mine), "model=goldslow", "server_check.quick=true"], tmp_path, module="apps_bench.check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "verdict: PASS" in r.stdout


def test_a_job_in_the_folder_hydra_gives_it_finds_the_same_cell(tmp_path: Path, mlflow_template: Path):
    """`hydra.job.chdir=true` (a run, and a multirun's job) resumes the cell recorded without it: no problem
    solved again, the same MLflow run, no second cell folder or store under outputs/hydra or outputs/multirun."""
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    first = run_cli(ROWS, tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "3 problems, 0 already recorded, 3 to run" in first.stderr
    [run_id] = re.findall(r"MLflow run: (\w+)", first.stdout)
    [cell] = _cells(tmp_path).values()
    before = (cell / "records.jsonl").read_text()

    for extra in (["hydra.job.chdir=true"], ["-m", "hydra.job.chdir=true", "seed=0"]):
        again = run_cli([*extra, *ROWS], tmp_path, env=cli_env(tmp_path))
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "3 problems, 3 already recorded, 0 to run" in again.stderr, again.stderr[-3000:]
        assert re.findall(r"MLflow run: (\w+)", again.stdout) == [run_id]
    assert list(_cells(tmp_path).values()) == [cell] and (cell / "records.jsonl").read_text() == before
    assert sorted(tmp_path.rglob("records.jsonl")) == sorted(
        [cell / "records.jsonl", *tmp_path.glob("mlruns/*/*/artifacts/records.jsonl")]
    )
    assert sorted(tmp_path.rglob("mlflow.db")) == [tmp_path / "outputs" / "mlflow.db"]


def test_hydra_searchpath_presets_are_selectable_and_a_shadowed_one_is_refused(tmp_path: Path):
    """A folder on `hydra.searchpath` adds presets as `--config-dir` does; but Hydra searches it after the
    package's conf/, so a file there of a packaged name would never run: refused, pointing to --config-dir."""
    mine = config_dir_preset(tmp_path / "searched", "goldsp", "gold", **{"gold.latency_ms": 1})
    searchpath = f"hydra.searchpath=[file://{mine}]"
    [cell] = _plan([searchpath, "model=goldsp", "allow_any_cell=true", *ROWS], tmp_path)
    assert cell["axes"]["model"] == "goldsp" and "-goldsp-" in cell["dir"]
    r = run_cli([searchpath, "model=goldsp", "allow_any_cell=true", "tracking=none", *ROWS], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [c.name.rsplit("-", 1)[1] for c in _cells(tmp_path).values()] == [cell["key"]]

    (mine / "model" / "gold.yaml").write_text((CONF_DIR / "model" / "gold.yaml").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shadowed = run_cli([searchpath, "model=goldsp", "allow_any_cell=true", "tracking=none", *ROWS], elsewhere)
    assert shadowed.returncode == 2, shadowed.stdout[-3000:] + shadowed.stderr[-3000:]
    assert f"{mine / 'model' / 'gold.yaml'} has the name of the packaged model=gold" in shadowed.stderr
    assert f"Fix: --config-dir {mine} (searched first)" in shadowed.stderr and "Traceback" not in shadowed.stderr
    assert not (elsewhere / "outputs").exists()


def test_compose_searches_the_config_dir_first_and_names_the_option_selected(tmp_path: Path):
    """In-process (plan, check and the optimizer's model preset compose this way): the preset of the folder
    entered, named by its file although it inherits `name: gold`; the folder is searched only while entered."""
    from hydra.errors import MissingConfigException

    from apps_bench.config.schema import compose, config_dirs

    mine = config_dir_preset(tmp_path / "my_conf", "goldslow", "gold", **{"gold.latency_ms": 7})
    with config_dirs([str(mine)]):
        cfg = compose(["model=goldslow", "topology=independent"])
    assert (cfg.model.name, cfg.model.provider, cfg.model.gold.latency_ms, cfg.topology.name) == (
        "goldslow",
        "gold",
        7,
        "independent",
    )
    with pytest.raises(MissingConfigException):
        compose(["model=goldslow"])
