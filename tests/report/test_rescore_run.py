"""Re-scoring by run id logs beside the run it was given (issue 39, point 7): a real gold cell run alone in
experiment `apps`, then a sweep in experiment `first` that links the same cell (so the cell folder's config
now names `first`), then `rescore <the apps run> judge=reference` through the CLI, against a real SQLite store.
Its result table shows the cell's verdicts and the new ones once each, every column filled, counted here
from the records on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import APPS_DATA_DIR, cli_env, fresh_store, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CELL = [
    "model=gold",
    "dataset=apps",
    f"dataset.path={APPS_DATA_DIR / 'train_mini150.jsonl'}",
    "dataset.split=train",
    "limit=4",
    "model.gold.wrong_fraction=0.5",
    "progress=false",
]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path) -> dict:
    cwd = tmp_path_factory.mktemp("rescore-run")
    db = fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env = cli_env(cwd)
    r = run_cli(["seed=0", *CELL], cwd, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(["-m", "seed=0,1", *CELL, "tracking.experiment=first"], cwd, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    from apps_bench.tracking import mlflow as mlf

    c = mlf.client(f"sqlite:///{db}")
    [cell] = (cwd / "outputs" / "cells").glob("*-s0-*")
    key = json.loads((cell / "cell.json").read_text())["key"]
    runs = {e.name: [r for r in c.search_runs([e.experiment_id], f"tags.cell_key = '{key}'")] for e in c.search_experiments()}
    assert len(runs["apps"]) == 1 and len(runs["first"]) == 1, "the sweep should have linked the cell in its experiment"
    return {"cwd": cwd, "env": env, "client": c, "cell": cell, "run": runs["apps"][0], "copy": runs["first"][0]}


def test_rescoring_a_run_logs_its_child_beside_that_run(store: dict):
    c, run = store["client"], store["run"]
    r = run_cli([run.info.run_id, "judge=reference"], store["cwd"], env=store["env"], module="apps_bench.rescore")
    assert r.returncode == 0, r.stderr[-3000:]
    found = c.search_runs([e.experiment_id for e in c.search_experiments()], "tags.run_kind = 'rescore'")
    assert [(x.info.experiment_id, x.data.tags.get("mlflow.parentRunId"), x.data.tags.get("rescore_of")) for x in found] == [
        (run.info.experiment_id, run.info.run_id, run.info.run_id)
    ], "the re-scoring was filed under another run"
    assert f"(child of {run.info.run_id})" in r.stdout, r.stdout

    # each row once, every column filled: the cell's verdicts and the new ones, over the same recorded programs
    old = [x for x in _lines(store["cell"] / "records.jsonl") if not x["error"]]
    [folder] = (store["cell"] / "rescore").iterdir()
    new = [x for x in _lines(folder / "records.jsonl") if not x["error"]]
    rows = [line.strip("│┃ ").split() for line in r.stdout.splitlines() if line.startswith("│")]
    expected = [
        [
            "the",
            "cell's",
            "seed",
            "20",
            str(len(old)),
            str(sum(x["passed"] for x in old)),
            f"{sum(x['passed'] for x in old) / len(old):.4f}",
        ],
        [
            "re-scored",
            "reference",
            "20",
            str(len(new)),
            str(sum(x["passed"] for x in new)),
            f"{sum(x['passed'] for x in new) / len(new):.4f}",
        ],
    ]
    assert [[w for w in row if w != "│"] for row in rows] == expected, r.stdout


def test_a_run_id_with_another_experiment_is_refused(store: dict):
    run = store["run"]
    r = run_cli(
        [run.info.run_id, "judge=reference", "tracking.experiment=first"],
        store["cwd"],
        env=store["env"],
        module="apps_bench.rescore",
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "logged next to the run it was given" in r.stderr and "experiment 'apps'" in r.stderr, r.stderr
