"""Cells end to end through the real CLI: real Hydra, the gold server over HTTP, the real
LangGraph single runner, the real sandbox and judge, a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import kill_at
import pytest
from conftest import CONF_DIR, cli_env, free_port, fresh_store, run_cli

from apps_bench.judge.profiles import judge_config

pytestmark = pytest.mark.slow


def _mlflow(db: Path):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def _all_runs(db: Path) -> list:
    c = _mlflow(db)
    exps = [e.experiment_id for e in c.search_experiments()]
    return list(c.search_runs(exps)) if exps else []


def _cell_dirs(cwd: Path) -> list[Path]:
    root = cwd / "outputs" / "cells"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def _records(cell: Path) -> list[dict]:
    return [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]


def _summary(cell: Path) -> dict:
    return json.loads((cell / "summary.json").read_text())


# ------------------------------------------------------------------------------- the demo


def test_demo_prints_code_and_per_test_results(tmp_path: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli([], tmp_path)
    out = r.stdout
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert out.count("--- extracted code ---") == 2
    assert "=== problem demo-stdin" in out and "=== problem demo-call" in out
    assert "test 0: pass" in out and "PASSED" in out and "FAILED" not in out
    assert "pass@1" in out and "1.0000" in out
    assert "not an LLM" in r.stderr  # the gold model says what it is
    [cell] = _cell_dirs(tmp_path)
    recs = _records(cell)
    assert sorted(x["id"] for x in recs) == ["demo-call", "demo-stdin"]
    assert all(x["passed"] and x["program"] and x["usage"]["model_calls"] >= 1 for x in recs)
    assert all(x["usage"]["tool_calls"] >= 1 for x in recs)  # gold calls python_exec first
    s = _summary(cell)
    assert s["complete"] and s["pass_at_1"] == 1.0 and s["n_errors"] == 0
    for name in ("config.yaml", "cell.json", "transcripts.jsonl", "prompts.json"):
        assert (cell / name).exists(), name
    [run] = _all_runs(tmp_path / "outputs" / "mlflow.db")
    assert run.info.status == "FINISHED" and run.data.metrics["pass_at_1"] == 1.0
    tags = run.data.tags
    for k in (
        "dataset",
        "topology",
        "model",
        "optimizer",
        "seed",
        "cell_key",
        "judge_profile",
        "dataset_revision",
        "package_version",
        "git_sha",
    ):
        assert k in tags, k
    assert tags["cell_key"] in cell.name and tags["topology"] == "single" and tags["model"] == "gold"
    arts = {a.path for a in _mlflow(tmp_path / "outputs" / "mlflow.db").list_artifacts(run.info.run_id)}
    assert {"records.jsonl", "summary.json", "config.yaml", "transcripts.jsonl", "problems.json"} <= arts

    # a record of a newer apps-bench in the folder: the rerun stops before touching it (never drops or rewrites it)
    lines = (cell / "records.jsonl").read_text().splitlines()
    (cell / "records.jsonl").write_text("\n".join([lines[0].replace('"schema": 1', '"schema": 2'), *lines[1:]]) + "\n")
    before = {f.name: f.read_bytes() for f in cell.iterdir() if f.is_file()}
    again = run_cli([], tmp_path)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert "is records schema version 2" in again.stderr and "Nothing was changed" in again.stderr
    assert {f.name: f.read_bytes() for f in cell.iterdir() if f.is_file()} == before
    assert len(_all_runs(tmp_path / "outputs" / "mlflow.db")) == 1


# ------------------------------------------------------------------------------- multirun


def _check_sweep(db: Path, n_cells: int) -> None:
    runs = _all_runs(db)
    parents = [x for x in runs if x.data.tags.get("sweep") == "true"]
    assert len(parents) == 1, [x.data.tags for x in runs]
    parent = parents[0]
    kids = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(kids) == n_cells and len(runs) == n_cells + 1
    assert parent.info.status == "FINISHED"
    assert all(k.info.status == "FINISHED" and k.data.metrics["pass_at_1"] == 1.0 for k in kids)
    assert sorted(k.data.tags["seed"] for k in kids) == [str(i) for i in range(n_cells)]


def test_multirun_logs_parent_with_children(tmp_path: Path, mlflow_template: Path):
    db = fresh_store(mlflow_template, tmp_path / "store" / "mlflow.db")
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    r = run_cli(["experiment=smoke", "progress=false"], tmp_path, env=env)  # seeds 0,1 declared as data
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _check_sweep(db, 2)
    assert len(_cell_dirs(tmp_path)) == 2
    assert {e.name for e in _mlflow(db).search_experiments()} >= {"smoke"}

    # the report reads the sweep back from MLflow: pass@1 by topology x model over the two seeds
    parent = next(x for x in _all_runs(db) if x.data.tags.get("sweep") == "true").info.run_id
    png = tmp_path / "chart.png"
    rep = run_cli(["--sweep", parent, "--plot", str(png)], tmp_path, env=env, module="apps_bench.report")
    assert rep.returncode == 0, rep.stderr
    row = next(line for line in rep.stdout.splitlines() if line.startswith("single"))
    assert "1.000 [1.000, 1.000] (2s × 2p)" in row and "gold" in rep.stdout  # pooled pass@1 [95% CI] (seeds × problems)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = run_cli(["--experiment", "nope"], tmp_path, env=env, module="apps_bench.report")
    assert missing.returncode == 2 and "no experiment 'nope'" in missing.stderr


@pytest.mark.parametrize("launcher", ["slurm_local", "local_parallel"])
def test_multirun_with_launcher_presets(tmp_path: Path, launcher: str):
    db = tmp_path / "store" / "mlflow.db"  # created by the parent before the workers start
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    r = run_cli(["-m", f"hydra/launcher={launcher}", "seed=0,1", "progress=false"], tmp_path, env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _check_sweep(db, 2)


# ------------------------------------------------------------------------------- resume


def _mini(apps_data_dir: Path) -> str:
    return f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}"


def _runs_in_db(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return con.execute("select count(*) from runs").fetchone()[0]
    except sqlite3.Error:
        return 0


N_KILL = 16
N_BEFORE_KILL = 2


def test_resume_after_kill9(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    args = ["dataset=apps", _mini(apps_data_dir), "dataset.split=train", f"limit={N_KILL}", "concurrency=2", "progress=false"]
    env = cli_env(tmp_path)
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")  # as after a first run
    # the whole cell (CLI, gold server, sandbox workers) SIGKILLed by itself right after its 2nd record, its run open (kill_at.py)
    log = tmp_path / "killed.log"
    with open(log, "w") as out:  # a file, not a pipe: nothing outside the killed group can hold the test up
        proc = subprocess.Popen(
            [*kill_at.cli(), *args],
            cwd=tmp_path,
            env={**env, kill_at.KILL_AT: f"record:{N_BEFORE_KILL}:run"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.wait(timeout=240)
    assert proc.returncode == -signal.SIGKILL, "cell ended before it could be killed:\n" + log.read_text()[-3000:]
    [recs_path] = [d / "records.jsonl" for d in _cell_dirs(tmp_path)]
    first = _records(recs_path.parent)
    assert len(first) == N_BEFORE_KILL
    with open(recs_path, "ab") as f:  # as if the kill had cut a write in half
        f.write(b'{"key": "train/9", "id": "9", "prog')
    [killed_run] = _all_runs(db)

    r = run_cli(args, tmp_path, env=env)  # same cell (latency is run-only)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{len(first)} already recorded, {N_KILL - len(first)} to run" in r.stderr
    recs = _records(recs_path.parent)
    keys = [x["key"] for x in recs]
    assert len(keys) == N_KILL and len(set(keys)) == N_KILL  # all problems, no duplicates
    for old in first:  # what was recorded before the kill was kept, not redone
        assert next(x for x in recs if x["key"] == old["key"])["completed_at"] == old["completed_at"]
    [run] = _all_runs(db)  # the same MLflow run, continued
    assert run.info.run_id == killed_run.info.run_id and run.info.status == "FINISHED"
    assert run.data.metrics["n_recorded"] == N_KILL
    assert _summary(recs_path.parent)["complete"] is True


def test_model_errors_are_recorded_apart_and_retried(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    base = ["dataset=apps", _mini(apps_data_dir), "dataset.split=train", "limit=8", "progress=false"]
    faulty = ["model.gold.fault_fraction=0.5", "model.max_retries=0", "model.request_timeout_s=3"]
    r = run_cli(base + faulty, tmp_path)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]  # recorded, but incomplete
    assert "INCOMPLETE" in r.stdout
    [cell] = _cell_dirs(tmp_path)
    s = _summary(cell)
    errors = {x["key"] for x in _records(cell) if x["error"]}
    assert errors and s["n_errors"] == len(errors) and s["complete"] is False
    assert s["n_problems"] == 8 - len(errors)  # errors are not scored as wrong answers
    assert all(not x["passed"] for x in _records(cell) if x["error"])
    db = tmp_path / "outputs" / "mlflow.db"
    [run] = _all_runs(db)
    assert run.info.status == "FAILED" and run.data.metrics["n_errors"] == len(errors)
    before = {x["key"]: x["completed_at"] for x in _records(cell) if not x["error"]}

    r2 = run_cli(base, tmp_path)  # faults gone (a run-only setting): the same cell
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    assert f"{len(errors)} to run ({len(errors)} retried after errors)" in r2.stderr
    recs = _records(cell)
    assert len(recs) == 8 and not any(x["error"] for x in recs)
    redone = {x["key"] for x in recs if before.get(x["key"]) != x["completed_at"]}
    assert redone == errors  # exactly those problems were retried
    [run2] = _all_runs(db)
    assert run2.info.run_id == run.info.run_id and run2.info.status == "FINISHED"


# ------------------------------------------------------------------------------- failures


def test_unreachable_endpoint_fails_fast(tmp_path: Path):
    env = cli_env(tmp_path, VLLM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1")
    r = run_cli(["model=qwen"], tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "VLLM_BASE_URL" in r.stderr and "Traceback" not in r.stderr  # refused at the endpoint, before any problem
    assert not list((tmp_path / "outputs" / "cells").glob("*/records.jsonl")) or not any(
        _records(p.parent) for p in (tmp_path / "outputs" / "cells").glob("*/records.jsonl")
    )
    assert _all_runs(tmp_path / "outputs" / "mlflow.db") == [] if (tmp_path / "outputs" / "mlflow.db").exists() else True


GOLD_IDS = [str(i) for i in range(0, 12)] + ["33", "2036"] + [str(i) for i in range(2401, 2413)]


def test_gold_model_through_langgraph_reaches_gold_pass_rate(tmp_path: Path, apps_data_dir: Path, mlflow_template: Path):
    """Real APPS rows (stdin and call-based, with known failing references) plus malformed rows,
    through the real CLI, the gold server and the real LangGraph single runner: the cell must
    pass exactly the problems whose first reference solution passes the judge directly, and
    count every malformed row by reason."""
    from apps_bench.config.schema import DatasetConfig
    from apps_bench.data import load_problems
    from apps_bench.judge import Judge
    from apps_bench.sandbox import SandboxPool

    rows = {str(r["problem_id"]): r for r in map(json.loads, (apps_data_dir / "train_mini150.jsonl").read_text().splitlines())}
    good = [rows[i] for i in GOLD_IDS]
    bad = [
        dict(good[0], problem_id=9001, input_output="{not json"),
        dict(good[0], problem_id=9002, input_output=json.dumps({"inputs": [], "outputs": []})),
        dict(good[0], problem_id=9003, input_output=json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["1\n"]})),
        dict(good[0], problem_id=9004, question=""),
    ]
    path = tmp_path / "rows.jsonl"
    mixed = good[:5] + bad[:2] + good[5:] + bad[2:]
    path.write_text("\n".join(json.dumps(r) for r in mixed) + "\n")

    ds = DatasetConfig(
        name="apps", source="hub", hub_repo="codeparrot/apps", revision="local", split="train", path=str(path), streaming=False
    )
    loaded = load_problems(ds, max_tests_per_row=20)
    assert len(loaded.problems) == len(GOLD_IDS) and loaded.n_skipped == 4
    with SandboxPool.from_config(judge_config("seed"), workers=2) as pool:
        judge = Judge.from_config(pool, judge_config("seed"))
        expected = {p.id for p in loaded.problems if judge.score(p, p.solutions[0]).passed}
    assert 20 <= len(expected) < len(GOLD_IDS)  # the known failing references (33, 2036) stay failing

    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["dataset=apps", f"dataset.path={path}", "dataset.split=train", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [cell] = _cell_dirs(tmp_path)
    recs = _records(cell)
    assert len(recs) == len(GOLD_IDS)
    assert {x["id"] for x in recs if x["passed"]} == expected
    assert all(x["usage"]["model_calls"] >= 2 and x["usage"]["tool_calls"] >= 1 for x in recs)  # the tool loop ran
    s = _summary(cell)
    assert s["pass_at_1"] == pytest.approx(len(expected) / len(GOLD_IDS))
    assert {"interview", "introductory"} <= set(s["by_difficulty"])
    assert sum(s["skipped"].values()) == 4 and len(s["skipped"]) >= 3, s["skipped"]  # counted by reason
    assert "rows skipped:" in r.stdout and "rows skipped: 0" not in r.stdout
    [run] = _all_runs(tmp_path / "outputs" / "mlflow.db")
    assert run.data.metrics["n_skipped"] == 4
    assert run.data.metrics["pass_at_1"] == pytest.approx(s["pass_at_1"])


def test_optimizer_cell_optimizes_then_evaluates(
    tmp_path: Path, apps_data_dir: Path, mlflow_template: Path, optimizer_pool_file: Path
):
    """optimizer=maspo through the CLI, inside a sweep, next to its seed cell (optimizer=none).

    MLflow layout: sweep parent -> the optimizer cell's run (step metrics keyed by charged
    rollouts, optimizer artifacts, the final eval's headline, the seed cell's pass@1) -> a
    final-eval child run (a normal cell's metrics and table with the chosen prompts). A rerun
    continues both runs; the chosen prompts file loads and runs in a normal cell."""
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    base = [
        "allow_any_cell=true",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'test_0-49_partial.jsonl'}",
        "judge.workers=2",
        "concurrency=4",
        "progress=false",
    ]
    opt = [
        "optimizer=maspo",
        f"optimizer.params.pool.path={optimizer_pool_file}",
        "optimizer.params.pool.train_size=4",
        "optimizer.params.pool.val_size=2",
        "optimizer.params.budget.rollouts=12",
        "optimizer.params.K=1",
        "optimizer.params.Ksub=1",
        "optimizer.params.T=1",
        "optimizer.params.D=1",
        "optimizer.params.minibatch=2",
    ]
    # the seed prompts' cell, run first so the comparison finds it; through the seed's command form
    seed_r = run_cli(
        [
            "--method",
            "none",
            "--dataset",
            "apps",
            "--topology",
            "single",
            "--model",
            "gold",
            "--seed",
            "0",
            "--allow-any-cell",
            *base[2:],
        ],
        tmp_path,
        module="apps_bench.optimize",
    )
    assert seed_r.returncode == 0, seed_r.stdout[-3000:] + seed_r.stderr[-3000:]
    r = run_cli(["-m", *base, *opt], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "optimizer=maspo chose a prompt set" in r.stderr
    cell = next(c for c in _cell_dirs(tmp_path) if "-maspo-" in c.name)
    seed_cell = next(c for c in _cell_dirs(tmp_path) if "-none-" in c.name)
    for name in ("manifest.json", "events.jsonl", "result.json", "prompts.yaml"):
        assert (cell / "optimizer" / name).exists(), name
    chosen = json.loads((cell / "optimizer" / "result.json").read_text())["chosen"]
    assert json.loads((cell / "prompts.json").read_text()) == chosen  # the evaluated prompts are the chosen ones
    assert sorted(x["id"] for x in _records(cell)) == ["28", "8", "9"]

    def layout():
        runs = {x.info.run_id: x for x in _all_runs(db)}
        [sweep] = [x for x in runs.values() if x.data.tags.get("sweep") == "true"]
        [seed] = [x for x in runs.values() if x.data.tags.get("optimizer") == "none"]
        [opt_run] = [x for x in runs.values() if x.data.tags.get("run_kind") == "optimizer_cell"]
        [final] = [x for x in runs.values() if x.data.tags.get("run_kind") == "final_eval"]
        assert len(runs) == 4, [x.data.tags.get("mlflow.runName") for x in runs.values()]
        return sweep, seed, opt_run, final

    sweep, seed, opt_run, final = layout()
    c = _mlflow(db)
    # the optimizer cell's run: nested in the sweep, the optimization's step metrics and artifacts
    assert opt_run.data.tags["mlflow.parentRunId"] == sweep.info.run_id and opt_run.info.status == "FINISHED"
    steps = [m.step for m in c.get_metric_history(opt_run.info.run_id, "opt/rollouts_charged")]
    assert steps and max(steps) == opt_run.data.metrics["opt/rollouts_charged"] > 0  # step = charged rollouts
    assert "val/chosen_strict" in opt_run.data.metrics and opt_run.data.metrics["opt/rollouts_budget"] == 12
    assert {a.path for a in c.list_artifacts(opt_run.info.run_id, "optimizer")} >= {
        "optimizer/manifest.json",
        "optimizer/events.jsonl",
        "optimizer/prompts.yaml",
        "optimizer/result.json",
    }
    # the final evaluation: a child of the optimizer cell's run, a normal cell's metrics with the chosen prompts
    ft = final.data.tags
    assert ft["mlflow.parentRunId"] == opt_run.info.run_id and final.info.status == "FINISHED"
    assert (ft["optimizer"], ft["topology"], ft["model"], ft["dataset"], ft["seed"]) == ("maspo", "single", "gold", "apps", "0")
    assert (
        "cell_key" not in ft
        and ft["final_eval_of"] == opt_run.data.tags["cell_key"] == json.loads((cell / "summary.json").read_text())["cell"]["key"]
    )
    assert final.data.metrics["pass_at_1"] == pytest.approx(_summary(cell)["pass_at_1"]) and final.data.metrics["n_problems"] == 3
    assert "opt/rollouts_charged" not in final.data.metrics
    assert {"records.jsonl", "problems.json", "prompts.json"} <= {a.path for a in c.list_artifacts(final.info.run_id)}
    assert opt_run.data.tags["final_eval_run_id"] == final.info.run_id
    assert opt_run.data.metrics["pass_at_1"] == final.data.metrics["pass_at_1"]  # the grid report reads the cell's run
    # next to the seed prompts' cell: linked by key, its pass@1 logged and printed
    assert (
        ft["seed_cell_key"]
        == opt_run.data.tags["seed_cell_key"]
        == seed.data.tags["cell_key"]
        == _summary(seed_cell)["cell"]["key"]
    )
    assert opt_run.data.metrics["seed_cell_pass_at_1"] == seed.data.metrics["pass_at_1"]
    line = next(x for x in r.stdout.splitlines() if x.startswith("optimizer cell pass@1"))
    assert f"vs {seed.data.metrics['pass_at_1']:.4f} seed prompts" in line and seed.data.tags["cell_key"] in line

    # a rerun continues the cell's own runs: no new run, both finished again
    again = run_cli([*base, *opt], tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    sweep2, seed2, opt2, final2 = layout()
    assert (opt2.info.run_id, final2.info.run_id) == (opt_run.info.run_id, final.info.run_id)
    assert opt2.info.status == final2.info.status == "FINISHED"

    # the chosen prompt set loads and runs in a normal cell
    normal = run_cli([*base, f"topology.prompt_file={cell / 'optimizer' / 'prompts.yaml'}", "limit=1"], tmp_path)
    assert normal.returncode == 0, normal.stdout[-3000:] + normal.stderr[-3000:]
    ncell = next(c for c in _cell_dirs(tmp_path) if "-none-" in c.name and c != seed_cell)
    assert json.loads((ncell / "prompts.json").read_text()) == chosen and len(_records(ncell)) == 1


def test_gepa_cell_on_a_chain_through_the_cli(
    tmp_path: Path, apps_data_dir: Path, mlflow_template: Path, optimizer_pool_file: Path
):
    """optimizer=gepa on a multi-role topology through the CLI: the optimizer cell's run with
    step metrics, a final-eval child run, and a prompt set a normal cell loads and runs."""
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    base = [
        "allow_any_cell=true",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'test_0-49_partial.jsonl'}",
        "topology=sequential_langgraph",
        "judge.workers=2",
        "concurrency=4",
        "progress=false",
        "limit=2",
    ]
    # the optimizer model is a preset of the user's own config dir: composed with the app's search path
    extra = tmp_path / "my_conf"
    (extra / "model").mkdir(parents=True)
    gold = (CONF_DIR / "model" / "gold.yaml").read_text()
    (extra / "model" / "reflector.yaml").write_text(gold.replace("name: gold", "name: reflector"))
    opt = [
        "optimizer=gepa",
        f"optimizer.params.pool.path={optimizer_pool_file}",
        "optimizer.params.pool.train_size=3",
        "optimizer.params.pool.val_size=2",
        "optimizer.params.budget.rollouts=8",
        "optimizer.params.minibatch=2",
        "optimizer.params.optimizer_model=reflector",
        "--config-dir",
        str(extra),
    ]
    r = run_cli([*base, *opt], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [cell] = [c for c in _cell_dirs(tmp_path) if "-gepa-" in c.name]
    result = json.loads((cell / "optimizer" / "result.json").read_text())
    assert json.loads((cell / "prompts.json").read_text()) == result["chosen"] and len(result["chosen"]) >= 2
    assert result["budget"]["rollouts"] <= 8 + 2  # overshoot at most one minibatch
    assert result["details"]["optimizer_model"]["name"] == "reflector"
    runs = {x.info.run_id: x for x in _all_runs(db)}
    [opt_run] = [x for x in runs.values() if x.data.tags.get("run_kind") == "optimizer_cell"]
    [final] = [x for x in runs.values() if x.data.tags.get("run_kind") == "final_eval"]
    c = _mlflow(db)
    assert c.get_metric_history(opt_run.info.run_id, "opt/rollouts_charged")  # step metrics
    assert final.data.tags["mlflow.parentRunId"] == opt_run.info.run_id and final.info.status == "FINISHED"
    assert final.data.tags["optimizer"] == "gepa" and final.data.tags["topology"] == "sequential_langgraph"
    assert final.data.metrics["pass_at_1"] == pytest.approx(_summary(cell)["pass_at_1"])
    # the chosen prompt set loads and runs in a normal cell of the same topology (one problem: base's limit replaced,
    # as a key given twice is refused)
    one = [a for a in base if not a.startswith("limit=")]
    normal = run_cli([*one, f"topology.prompt_file={cell / 'optimizer' / 'prompts.yaml'}", "limit=1"], tmp_path)
    assert normal.returncode == 0, normal.stdout[-3000:] + normal.stderr[-3000:]
    ncell = next(c for c in _cell_dirs(tmp_path) if "-none-" in c.name)
    assert json.loads((ncell / "prompts.json").read_text()) == result["chosen"] and len(_records(ncell)) == 1


@pytest.mark.parametrize("capacity", [0, 1])
def test_problems_in_flight_never_exceed_what_the_server_answers_at_once(tmp_path, capacity):
    """`model.max_concurrency=1` (a one-request-at-a-time server): problems run one after another
    whatever `concurrency` says, so no problem's time cap is spent queued behind another's calls.
    With no limit (0) the same two problems overlap."""
    r = run_cli(
        [
            "concurrency=8",
            f"++model.max_concurrency={capacity}",
            "model.gold.latency_ms=600",
            "tracking=none",
            "processes=1",
            "progress=false",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (cell,) = (tmp_path / "outputs" / "cells").iterdir()
    summary = _summary(cell)
    assert summary["run"]["concurrency"] == 8 and summary["run"]["problems_in_flight"] == (capacity or 8)
    recs = _records(cell)
    (a0, a1), (b0, b1) = sorted((rec["completed_at"] - rec["latency_s"], rec["completed_at"]) for rec in recs)
    assert len(recs) == 2 and min(a1 - a0, b1 - b0) >= 0.6
    overlap = a1 - b0
    assert (overlap > 0.3) if capacity == 0 else (overlap <= 0.05), (overlap, recs)


def test_a_framework_run_in_the_cells_own_process_does_not_flood_the_console(tmp_path):
    """processes=1 runs AutoGen under Hydra's logging (root at INFO), where autogen_core logs every
    message it routes (518 lines for the two demo problems); conf/config.yaml sets it to WARNING."""
    r = run_cli(["topology=centralized_autogen", "processes=1", "tracking=none", "progress=false"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pass@1" in r.stdout
    (log,) = (tmp_path / "outputs" / "hydra").glob("*/*/apps_bench.log")
    for text in (r.stdout, r.stderr, log.read_text()):
        assert "[autogen_core" not in text and "[autogen_agentchat" not in text
