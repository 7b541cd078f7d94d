"""The sweep's comparison on its parent run (apps_bench/report/sweep_run.py): a real gold sweep
through the real CLI into a real SQLite store; the parent's table artifact must hold the report's
rows, which must match the cells' records on disk; cells started by hand publish with report --publish."""

from __future__ import annotations

import json
import math
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
    return {
        t: sum(v for vs in by.values() for v in vs.values()) / sum(len(vs) for vs in by.values())
        for t, by in _outcomes_from_disk(cwd).items()
    }


def _outcomes_from_disk(cwd: Path) -> dict[str, dict[str, dict[str, float]]]:
    """topology -> problem key -> seed -> passed (0/1), judged problems only, from the cells' records.jsonl."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for d in (cwd / "outputs" / "cells").iterdir():
        axes = json.loads((d / "cell.json").read_text())["axes"]
        for line in (d / "records.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if not rec["error"]:
                out.setdefault(axes["topology"], {}).setdefault(rec["key"], {})[str(axes["seed"])] = float(rec["passed"])
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("sweep")
    # wrong answers, so the topologies' outcomes differ problem by problem and the paired figures are not all 0
    return {"cwd": cwd, "uri": gold_sweep(cwd, apps_data_dir, "model.gold.wrong_fraction=0.4", template=mlflow_template)}


def test_the_parent_run_holds_the_reports_table_and_plot(sweep: dict, tmp_path: Path):
    from apps_bench.report import cells, groups, render
    from apps_bench.tracking import mlflow as mlf

    uri, cwd = sweep["uri"], sweep["cwd"]
    parent = _parent(uri)
    rows = sweep_run.read(uri, parent.info.run_id)
    report_rows = render.pass_rows(groups.group_cells(cells.select(cells.from_mlflow(sweep=parent.info.run_id, uri=uri))))
    assert [{k: r[k] for k in sweep_run.PASS_COLUMNS} for r in rows] == report_rows
    assert {(r["topology"], r["model"], r["seeds"], r["n_problems"]) for r in rows} == {
        ("single", "gold", "0,1", 5),
        ("sequential_langgraph", "gold", "0,1", 5),
    }
    disk = _pooled_from_disk(cwd)
    assert {r["topology"]: r["pass_at_1"] for r in rows} == pytest.approx(disk)
    assert all(r["ci_low"] <= r["pass_at_1"] <= r["ci_high"] for r in rows)

    # the same numbers as the report's command prints
    r = run_cli(
        ["--sweep", parent.info.run_id, "--tracking-uri", uri, "--compare", "baseline=single"], cwd, module="apps_bench.report"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for row in rows:
        assert f"{row['pass_at_1']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] (2s × 5p)" in r.stdout
    [seq] = [x for x in rows if x["topology"] == "sequential_langgraph"]
    [line] = [x for x in r.stdout.splitlines() if x.startswith("gold") and x.split()[1:3] == ["sequential_langgraph", "single"]]
    assert line.split()[3:7] == [
        f"{seq['delta_pass_at_1']:+.3f}",
        f"[{seq['delta_ci_low']:+.3f},",
        f"{seq['delta_ci_high']:+.3f}]",
        f"{seq['wins']:.0f}/{seq['losses']:.0f}",
    ], line

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


def _mcnemar(b: int, c: int) -> float:
    """Exact two-sided McNemar: the binomial test of b successes in b + c trials at 1/2."""
    n = b + c
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)


def test_the_parent_run_holds_the_paired_differences_and_the_figures_as_metrics(sweep: dict):
    """Each row of the parent's table carries its paired difference against single (recomputed here from
    the records), and the parent's metrics are the table's figures, one per row, readable by name."""
    from apps_bench.tracking import mlflow as mlf

    uri = sweep["uri"]
    parent = _parent(uri)
    rows = {r["topology"]: r for r in sweep_run.read(uri, parent.info.run_id)}
    disk = _outcomes_from_disk(sweep["cwd"])
    seq, base = disk["sequential_langgraph"], disk["single"]
    assert seq.keys() == base.keys() and len(seq) == 5
    diffs = [sum(seq[k].values()) / len(seq[k]) - sum(base[k].values()) / len(base[k]) for k in seq]
    wins = sum(seq[k][s] == 1 and base[k][s] == 0 for k in seq for s in seq[k])
    losses = sum(seq[k][s] == 0 and base[k][s] == 1 for k in seq for s in seq[k])
    assert (wins, losses) != (0, 0), "the wrong answers made no difference between the topologies"
    r = rows["sequential_langgraph"]
    assert r["baseline"] == "single" and r["not_compared"] is None
    assert r["delta_pass_at_1"] == pytest.approx(sum(diffs) / len(diffs))
    assert r["delta_ci_low"] <= r["delta_pass_at_1"] <= r["delta_ci_high"]
    assert (r["wins"], r["losses"]) == (wins, losses)
    assert r["mcnemar_p"] == pytest.approx(_mcnemar(wins, losses)) and r["holm_p"] == pytest.approx(r["mcnemar_p"])
    b = rows["single"]  # the baseline's own row: nothing to pair with
    assert b["baseline"] == "single" and all(b[k] is None for k in ("delta_pass_at_1", "wins", "mcnemar_p", "not_compared"))

    # the APPS paper's figures per tier: strict accuracy recomputed from the records' difficulty, seeds pooled
    tiers: dict[str, list[float]] = {}
    for d in (sweep["cwd"] / "outputs" / "cells").iterdir():
        if json.loads((d / "cell.json").read_text())["axes"]["topology"] == "sequential_langgraph":
            for rec in map(json.loads, (d / "records.jsonl").read_text().splitlines()):
                if not rec["error"]:
                    for t in (rec["difficulty"], "all"):
                        tiers.setdefault(t, []).append(float(rec["passed"]))
    assert len(tiers) >= 2, tiers
    for t in ("introductory", "interview", "competition", "all"):
        want = sum(tiers[t]) / len(tiers[t]) if t in tiers else None
        assert r[f"strict_accuracy_{t}"] == (pytest.approx(want) if want is not None else None), t
        if want is not None:  # the fraction of tests passed is at least the fraction of problems that pass them all
            assert want - 1e-9 <= r[f"test_case_average_{t}"] <= 1.0, t
    assert r["strict_accuracy_all"] == pytest.approx(r["pass_at_1"])
    assert isinstance(r["test_case_average_lower_bound"], bool)  # report/tiers.py's flag, its own tests check when

    metrics = mlf.client(uri).get_run(parent.info.run_id).data.metrics
    expected = {}
    for t, row in rows.items():
        expected |= {
            f"pass_at_1/{t} gold": row["pass_at_1"],
            f"pass_at_1_ci_low/{t} gold": row["ci_low"],
            f"pass_at_1_ci_high/{t} gold": row["ci_high"],
        }
    expected |= {
        "delta_vs_single/sequential_langgraph gold": r["delta_pass_at_1"],
        "delta_ci_low_vs_single/sequential_langgraph gold": r["delta_ci_low"],
        "delta_ci_high_vs_single/sequential_langgraph gold": r["delta_ci_high"],
        "mcnemar_p_vs_single/sequential_langgraph gold": r["mcnemar_p"],
        "holm_p_vs_single/sequential_langgraph gold": r["holm_p"],
    }
    assert metrics == pytest.approx(expected)
    assert metrics["pass_at_1/single gold"] == pytest.approx(_pooled_from_disk(sweep["cwd"])["single"])
    # the text artifact holds the comparison too
    text = Path(mlf.client(uri).download_artifacts(parent.info.run_id, sweep_run.TEXT, str(sweep["cwd"] / "dl"))).read_text()
    assert "paired comparison against the baseline" in text and f"{r['delta_pass_at_1']:+.3f}" in text


def test_children_carry_the_axes_as_tags(sweep: dict):
    from apps_bench.tracking import mlflow as mlf

    kids = mlf.child_runs(sweep["uri"], _parent(sweep["uri"]).info.run_id)
    axes = {
        (k.data.tags["topology"], k.data.tags["model"], k.data.tags["seed"], k.data.tags["dataset"], k.data.tags["optimizer"])
        for k in kids
    }
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
        ("sequential_langgraph", 1, 3),
        ("single", 1, 3),
    ]
    assert mlf.client(uri).get_run(parent).data.tags["comparison_cells"] == "2"


def test_concurrent_writers_leave_a_whole_table(sweep: dict):
    """Three processes rewrite the same parent's comparison at once: the table is complete and
    equal to what one writer alone produces (last writer wins; no torn or appended rows)."""
    uri = sweep["uri"]
    parent = _parent(uri).info.run_id
    code = "import sys; from apps_bench.report.sweep_run import publish; publish(sys.argv[1], sys.argv[2])"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("APPS_BENCH_PARENT_RUN_ID", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", code, uri, parent], env=env, stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    rows = sweep_run.read(uri, parent)
    alone = sweep_run.publish(uri, parent)  # as logged: the table's JSON keeps 10 significant digits
    assert len(rows) == 2 and rows == [pytest.approx(r, rel=1e-9) for r in alone]
