"""The APPS table and pass@k on a real sweep: two topologies × three seeds on the 150 vendored train
rows (50 per tier) on gold with `model.gold.wrong_fraction`, judged with every test run, through the real
CLI and a real SQLite MLflow store. Every figure the report prints (test-case average and strict
accuracy per tier, pass@1..3) and every cell's MLflow tier metric is recomputed here, in plain
Python, from the cells' records.jsonl; a second, default-judge cell shows the lower bound."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from math import comb
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

from apps_bench.report.stats import bootstrap_interval

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TIERS = ("introductory", "interview", "competition", "all")
TOPOLOGIES = ("single", "sequential_langgraph")
SEEDS = ("0", "1", "2")
EXPERIMENT = "tiers42"
IV = re.compile(r"(≥?)(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]|-(?=\s|$)")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("tiers")
    db = fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env = cli_env(cwd)
    r = run_cli(
        [
            "-m",
            f"topology={','.join(TOPOLOGIES)}",
            f"seed={','.join(SEEDS)}",
            "model=gold",
            "model.gold.wrong_fraction=0.3",
            "dataset=apps",
            f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
            "dataset.split=train",
            "judge.stop_on_first_failure=false",
            "progress=false",
            f"tracking.experiment={EXPERIMENT}",
        ],
        cwd,
        env=env,
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cells: dict[tuple[str, str], list[dict]] = {}
    for d in (cwd / "outputs" / "cells").iterdir():
        axes = json.loads((d / "cell.json").read_text())["axes"]
        cells[(axes["topology"], str(axes["seed"]))] = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines()]
    return {"cwd": cwd, "db": db, "env": env, "cells": cells}


# ----------------------------------------------------------------------------- the figures, in plain Python


def _judged(records: list[dict]) -> list[dict]:
    return [r for r in records if not r["error"]]


def _in(tier: str, r: dict) -> bool:
    return tier == "all" or r["difficulty"] == tier


def _fraction(r: dict) -> float:
    v = r["verdict"]
    return v["tests_passed"] / v["n_tests"]


def _pooled(cells: dict, topology: str, tier: str, measure) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for seed in SEEDS:
        for r in _judged(cells[(topology, seed)]):
            if _in(tier, r):
                out.setdefault(r["key"], []).append(float(measure(r)))
    return out


def _mean(outcomes: dict[str, list[float]]) -> float:
    return sum(map(sum, outcomes.values())) / sum(map(len, outcomes.values()))


def _pass_at_k(cells: dict, topology: str, tier: str, k: int) -> tuple[float, dict[str, list[float]]]:
    solved: dict[str, list[bool]] = {}
    for seed in SEEDS:
        for r in _judged(cells[(topology, seed)]):
            if _in(tier, r):
                solved.setdefault(r["key"], []).append(bool(r["passed"]))
    n = len(SEEDS)
    per = {key: [1.0 - comb(n - sum(v), k) / comb(n, k)] for key, v in solved.items() if len(v) == n}
    return sum(v[0] for v in per.values()) / len(per), per


def _ivs(line: str) -> list[tuple[str, str, str, str] | None]:
    return [None if m.group(0) == "-" else m.groups() for m in IV.finditer(line)]  # type: ignore[misc]


def _report(sweep: dict, *args: str) -> str:
    r = run_cli(["--experiment", EXPERIMENT, *args], sweep["cwd"], env=sweep["env"], module="apps_bench.report")
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# ----------------------------------------------------------------------------- tests


def test_the_sweep_covers_three_tiers_and_is_not_trivial(sweep: dict) -> None:
    cells = sweep["cells"]
    assert set(cells) == {(t, s) for t in TOPOLOGIES for s in SEEDS}
    for records in cells.values():
        assert len(records) == 150 and {r["difficulty"] for r in records} == set(TIERS[:3])
        assert all(r["verdict"]["tests_run"] == r["verdict"]["n_tests"] for r in _judged(records) if r["extracted"])
    for topo in TOPOLOGIES:
        solved = _mean(_pooled(cells, topo, "all", lambda r: r["passed"]))
        assert 0.5 < solved < 0.9, solved  # wrong_fraction 0.3 made wrong answers
        assert _pass_at_k(cells, topo, "all", 3)[0] > solved  # and seeds differ


def test_apps_table_prints_each_tier_as_the_records_give_it(sweep: dict) -> None:
    text = _report(sweep, "--table", "apps-paper")
    cells = sweep["cells"]
    measures = {"test-case average": _fraction, "strict accuracy": lambda r: r["passed"]}
    seen = 0
    for topo in TOPOLOGIES:
        for metric, measure in measures.items():
            line = next(x for x in text.splitlines() if re.match(rf"{topo}\s+gold\s+{metric}\s+3\s", x))
            got = _ivs(line.split(metric, 1)[1])
            assert len(got) == len(TIERS), line
            for tier, printed in zip(TIERS, got):
                outcomes = _pooled(cells, topo, tier, measure)
                iv = bootstrap_interval(outcomes)
                assert printed == ("", f"{_mean(outcomes):.3f}", f"{iv.low:.3f}", f"{iv.high:.3f}"), (topo, metric, tier, line)
                seen += 1
    assert seen == 16 and "≥" not in text  # every test ran: no figure is a bound
    assert "weighted by problems" in " ".join(text.split())


def test_pass_at_k_for_k_1_to_3_as_the_records_give_it(sweep: dict) -> None:
    text = _report(sweep, "--table", "pass-at-k")
    cells = sweep["cells"]
    for topo in TOPOLOGIES:
        for k in (1, 2, 3):
            line = next(x for x in text.splitlines() if re.match(rf"{topo}\s+gold\s+pass@{k}\s+3\s+150\s", x))
            for tier, printed in zip(TIERS, _ivs(line.split(f"pass@{k}", 1)[1])):
                est, per = _pass_at_k(cells, topo, tier, k)
                iv = bootstrap_interval(per)
                assert printed == ("", f"{est:.3f}", f"{iv.low:.3f}", f"{iv.high:.3f}"), (topo, k, tier, line)
        # pass@1 from samples is the pooled strict accuracy when every problem has all its seeds
        assert _pass_at_k(cells, topo, "all", 1)[0] == pytest.approx(_mean(_pooled(cells, topo, "all", lambda r: r["passed"])))
    assert "n = the group's seed cells as samples" in " ".join(text.split())


def test_the_whole_report_shows_both_tables_and_the_exports_agree(sweep: dict) -> None:
    full = _report(sweep)
    assert "APPS table (test-case average, strict accuracy) by tier" in full and "pass@k by tier" in full
    cells = sweep["cells"]
    rows = list(csv.DictReader(io.StringIO(_report(sweep, "--table", "apps-paper", "--format", "csv"))))
    assert [(x["model"], x["topology"], x["seeds"]) for x in rows] == [("gold", t, "3") for t in sorted(TOPOLOGIES)]
    for x in rows:
        for tier in TIERS:
            assert float(x[f"test_case_average_{tier}"]) == pytest.approx(
                _mean(_pooled(cells, x["topology"], tier, _fraction)), abs=1e-6
            )
            want = _mean(_pooled(cells, x["topology"], tier, lambda r: r["passed"]))
            assert float(x[f"strict_accuracy_{tier}"]) == pytest.approx(want, abs=1e-6)
        assert x["test_case_average_is_lower_bound"] == "false"
    k_rows = list(csv.DictReader(io.StringIO(_report(sweep, "--table", "pass-at-k", "--format", "csv"))))
    assert len(k_rows) == 6 and {x["n"] for x in k_rows} == {"3"} and {x["left_out"] for x in k_rows} == {"0"}
    for x in k_rows:
        assert float(x["pass_at_k_all"]) == pytest.approx(_pass_at_k(cells, x["topology"], "all", int(x["k"]))[0], abs=1e-6)
    md = _report(sweep, "--table", "apps-paper", "--format", "markdown").splitlines()
    assert (
        md[0].count("|") == 3 + 8 + 1
        and "test-case average: competition" in md[0]
        and len([x for x in md if x.startswith("| gold")]) == 2
    )
    tex = _report(sweep, "--table", "apps-paper", "--format", "latex")
    assert tex.startswith("\\begin{tabular}{lllrrrrrrrr}") and "\\end{tabular}" in tex
    single = next(x for x in tex.splitlines() if x.startswith("gold & single"))
    assert f"{100 * _mean(_pooled(cells, 'single', 'all', _fraction)):.1f} [" in single.split(" & ")[6]


def test_each_cell_run_logs_its_tier_metrics_and_its_table_carries_the_test_counts(sweep: dict) -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    from apps_bench.report.cells import table_row

    c = MlflowClient(f"sqlite:///{sweep['db']}")
    exp = c.get_experiment_by_name(EXPERIMENT)
    runs = [r for r in c.search_runs([exp.experiment_id]) if "cell_key" in r.data.tags]
    assert len(runs) == 6
    for run in runs:
        records = sweep["cells"][(run.data.tags["topology"], run.data.tags["seed"])]
        for tier in TIERS:
            mine = [r for r in _judged(records) if _in(tier, r)]
            m = run.data.metrics
            assert m[f"test_case_average/{tier}"] == pytest.approx(sum(map(_fraction, mine)) / len(mine))
            assert m[f"strict_accuracy/{tier}"] == pytest.approx(sum(r["passed"] for r in mine) / len(mine))
        table = json.loads(
            Path(c.download_artifacts(run.info.run_id, "problems.json", str(sweep["cwd"] / run.info.run_id))).read_text()
        )
        got = {(r["split"], r["id"]): r for r in (table_row(dict(zip(table["columns"], x))) for x in table["data"])}
        for rec in records:
            row, v = got[(rec["split"], rec["id"])], rec["verdict"] or {}
            assert (row["tests_passed"], row["tests_run"], row["tests_kept"]) == (v["tests_passed"], v["tests_run"], v["n_tests"])


def test_a_judge_that_stops_at_the_first_failure_prints_a_lower_bound(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
) -> None:
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(
        [
            "topology=single",
            "model=gold",
            "model.gold.wrong_fraction=0.5",
            "dataset=apps",
            "dataset.split=train",
            f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
            "offset=50",
            "limit=12",
            "progress=false",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (cell,) = (tmp_path / "outputs" / "cells").iterdir()
    records = _judged([json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines()])
    assert any(
        x["verdict"]["tests_run"] < x["verdict"]["n_tests"] for x in records if not x["passed"]
    )  # the judge cut some short
    rep = run_cli(
        ["--cells-dir", str(tmp_path / "outputs" / "cells"), "--table", "apps-paper"], tmp_path, module="apps_bench.report"
    )
    assert rep.returncode == 0, rep.stderr
    tca = next(x for x in rep.stdout.splitlines() if re.match(r"single\s+gold\s+test-case average", x))
    strict = next(x for x in rep.stdout.splitlines() if re.match(r"single\s+gold\s+strict accuracy", x))
    low = sum(x["verdict"]["tests_passed"] / x["verdict"]["n_tests"] for x in records) / len(records)
    assert _ivs(tca)[-1][:2] == ("≥", f"{low:.3f}") and _ivs(strict)[-1][0] == ""  # type: ignore[index]
    assert "judge.stop_on_first_failure=false" in " ".join(rep.stdout.split())
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["metrics"]["test_case_average_lower_bound/all"] == pytest.approx(low)
    assert "test_case_average/all" not in summary["metrics"]
