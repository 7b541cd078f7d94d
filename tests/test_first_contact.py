"""A new user's mistakes, each answered the project's way through the real CLI: exit 2, what was wrong,
the fix (a suggestion that works, never Hydra's `+key`), every bad setting at once, and nothing written
(no cell folder, no MLflow store, no Hydra output folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import fresh_store, run_cli


def _refused(args: list[str], cwd: Path) -> str:
    r = run_cli(args, cwd)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not (cwd / "outputs").exists(), sorted(str(p) for p in (cwd / "outputs").rglob("*"))
    return r.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["topology=singel"], ["topology=singel", "did you mean single", "Fix: topology=single"]),
        (["-m", "topology=single,singel", "seed=0,1"], ["topology=singel", "did you mean single"]),
        (["limt=5"], ["unknown setting", "did you mean limit", "Fix: limit=5"]),
        (["+limt=5"], ["unknown setting", "did you mean limit", "Fix: limit=5"]),
        (["dataset.pth=rows.jsonl"], ["did you mean dataset.path", "Fix: dataset.path=rows.jsonl"]),
        (["limit=abc"], ["limit=abc", "a whole number >= 1", "Fix: limit=50"]),
        (["only=8"], ["only=8", "a list", "Fix: only=[8]"]),
        (["verbose=maybe"], ["verbose=maybe", "true or false"]),
        (["seed=[0,"], ["seed=[0,", "cannot be read as an override"]),
    ],
)
def test_a_misspelt_or_mistyped_override_is_a_bad_setting(args: list[str], words: list[str], tmp_path: Path):
    err = _refused(args, tmp_path)
    for w in words:
        assert w in err, err
    assert "+limt" not in err and "Hydra" not in err


def test_every_bad_setting_is_listed_at_once_type_errors_included(tmp_path: Path):
    err = _refused(["tool.timeout_s=-1", "max_tests_per_row=abc", "concurrency=0"], tmp_path)
    assert "invalid settings, nothing was run" in err
    for key in ("tool.timeout_s=-1", "max_tests_per_row=abc", "concurrency=0"):
        assert f"  {key}:" in err, err


def test_the_demo_reads_no_file(tmp_path: Path, apps_data_dir: Path):
    err = _refused(["dataset=demo", f"dataset.path={apps_data_dir / 'test_more.jsonl'}"], tmp_path)
    assert "reads no file" in err and "Fix: dataset=apps dataset.path=" in err


def test_a_directory_is_not_a_dataset_file(tmp_path: Path):
    (tmp_path / "rows").mkdir()
    err = _refused(["dataset=apps", "dataset.path=rows"], tmp_path)
    assert "is a directory" in err


@pytest.mark.parametrize("shape", ["array", "pretty"])
def test_a_json_document_is_not_json_lines(shape: str, tmp_path: Path, apps_data_dir: Path):
    rows = [json.loads(x) for x in (apps_data_dir / "test_more.jsonl").read_text().splitlines()[:3]]
    data = tmp_path / "data"
    data.mkdir()
    path = data / "rows.json"
    path.write_text(json.dumps(rows) if shape == "array" else json.dumps(rows[0], indent=2))
    err = _refused(["dataset=apps", f"dataset.path={path}"], tmp_path)
    assert "is not JSON Lines (one JSON object per line)" in err, err
    assert "select other rows" not in err


def test_a_malformed_line_is_named_by_its_number_and_still_counts_toward_limit(tmp_path: Path, apps_data_dir: Path):
    lines = (apps_data_dir / "train_mini150.jsonl").read_text().splitlines()[:6]
    lines.insert(2, '{"problem_id": 7, broken')
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    r = run_cli(["dataset=apps", "dataset.path=rows.jsonl", "limit=5", "tracking=none", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "line 3: not a JSON object" in r.stderr, r.stderr[-3000:]
    assert "4 problems" in r.stderr and "count toward limit" in r.stderr
    [cell] = list((tmp_path / "outputs" / "cells").iterdir())
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["dataset"]["rows_skipped"] == ["line 3: not a JSON object"]
    assert len((cell / "records.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize(
    "topology, processes",
    [("sequential_langgraph", "1"), ("centralized_autogen", "2"), ("sequential_crewai", "2")],
)
def test_ctrl_c_mid_cell_prints_the_one_line_and_the_rerun_finishes(
    topology: str, processes: str, tmp_path: Path, apps_data_dir: Path, mlflow_template: Path
):
    """Ctrl-C (SIGINT to the whole group, as a terminal sends it) right after the first record, with
    problems in the middle of their graphs in this process or in solver workers.

    CONCURRENCY + 1 problems: at the first record the other CONCURRENCY - 1 are in their graphs (each model
    call held 200 ms) and one more is at most just starting, so the Ctrl-C always leaves work for the rerun;
    more problems would only wait in the queue. The store is the session's migrated copy: the test is
    about the cell, not about creating a store (tests/tracking/test_sqlite_store.py kills that)."""
    import subprocess

    import kill_at
    from conftest import cli_env

    concurrency = 4
    n = concurrency + 1
    args = [
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "dataset.split=train",
        f"limit={n}",
        f"concurrency={concurrency}",
        f"processes={processes}",
        f"topology={topology}",
        "model.gold.latency_ms=200",
        "progress=false",
    ]
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env = {**cli_env(tmp_path), kill_at.KILL_AT: "record:1:sigint"}
    r = subprocess.run(
        [*kill_at.cli(), *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert r.returncode == 130, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    out = r.stdout + r.stderr
    assert "apps-bench: interrupted. Every problem recorded so far is kept; rerun the same command" in r.stderr
    for noise in ("Traceback", "Exception ignored", "Error", "Task exception", "GeneratorExit"):
        assert noise not in out, f"{noise!r} printed on Ctrl-C:\n{out[-4000:]}"
    [cell] = list((tmp_path / "outputs" / "cells").iterdir())
    kept = [json.loads(x)["key"] for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    assert 1 <= len(kept) < n

    again = run_cli(args, tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{len(kept)} already recorded, {n - len(kept)} to run" in again.stderr
    keys = [json.loads(x)["key"] for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    assert len(keys) == len(set(keys)) == n and set(kept) <= set(keys)


def test_a_file_s_split_is_the_one_the_user_says_and_shows_in_name_keys_and_header(
    tmp_path: Path, apps_data_dir: Path, mlflow_template: Path
):
    rows = apps_data_dir / "train_mini150.jsonl"
    for cwd in (tmp_path, tmp_path / "unsaid"):  # the session's migrated store: the cells log to MLflow as ever
        fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    said = run_cli(["dataset=apps", f"dataset.path={rows}", "dataset.split=train", "limit=2", "progress=false"], tmp_path)
    assert said.returncode == 0, said.stdout[-3000:] + said.stderr[-3000:]
    assert "cell single·gold·none·s0·train [" in said.stderr and " split=train (" in said.stderr
    assert "names the train split" not in said.stderr
    [cell] = list((tmp_path / "outputs" / "cells").iterdir())
    recs = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    assert len(recs) == 2 and all(r["key"].startswith("train/") and r["split"] == "train" for r in recs)
    assert json.loads((cell / "summary.json").read_text())["cell"]["name"] == "single·gold·none·s0·train"

    unsaid = run_cli(["dataset=apps", f"dataset.path={rows}", "limit=2", "progress=false"], tmp_path / "unsaid")
    assert unsaid.returncode == 0, unsaid.stdout[-3000:] + unsaid.stderr[-3000:]
    assert "cell single·gold·none·s0 [" in unsaid.stderr and " split=test (" in unsaid.stderr
    assert "the rows file train_mini150.jsonl names the train split" in unsaid.stderr and "dataset.split=train" in unsaid.stderr
