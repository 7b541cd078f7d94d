"""The report on a real sweep: 3 topologies x 2 seeds on gold through the real CLI (one with
`model.gold.wrong_fraction`, so results differ), a real SQLite MLflow store, real APPS rows; the
figures it prints are checked against the cells' own records.jsonl files on disk."""

from __future__ import annotations

import csv
import json
import os
import platform
import re
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

from apps_bench.report.stats import bootstrap_interval, holm, mcnemar_exact, paired_bootstrap

# the module's sweep (6 cells, two commands) runs inside the first test's timeout; on 2 shared busy cores it
# took over the default 300 s once
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXPERIMENT = "report12"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("sweep")
    db = fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env = cli_env(cwd)
    common = [
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "limit=10",
        "progress=false",
        f"tracking.experiment={EXPERIMENT}",
    ]
    for extra in (["topology=single,sequential_langgraph"], ["topology=independent", "model.gold.wrong_fraction=0.4"]):
        r = run_cli(["-m", *extra, "seed=0,1", *common], cwd, env=env, timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"cwd": cwd, "db": db, "env": env, "data": apps_data_dir}


def _cells(cwd: Path) -> dict[tuple[str, str], Path]:
    out = {}
    for d in (cwd / "outputs" / "cells").iterdir():
        info = json.loads((d / "cell.json").read_text())
        out[(info["axes"]["topology"], str(info["axes"]["seed"]))] = d
    return out


def _passed(d: Path) -> dict[str, float]:
    recs = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines()]
    return {r["key"]: float(r["passed"]) for r in recs if not r["error"]}


def _pooled(cells: dict, topology: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for seed in ("0", "1"):
        for k, v in _passed(cells[(topology, seed)]).items():
            out.setdefault(k, []).append(v)
    return out


def _unwrap(text: str) -> str:
    """The report folds long notes and refusals at 120 columns (continuation lines indented): one line each again."""
    return re.sub(r"\n {4,}(?=\S)", " ", text)


def _png_ok(path: Path) -> None:
    import numpy as np
    from matplotlib import image

    assert path.stat().st_size > 5000, path
    img = image.imread(str(path))
    h, w = img.shape[:2]
    assert w >= 400 and h >= 150, (path, img.shape)
    rgb = img[..., :3].reshape(-1, 3)
    assert float(rgb.std()) > 0.05, f"{path} looks blank"
    colours = {tuple(c) for c in np.round(rgb[:: max(1, len(rgb) // 20000)], 2)}
    assert len(colours) > 20, f"{path} has {len(colours)} colours: nothing drawn"
    dark = (rgb.mean(axis=1) < 0.5).mean()
    assert 0.002 < dark < 0.6, f"{path}: {dark:.3f} of the pixels are dark"


def test_report_on_a_sweep(sweep: dict, tmp_path: Path):
    cwd, env = sweep["cwd"], sweep["env"]
    cells = _cells(cwd)
    assert len(cells) == 6
    out = tmp_path / "rep"
    r = run_cli(
        [
            "--experiment",
            EXPERIMENT,
            "--compare",
            "baseline=single",
            "--plots",
            str(out),
            "--export",
            str(out / "problems.csv"),
            "--export",
            str(out / "problems.parquet"),
        ],
        cwd,
        env=env,
        module="apps_bench.report",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = r.stdout

    # 1. intervals per cell group, as the records on disk give them (clustered over the two seeds)
    assert "clustered by problem across seeds" in " ".join(text.split())  # captions fold at 120 columns
    for topo in ("single", "sequential_langgraph", "independent"):
        iv = bootstrap_interval(_pooled(cells, topo))
        line = next(x for x in text.splitlines() if x.startswith(topo + " "))
        assert f"{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}] (2s × 10p)" in line, line
    wrong = _pooled(cells, "independent")
    assert 0 < sum(map(sum, wrong.values())) < 20, "wrong_fraction made no difference: the test shows nothing"
    assert all(v == [1.0, 1.0] for v in _pooled(cells, "single").values())

    # 2. the paired comparison against single: Δ, wins/losses, exact McNemar, Holm over the 2 comparisons
    base = _pooled(cells, "single")
    ind = paired_bootstrap(wrong, base)
    seq = paired_bootstrap(_pooled(cells, "sequential_langgraph"), base)
    p_holm = holm([ind.p_value, seq.p_value])
    losses = sum(1 for v in wrong.values() for x in v if not x)
    assert ind.b_only == losses and ind.p_value == pytest.approx(mcnemar_exact(0, losses))
    row = next(x for x in text.splitlines() if re.match(r"gold\s+independent\s+single", x))
    assert f"{ind.diff:+.3f}" in row and f"[{ind.low:+.3f}, {ind.high:+.3f}]" in row and f"0/{losses}" in row
    p = p_holm[0]
    assert row.split()[-3] == (f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"), row
    assert row.split()[-4] == f"{ind.p_value:.3f}" and p == pytest.approx(min(1.0, 2 * ind.p_value)), row
    assert "not comparable" not in text
    notes = [x for x in text.splitlines() if x.startswith("note:")]
    assert notes == [
        "note: independent − single · gold [block A]: settings differ (independent vs single): model.wrong_fraction: 0.4 vs 0.0"
    ]

    # 3. cost per role: sequential_langgraph's four roles, counted from the role of every recorded call
    role_part = text.split("cost per agent role")[1].split("framework overhead")[0]
    assert "≈" not in role_part and "counted at the HTTP transport per role" in " ".join(role_part.split())
    role_rows = [x.split() for x in role_part.splitlines() if x.startswith("sequential_langgraph")]
    assert [x[2] for x in role_rows] == ["analyzer", "coder", "tester", "debugger"]
    recs = [json.loads(x) for s in "01" for x in (cells[("sequential_langgraph", s)] / "records.jsonl").read_text().splitlines()]
    calls = sum(x["usage"]["model_calls"] for x in recs) / len(recs)
    for x in role_rows:  # each role's calls and tokens per problem, as its calls in the records say
        mine = [c for r in recs for c in r["usage"]["calls"] if c["role"] == x[2]]
        assert float(x[7]) == pytest.approx(len(mine) / len(recs), abs=0.005), x
        assert x[6] == f"{sum(c['prompt_tokens'] + c['completion_tokens'] for c in mine) / len(recs):,.0f}", x
    assert sum(float(x[7]) for x in role_rows) == pytest.approx(calls, abs=0.02)
    tokens = sum(x["usage"]["total_tokens"] for x in recs) / len(recs)
    cost_row = next(x for x in text.split("cost per problem")[1].splitlines() if x.startswith("sequential_langgraph"))
    assert f"{tokens:,.0f}" in cost_row

    # 4. the charts: real PNGs with something drawn on them
    for name in ("pass_at_1.png", "pareto.png", "forest.png"):
        _png_ok(out / name)

    # 5. the tidy export: every problem of every cell, CSV and parquet alike
    rows = list(csv.DictReader((out / "problems.csv").open()))
    assert len(rows) == 60
    assert {(x["topology"], x["seed"]) for x in rows} == {(t, s) for t, s in cells}
    n_passed = sum(sum(_passed(d).values()) for d in cells.values())
    assert sum(x["passed"] == "True" for x in rows) == n_passed
    import pandas as pd

    pq = pd.read_parquet(out / "problems.parquet")
    assert (
        len(pq) == 60
        and int(pq["passed"].sum()) == n_passed
        and set(pq.columns)
        >= {"cell_key", "problem_id", "difficulty", "passed", "error", "total_tokens", "model_calls", "latency_s", "judge_rules"}
    )


def test_cells_carry_intervals_and_provenance(sweep: dict):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    cells = _cells(sweep["cwd"])
    c = MlflowClient(f"sqlite:///{sweep['db']}")
    exp = c.get_experiment_by_name(EXPERIMENT)
    runs = [r for r in c.search_runs([exp.experiment_id]) if "cell_key" in r.data.tags]
    assert len(runs) == 6
    for run in runs:
        t = run.data.tags
        d = cells[(t["topology"], t["seed"])]
        iv = bootstrap_interval({k: [v] for k, v in _passed(d).items()})
        assert run.data.metrics["pass_at_1_ci_low"] == pytest.approx(iv.low)
        assert run.data.metrics["pass_at_1_ci_high"] == pytest.approx(iv.high)
        assert t["prov.python"] == platform.python_version()
        assert t["prov.pkg.langgraph"] and t["prov.pkg.mlflow"] and t["prov.pkg.numpy"]
        assert t["prov.git_sha"] == t["git_sha"] and t["prov.sandbox"]
        assert t["max_tests_per_row"] == "20"
        # the judge profile's rules version, a comparability key, is a tag like the profile
        assert t["judge_rules"] == str(json.loads((d / "cell.json").read_text())["identity"]["judge"]["rules"])
        for name in ("summary.json", "cell.json"):
            prov = json.loads((d / name).read_text())["provenance"]
            assert prov["python"] == platform.python_version() and prov["host"] == platform.node()
            assert prov["packages"]["hydra-core"] and prov["packages"]["datasets"] and prov["git_dirty"] in ("true", "false")
            assert prov["sandbox"] is not None
        assert json.loads((d / "summary.json").read_text())["pass_at_1_ci"]["low"] == pytest.approx(iv.low)


def test_a_rescore_run_is_a_cell_of_its_own_profile_and_never_compared_across(sweep: dict, tmp_path: Path):
    """A re-scoring run (issue 10's layout: run_kind=rescore, rescore_of, judge_profile, max_tests_per_row,
    the five axes, cell_key) is read as a cell under its profile, and never compared with another profile."""
    from apps_bench.tracking import mlflow as mlf

    uri = f"sqlite:///{sweep['db']}"
    c = mlf.client(uri)
    exp = c.get_experiment_by_name(EXPERIMENT)
    orig = next(r for r in c.search_runs([exp.experiment_id], "tags.topology = 'independent' and tags.seed = '0'"))
    d = _cells(sweep["cwd"])[("independent", "0")]
    tags = {k: orig.data.tags[k] for k in ("dataset", "topology", "model", "optimizer", "seed", "cell_key")}
    tags.update(
        run_kind="rescore",
        rescore_of=orig.info.run_id,
        judge_profile="reference",
        max_tests_per_row="0",
        judge_rules="1",
        complete="true",
    )
    tags["mlflow.parentRunId"] = orig.info.run_id
    run = c.create_run(exp.experiment_id, run_name="rescore", tags=tags)
    recs = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines()]
    for rec in recs:
        rec["passed"] = True  # the other profile's verdicts
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in recs))
    c.log_artifact(run.info.run_id, str(path))
    c.set_terminated(run.info.run_id)
    try:
        r = run_cli(
            ["--experiment", EXPERIMENT, "--compare", "baseline=single", "--forest", str(tmp_path / "f.png")],
            sweep["cwd"],
            env=sweep["env"],
            module="apps_bench.report",
        )
        assert r.returncode == 0, r.stderr[-3000:]
        header = r.stdout.split("\n\n")[0].splitlines()  # the blocks, each once: never pooled
        ref = next(x.split()[0] for x in header[1:] if "judge reference (rules 1) · all tests" in x)
        assert any("judge seed (rules 3) · cap 20 tests" in x for x in header[1:])
        refused = next(x for x in _unwrap(r.stdout).splitlines() if "refused" in x)
        assert (
            f"independent − single · gold [block {ref}]" in refused and "different judge profiles (reference vs seed)" in refused
        )
        section = r.stdout.split(f"pass@1 by topology × model · block {ref}\n")[1].split("\n\n")[0]
        row = next(x for x in section.splitlines() if x.startswith("independent "))
        assert "1.000 [1.000, 1.000] (1s × 10p)" in row
        only = run_cli(
            ["--experiment", EXPERIMENT, "--judge", "reference"], sweep["cwd"], env=sweep["env"], module="apps_bench.report"
        )
        assert only.returncode == 0 and "single" not in only.stdout.split("cost per problem")[0]
        none = run_cli(
            ["--experiment", EXPERIMENT, "--judge", "nope"], sweep["cwd"], env=sweep["env"], module="apps_bench.report"
        )
        assert none.returncode == 2 and "--judge nope: no such judge profile (judge profiles: reference, seed)" in none.stderr
        assert none.stdout == ""  # refused before any cell is read
    finally:
        c.delete_run(run.info.run_id)


def test_a_cell_judged_under_other_rules_is_refused(sweep: dict, tmp_path: Path):
    """A cell judged under an older version of its profile's rules (another `judge.rules`, so
    another cell key): read from MLflow or from its folder, it is never compared with the
    current rules' cells, and the refusal says why."""
    import shutil

    from apps_bench.tracking import mlflow as mlf

    uri = f"sqlite:///{sweep['db']}"
    c = mlf.client(uri)
    exp = c.get_experiment_by_name(EXPERIMENT)
    orig = next(r for r in c.search_runs([exp.experiment_id], "tags.topology = 'independent' and tags.seed = '0'"))
    d = _cells(sweep["cwd"])[("independent", "0")]
    tags = {k: v for k, v in orig.data.tags.items() if not k.startswith("mlflow.")}
    tags.update(cell_key=orig.data.tags["cell_key"] + "-rules1", judge_rules="1")
    run = c.create_run(exp.experiment_id, run_name="old rules", tags=tags)
    from mlflow.entities import Param

    params = [Param(k, "1" if k == "judge.rules" else v) for k, v in orig.data.params.items()]
    for i in range(0, len(params), 100):
        c.log_batch(run.info.run_id, params=params[i : i + 100])
    c.log_artifact(run.info.run_id, str(d / "records.jsonl"))
    c.log_metric(run.info.run_id, "latency_mean_s", orig.data.metrics["latency_mean_s"])
    c.set_terminated(run.info.run_id)
    want = "different judge rules (profile seed: rules 1 vs 3)"
    try:
        r = run_cli(
            ["--experiment", EXPERIMENT, "--compare", "baseline=single", "--forest", str(tmp_path / "f.png")],
            sweep["cwd"],
            env=sweep["env"],
            module="apps_bench.report",
        )
        assert r.returncode == 0, r.stderr[-3000:]
        refused = [x for x in _unwrap(r.stdout).splitlines() if "refused, not compared" in x]
        assert len(refused) == 1 and "independent − single · gold" in refused[0] and want in refused[0], r.stdout
        assert "judge seed (rules 1) · cap 20 tests" in r.stdout and "judge seed (rules 3) · cap 20 tests" in r.stdout
        # the current rules' independent cells are still compared with single
        assert re.search(r"gold\s+independent\s+single\s+-", r.stdout), r.stdout
        # any other metric: mean ± std over seeds, never pooled across rules versions
        m = run_cli(
            ["--experiment", EXPERIMENT, "--metric", "latency_mean_s"], sweep["cwd"], env=sweep["env"], module="apps_bench.report"
        )
        assert m.returncode == 2 and "judge=seed rules=1 cap=20, judge=seed rules=3 cap=20" in m.stderr, m.stderr
    finally:
        c.delete_run(run.info.run_id)

    # the same from local folders: the cell's identity says its rules
    root = tmp_path / "cells"
    for (topo, seed), src in _cells(sweep["cwd"]).items():
        if seed == "0" and topo in ("single", "independent"):
            shutil.copytree(src, root / src.name)
    info_path = next(p for p in root.glob("*/cell.json") if json.loads(p.read_text())["axes"]["topology"] == "independent")
    info = json.loads(info_path.read_text())
    info["identity"]["judge"]["rules"] = 1
    info_path.write_text(json.dumps(info))
    r = run_cli(
        ["--cells-dir", str(root), "--compare", "baseline=single", "--forest", str(tmp_path / "g.png")],
        sweep["cwd"],
        env=sweep["env"],
        module="apps_bench.report",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    refused = [x for x in _unwrap(r.stdout).splitlines() if "refused, not compared" in x]
    assert len(refused) == 1 and want in refused[0], r.stdout
    assert "forest plot not written: every comparison was refused" in r.stdout


def test_report_from_local_cell_folders(sweep: dict, tmp_path: Path):
    r = run_cli(
        [
            "--cells-dir",
            str(sweep["cwd"] / "outputs" / "cells"),
            "--compare",
            "baseline=single",
            "--forest",
            str(tmp_path / "f.png"),
            "--export",
            str(tmp_path / "t.csv"),
        ],
        sweep["cwd"],
        env=sweep["env"],
        module="apps_bench.report",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    cells = _cells(sweep["cwd"])
    iv = bootstrap_interval(_pooled(cells, "independent"))
    assert f"{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}]" in r.stdout
    assert len(list(csv.DictReader((tmp_path / "t.csv").open()))) == 60
    _png_ok(tmp_path / "f.png")
    bad = run_cli(["--compare", "single"], sweep["cwd"], env=sweep["env"], module="apps_bench.report")
    assert bad.returncode == 2 and "--compare baseline=TOPOLOGY" in bad.stderr
    unknown = run_cli(
        ["--experiment", EXPERIMENT, "--compare", "baseline=nope"], sweep["cwd"], env=sweep["env"], module="apps_bench.report"
    )
    assert unknown.returncode == 2 and "no such topology" in unknown.stderr


def test_framework_siblings_and_provenance_warnings(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    """sequential_langgraph vs sequential_crewai (same flow, two frameworks): the overhead row is
    the difference of their records' tokens and calls; a cell that ran on another package version or
    commit makes the report warn about the comparison."""
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    env = cli_env(tmp_path)
    r = run_cli(
        [
            "-m",
            "topology=sequential_langgraph,sequential_crewai",
            "dataset=apps",
            "limit=3",
            "progress=false",
            f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        ],
        tmp_path,
        env=env,
        timeout=400,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cells = _cells(tmp_path)

    def per_problem(topo: str, field: str) -> float:
        recs = [json.loads(x) for x in (cells[(topo, "0")] / "records.jsonl").read_text().splitlines()]
        return sum(x["usage"][field] for x in recs) / len(recs)

    args = [
        "--cells-dir",
        str(tmp_path / "outputs" / "cells"),
        "--compare",
        "baseline=sequential_langgraph",
        "--forest",
        str(tmp_path / "f.png"),
    ]
    rep = run_cli(args, tmp_path, env=env, module="apps_bench.report")
    assert rep.returncode == 0, rep.stderr[-3000:]
    row = next(x for x in rep.stdout.split("framework overhead")[1].splitlines() if x.startswith("sequential "))
    lg, cr = per_problem("sequential_langgraph", "total_tokens"), per_problem("sequential_crewai", "total_tokens")
    assert "crewai vs langgraph" in row and f"{cr:,.0f} vs {lg:,.0f}" in row
    assert f"{cr - lg:+,.0f}" in row
    calls = per_problem("sequential_crewai", "model_calls") - per_problem("sequential_langgraph", "model_calls")
    assert f"{calls:+.2f}" in row
    # ... and role by role, from the role of each recorded call: same four roles on both frameworks
    per_role = [x.split() for x in rep.stdout.split("framework overhead per role")[1].splitlines() if x.startswith("sequential ")]
    assert [x[5] for x in per_role] == ["analyzer", "coder", "tester", "debugger"]
    for x in per_role:
        spent = {}
        for topo in ("sequential_langgraph", "sequential_crewai"):
            recs = [json.loads(y) for y in (cells[(topo, "0")] / "records.jsonl").read_text().splitlines()]
            mine = [c for r in recs for c in r["usage"]["calls"] if c["role"] == x[5]]
            spent[topo] = sum(c["prompt_tokens"] + c["completion_tokens"] for c in mine) / len(recs)
        assert x[6:9] == [f"{spent['sequential_crewai']:,.0f}", "vs", f"{spent['sequential_langgraph']:,.0f}"], x
    assert "warning" not in rep.stdout  # same software on both sides: nothing to warn about

    crew = cells[("sequential_crewai", "0")]
    summary = json.loads((crew / "summary.json").read_text())
    summary["provenance"]["packages"]["openai"] = "0.0.1"
    summary["provenance"]["git_sha"] = "0" * 40
    (crew / "summary.json").write_text(json.dumps(summary))
    rep = run_cli(args, tmp_path, env=env, module="apps_bench.report")
    assert rep.returncode == 0, rep.stderr[-3000:]
    warns = [x for x in _unwrap(rep.stdout).splitlines() if x.startswith("warning: sequential_crewai − sequential_langgraph")]
    assert any("pkg.openai differs" in w and "0.0.1: sequential_crewai·s0" in w for w in warns), rep.stdout
    assert any("git_sha differs" in w for w in warns)
