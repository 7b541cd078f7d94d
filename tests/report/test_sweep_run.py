"""The sweep's comparison on its parent run (apps_bench/report/sweep_run.py): a real gold sweep
through the real CLI into a real SQLite store; the parent's table artifact must hold the report's
rows, which must match the cells' records on disk; cells started by hand publish with report --publish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, gold_sweep, run_cli

from apps_bench.report import sweep_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _parent(uri: str):
    from apps_bench.tracking import mlflow as mlf

    c = mlf.client(uri)
    exp = c.get_experiment_by_name("apps")
    [p] = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("sweep") == "true"]
    return p


def _pooled_from_disk(cwd: Path) -> dict[str, float]:
    """topology -> passed share over every (problem, seed) of the cells' records.jsonl."""
    out: dict[str, list[float]] = {}
    for d in (cwd / "outputs" / "cells").iterdir():
        topo = json.loads((d / "cell.json").read_text())["axes"]["topology"]
        for line in (d / "records.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if not rec["error"]:
                out.setdefault(topo, []).append(float(rec["passed"]))
    return {t: sum(v) / len(v) for t, v in out.items()}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("sweep")
    return {"cwd": cwd, "uri": gold_sweep(cwd, apps_data_dir, template=mlflow_template)}


def test_the_parent_run_holds_the_reports_table_and_plot(sweep: dict, tmp_path: Path):
    from apps_bench.report import cells, groups, render
    from apps_bench.tracking import mlflow as mlf

    uri, cwd = sweep["uri"], sweep["cwd"]
    parent = _parent(uri)
    rows = sweep_run.read(uri, parent.info.run_id)
    report_rows = render.pass_rows(groups.group_cells(cells.select(cells.from_mlflow(sweep=parent.info.run_id, uri=uri))))
    assert rows == report_rows
    assert {(r["topology"], r["model"], r["seeds"], r["n_problems"]) for r in rows} == {
        ("single", "gold", "0,1", 5), ("sequential_langgraph", "gold", "0,1", 5)}  # fmt: skip
    disk = _pooled_from_disk(cwd)
    assert {r["topology"]: r["pass_at_1"] for r in rows} == pytest.approx(disk)
    assert all(r["ci_low"] <= r["pass_at_1"] <= r["ci_high"] for r in rows)

    # the same numbers as the report's command prints
    r = run_cli(["--sweep", parent.info.run_id, "--tracking-uri", uri], cwd, module="apps_bench.report")
    assert r.returncode == 0, r.stderr[-2000:]
    for row in rows:
        assert f"{row['pass_at_1']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] (2s × 5p)" in r.stdout

    c = mlf.client(uri)
    names = {f.path: f for f in c.list_artifacts(parent.info.run_id)}
    assert {sweep_run.TABLE, sweep_run.TEXT, sweep_run.FIGURE} <= set(names)
    assert names[sweep_run.FIGURE].file_size > 5000
    png = Path(c.download_artifacts(parent.info.run_id, sweep_run.FIGURE, str(tmp_path)))
    from matplotlib import image

    img = image.imread(str(png))
    assert img.shape[0] >= 150 and img.shape[1] >= 400 and float(img[..., :3].std()) > 0.05
    # MLflow's UI lists it as a table artifact (log_table's tag), and the leader is a tag of the run
    logged = json.loads(c.get_run(parent.info.run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": sweep_run.TABLE, "type": "table"} in logged
    tags = c.get_run(parent.info.run_id).data.tags
    assert tags["comparison_cells"] == "4"
    best = max(r["pass_at_1"] for r in rows)
    assert tags["comparison_leader"].endswith(f"({best:.3f})")


def test_children_carry_the_axes_as_tags(sweep: dict):
    from apps_bench.tracking import mlflow as mlf

    kids = mlf.child_runs(sweep["uri"], _parent(sweep["uri"]).info.run_id)
    axes = {(k.data.tags["topology"], k.data.tags["model"], k.data.tags["seed"], k.data.tags["dataset"],
             k.data.tags["optimizer"]) for k in kids}  # fmt: skip
    assert axes == {(t, "gold", s, "apps", "none") for t in ("single", "sequential_langgraph") for s in ("0", "1")}


def test_cells_started_by_hand_under_a_parent_leave_publishing_to_report_publish(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
):
    """Cells started by hand under a parent run (no launching process sees their end): each logs
    only its own run; `report --sweep ID --publish` writes the comparison over all of them."""
    from apps_bench.tracking import mlflow as mlf

    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    uri = f"sqlite:///{db}"
    _, parent, _ = mlf.start_parent_run(experiment="apps", run_name="sweep·by hand", tags={}, uri=uri)
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=uri, APPS_BENCH_PARENT_RUN_ID=parent)
    common = ["model=gold", "dataset=apps", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}", "limit=3", "progress=false"]
    for topology in ("single", "sequential_langgraph"):
        r = run_cli([f"topology={topology}", *common], tmp_path, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert sweep_run.TABLE not in {f.path for f in mlf.client(uri).list_artifacts(parent)}  # a cell never publishes
    pub = run_cli(["--sweep", parent, "--publish"], tmp_path, env=env, module="apps_bench.report")
    assert pub.returncode == 0, pub.stderr[-3000:]
    assert sorted((x["topology"], x["n_seeds"], x["n_problems"]) for x in sweep_run.read(uri, parent)) == [
        ("sequential_langgraph", 1, 3), ("single", 1, 3)]  # fmt: skip
    assert mlf.client(uri).get_run(parent).data.tags["comparison_cells"] == "2"


def test_concurrent_writers_leave_a_whole_table(sweep: dict):
    """Three processes rewrite the same parent's comparison at once: the table is complete and
    equal to what one writer alone produces (last writer wins; no torn or appended rows)."""
    uri = sweep["uri"]
    parent = _parent(uri).info.run_id
    code = "import sys; from apps_bench.report.sweep_run import publish; publish(sys.argv[1], sys.argv[2])"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("APPS_BENCH_PARENT_RUN_ID", None)
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, parent], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]  # fmt: skip
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    rows = sweep_run.read(uri, parent)
    assert len(rows) == 2 and rows == sweep_run.publish(uri, parent)
