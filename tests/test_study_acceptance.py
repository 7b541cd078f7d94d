"""The study acceptance test: what a researcher does, through the CLI, and every figure the report prints
recomputed here in plain Python from the cells' records.jsonl files (never through apps_bench.report).

The path, on gold with injected wrong answers and injected endpoint faults, on real APPS rows, against a SQLite
store and against a real `mlflow server` on loopback:

1. one cell alone (`single seed=0`), the natural first step;
2. the topology × seed sweep that includes it, interrupted with SIGINT after a record of a new cell, then rerun;
3. between the two, one of the sweep's cells launched twice at once (the first held still while the second starts);
4. a re-scoring of one cell under `judge=reference`;
5. `report --sweep <parent> --compare baseline=single --export problems.csv`;
6. apart, sweeps over settings outside the five axes (`model.temperature`, `model.gold.wrong_fraction`,
   `topology.team_size`, a prompt file: `SETTING_SWEEPS`, one entry each) crossed with the seeds, reported
   with `--compare SETTING=VALUE` and `--metric`: every cell under its own label, never pooled with another;
7. a model preset of the user's own (`--config-dir`, gold with injected wrong answers) swept beside the
   packaged one it builds on: each under its own name, its figures those of its records.

Guaranteed: every cell is a member of the sweep (the one that ran before it too), no problem is solved twice,
and each figure (pass@1 with its bootstrap interval and counts, per-seed pass@1, paired differences with exact
McNemar and Holm p-values, cost per problem) equals what the records give.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import cli_env, config_dir_preset, fresh_store, mlflow_server, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TOPOLOGIES = ("single", "sequential_langgraph", "independent")
SEEDS = ("0", "1")
N_ROWS = 6
B = 10_000  # the report's documented resamples; its documented bootstrap seed is 0
EXPERIMENT = "acceptance"


def _common(data: Path) -> list[str]:
    return [
        "dataset=apps",
        f"dataset.path={data / 'train_mini150.jsonl'}",
        f"limit={N_ROWS}",
        "model.gold.wrong_fraction=0.3",
        "progress=false",
        f"tracking.experiment={EXPERIMENT}",
    ]


def _cell_dirs(cwd: Path) -> dict[tuple[str, str], Path]:
    out = {}
    root = cwd / "outputs" / "cells"
    for d in root.iterdir() if root.is_dir() else ():
        try:
            axes = json.loads((d / "cell.json").read_text())["axes"]
        except (OSError, ValueError):  # a cell that is being claimed right now: its cell.json comes next
            continue
        out[(axes["topology"], str(axes["seed"]))] = d
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _wait_for(what: str, found: Any, proc: subprocess.Popen, limit_s: float = 600) -> None:
    """Poll until found() (a guard against a hung run, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not found():
        assert proc.poll() is None, f"the run ended before {what}: rc={proc.returncode}"
        assert time.monotonic() < deadline, f"no {what} after {limit_s} s"
        time.sleep(0.1)


def _popen(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module", params=["sqlite", "server"])
def study(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path
) -> dict[str, Any]:
    cwd = tmp_path_factory.mktemp(f"study-{request.param}")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
            uri = f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}"
            env = cli_env(cwd)
        else:
            uri = stack.enter_context(mlflow_server(tmp_path_factory.mktemp("server")))
            env = cli_env(cwd, MLFLOW_TRACKING_URI=uri)
        yield _run_study(cwd, env, uri, apps_data_dir)


def _run_study(cwd: Path, env: dict[str, str], uri: str, data: Path) -> dict[str, Any]:
    common = _common(data)
    out: dict[str, Any] = {"cwd": cwd, "env": env, "uri": uri}

    # 1. one cell alone
    r = run_cli(["topology=single", "seed=0", *common], cwd, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]

    # 2. the sweep that includes it, with injected faults (retried; what still fails is an error the rerun retries),
    # interrupted with SIGINT once a cell other than the first has recorded a problem
    sweep = ["-m", f"topology={','.join(TOPOLOGIES)}", f"seed={','.join(SEEDS)}", *common]
    log = cwd / "sweep1.log"
    proc = _popen([*sweep, "model.gold.fault_fraction=0.1", "model.gold.latency_ms=100", "concurrency=2"], cwd, env, log)
    first = _cell_dirs(cwd)[("single", "0")]

    def another_cell_recorded() -> bool:
        return any(d != first and _lines(d / "records.jsonl") for d in _cell_dirs(cwd).values())

    _wait_for("a record of a new cell", another_cell_recorded, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) != 0
    out["interrupted_log"] = log.read_text()

    # 3. one of the sweep's cells launched twice at once: the first held still (SIGSTOP) after its first record
    twice = ["topology=sequential_langgraph", "seed=1", *common, "concurrency=1", "processes=1"]
    first_log = cwd / "twice1.log"
    a = _popen(twice, cwd, env, first_log)
    try:
        _wait_for(
            "the first run's first record",
            lambda: (
                ("sequential_langgraph", "1") in _cell_dirs(cwd)
                and len(_lines(_cell_dirs(cwd)[("sequential_langgraph", "1")] / "records.jsonl")) >= 1
            ),
            a,
        )
        a.send_signal(signal.SIGSTOP)
        cell = _cell_dirs(cwd)[("sequential_langgraph", "1")]
        n_before = len(_lines(cell / "records.jsonl"))
        second = run_cli(twice, cwd, env=env)
        out["appended_while_held"] = len(_lines(cell / "records.jsonl")) - n_before
    finally:
        a.send_signal(signal.SIGCONT)
    assert a.wait(timeout=600) == 0, first_log.read_text()[-3000:]
    out["second"] = second
    out["first_pid"] = a.pid
    out["twice_records"] = _lines(cell / "records.jsonl")

    # 2b. the sweep rerun: finishes every cell, solves nothing twice
    r = run_cli(sweep, cwd, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["rerun_log"] = r.stderr

    # 4. a re-scoring under the original harness's rules
    target = _cell_dirs(cwd)[("independent", "0")]
    r = run_cli([str(target), "judge=reference"], cwd, env=env, module="apps_bench.rescore")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["rescored"] = target

    # 5. the report of the sweep
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    parents = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name.startswith("sweep")]
    # a parent run per launch: the interrupted one's, left KILLED, and the rerun's, which links it
    assert len(parents) == 2, [p.info.run_name for p in parents]
    [rerun] = [p for p in parents if "sweep_earlier_run" in p.data.tags]
    [interrupted] = [p for p in parents if p is not rerun]
    assert interrupted.info.status == "KILLED" and rerun.data.tags["sweep_earlier_run"] == interrupted.info.run_id
    out["parent"] = rerun
    out["client"] = client
    csv_path = cwd / "problems.csv"
    r = run_cli(
        ["--sweep", rerun.info.run_id, "--compare", "baseline=single", "--export", str(csv_path)],
        cwd,
        env=env,
        module="apps_bench.report",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["report_all"] = r.stdout  # both judge profiles, each its own block
    out["csv"] = list(csv.DictReader(csv_path.open()))
    r = run_cli(
        ["--sweep", rerun.info.run_id, "--compare", "baseline=single", "--judge", "seed"],
        cwd,
        env=env,
        module="apps_bench.report",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["report"] = r.stdout  # the cells' own verdicts: the figures checked below
    out["cells"] = _cell_dirs(cwd)
    return out


# ----------------------------------------------------------------------------- plain recomputation


def _records(d: Path) -> list[dict[str, Any]]:
    recs = _lines(d / "records.jsonl")
    assert len({r["key"] for r in recs}) == len(recs), f"{d.name}: a problem recorded twice"
    return recs


def _outcomes(cells: dict, topology: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for seed in SEEDS:
        for r in _records(cells[(topology, seed)]):
            if not r["error"]:
                out.setdefault(r["key"], []).append(1.0 if r["passed"] else 0.0)
    return out


def _quantiles(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(values, [0.025, 0.975], method="linear")
    return float(lo), float(hi)


def _cell_interval(outcomes: dict[str, list[float]]) -> tuple[float, float, float]:
    keys = sorted(outcomes)
    s = np.array([sum(outcomes[k]) for k in keys])
    c = np.array([len(outcomes[k]) for k in keys], dtype=float)
    idx = np.random.default_rng(0).integers(0, len(keys), size=(B, len(keys)))
    return (float(s.sum() / c.sum()), *_quantiles(s[idx].sum(axis=1) / c[idx].sum(axis=1)))


def _mcnemar(b: int, c: int) -> float:
    n = b + c
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)


def _paired(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, Any]:
    assert set(a) == set(b)
    keys = sorted(a)
    d = np.array([sum(a[k]) / len(a[k]) - sum(b[k]) / len(b[k]) for k in keys])
    idx = np.random.default_rng(0).integers(0, len(keys), size=(B, len(keys)))
    lo, hi = _quantiles(d[idx].mean(axis=1))
    wins = sum(1 for k in keys for x, y in zip(a[k], b[k]) if x and not y)
    losses = sum(1 for k in keys for x, y in zip(a[k], b[k]) if y and not x)
    return {"diff": float(d.mean()), "low": lo, "high": hi, "wins": wins, "losses": losses, "p": _mcnemar(wins, losses)}


def _holm(ps: list[float]) -> list[float]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def _p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"


def _section(text: str, title: str) -> list[str]:
    part = text.split(title, 1)[1].split("\n\n", 1)[0]
    return part.splitlines()


# ----------------------------------------------------------------------------- the guarantees


def test_every_cell_is_a_member_of_the_sweep(study: dict):
    cells = study["cells"]
    assert set(cells) == {(t, s) for t in TOPOLOGIES for s in SEEDS}
    parent = study["parent"]
    assert parent.data.tags.get("comparison_cells") == str(len(cells)), parent.data.tags
    for t in TOPOLOGIES:  # the report covers both seeds of every topology, the cell run alone first included
        row = next(x for x in _section(study["report"], "pass@1 by topology") if x.startswith(t + " "))
        assert f"(2s × {N_ROWS}p)" in row, row


def test_no_problem_is_solved_twice(study: dict):
    second = study["second"]
    assert second.returncode == 2, second.stdout[-1000:] + second.stderr[-2000:]
    assert str(study["first_pid"]) in second.stderr, second.stderr[-2000:]
    assert study["appended_while_held"] == 0, "the second run appended while the first held the cell"
    keys = [r["key"] for r in study["twice_records"]]
    assert len(keys) == len(set(keys)) == N_ROWS
    for d in study["cells"].values():
        assert len(_records(d)) == N_ROWS, d.name
    assert re.search(
        rf"single·gold·none·s0.*: {N_ROWS} problems, {N_ROWS} already recorded, 0 to run", study["interrupted_log"]
    ), "the cell run alone first was solved again by the sweep"


def test_pass_at_1_and_intervals_match_the_records(study: dict):
    rows = _section(study["report"], "pass@1 by topology")
    for t in TOPOLOGIES:
        est, lo, hi = _cell_interval(_outcomes(study["cells"], t))
        row = next(x for x in rows if x.startswith(t + " "))
        assert f"{est:.3f} [{lo:.3f}, {hi:.3f}] (2s × {N_ROWS}p)" in row, row


def test_per_seed_pass_at_1_matches_the_records(study: dict):
    client = study["client"]
    runs = {
        (r.data.tags.get("topology"), r.data.tags.get("seed")): r
        for r in client.search_runs([study["parent"].info.experiment_id], "tags.cell_key != ''")
        if r.data.tags.get("run_kind") not in ("rescore",)
    }
    for (t, s), d in study["cells"].items():
        recs = [r for r in _records(d) if not r["error"]]
        assert runs[(t, s)].data.metrics["pass_at_1"] == pytest.approx(sum(r["passed"] for r in recs) / len(recs))
        assert runs[(t, s)].data.metrics["n_problems"] == len(_records(d))


def test_paired_comparisons_match_the_records(study: dict):
    cells, text = study["cells"], study["report"]
    base = _outcomes(cells, "single")
    others = [t for t in TOPOLOGIES if t != "single"]
    results = {t: _paired(_outcomes(cells, t), base) for t in others}
    holm = dict(zip(others, _holm([results[t]["p"] for t in others])))
    rows = _section(text, "paired comparison against the baseline")
    for t in others:
        res = results[t]
        row = next(x for x in rows if re.match(rf"gold\s+{t}\s+single\s", x))
        assert f"{res['diff']:+.3f}" in row and f"[{res['low']:+.3f}, {res['high']:+.3f}]" in row, row
        assert f"{res['wins']}/{res['losses']}" in row, row
        cols = row.split()
        assert cols[-4] == f"{res['p']:.3f}" and cols[-3] == _p(holm[t]), row


def test_cost_figures_match_the_records(study: dict):
    rows = _section(study["report"], "cost per problem")
    for t in TOPOLOGIES:
        recs = [r for s in SEEDS for r in _records(study["cells"][(t, s)])]
        solved = sum(bool(r["passed"]) and not r["error"] for r in recs)
        tokens = sum(r["usage"]["total_tokens"] for r in recs)
        row = next(x for x in rows if x.startswith(t + " ")).split()
        assert row[2] == str(len(recs)), row
        assert row[4] == f"{tokens / len(recs):,.0f}", row
        assert row[5] == (f"{tokens / solved:,.0f}" if solved else "–"), row
        assert row[6] == f"{sum(r['usage']['model_calls'] for r in recs) / len(recs):.2f}", row
        assert row[7] == f"{sum(r['usage']['tool_calls'] for r in recs) / len(recs):.2f}", row


def test_the_export_holds_every_problem_of_every_member(study: dict):
    rows = [r for r in study["csv"] if r["judge_profile"] == "seed"]
    assert len(rows) == len(study["cells"]) * N_ROWS
    for (t, s), d in study["cells"].items():
        mine = {r["problem_id"]: r["passed"] == "True" for r in rows if (r["topology"], r["seed"]) == (t, s)}
        assert mine == {r["id"]: bool(r["passed"]) for r in _records(d)}


def test_the_rescore_is_its_own_block_with_its_own_figures(study: dict):
    target = study["rescored"]
    [folder] = list((target / "rescore").iterdir())
    recs = _lines(folder / "records.jsonl")
    assert len(recs) == N_ROWS and all(r["verdict"]["profile"] == "reference" for r in recs)
    ok = [r for r in recs if not r["error"]]
    rows = [r for r in study["csv"] if r["judge_profile"] == "reference"]
    assert sorted((r["problem_id"], r["passed"] == "True") for r in rows) == sorted((r["id"], bool(r["passed"])) for r in ok)
    assert "judge reference (rules" in study["report_all"] and "judge reference (rules" not in study["report"]


# ----------------------------------------------------------------------------- sweeps over settings off the five axes


@dataclass(frozen=True)
class SettingSweep:
    """A sweep over one setting outside the five axes, crossed with the seeds: its flat key, its values as the
    command line gives them (`{dir}`: the study's folder, for files it writes), the value `--compare` takes as
    the baseline, and the rest of the command. Another sweep (a --config-dir preset) is one more entry."""

    topology: str
    key: str
    values: tuple[str, ...]
    baseline: str
    extra: tuple[str, ...] = ("model.gold.wrong_fraction=0.3",)

    @property
    def shown(self) -> str:
        """The setting as the cells' identity (MLflow params, the report) names it: gold's and the local
        server's settings keep the flat names the cell keys were made with (config.flat_model)."""
        return self.key.replace("model.gold.", "model.").replace("model.local.", "model.")


SETTING_SWEEPS = {
    "temperature": SettingSweep("single", "model.temperature", ("0", "0.7"), "0"),
    "wrong_fraction": SettingSweep("single", "model.gold.wrong_fraction", ("0", "0.5"), "0", extra=()),
    "team_size": SettingSweep("independent", "topology.team_size", ("2", "4"), "2"),
    "prompt_file": SettingSweep("single", "topology.prompt_file", ("{dir}/terse.yaml", "{dir}/plain.yaml"), "terse.yaml"),
}
PROMPTS = {  # the prompt files the prompt_file sweep selects (role -> text)
    "terse.yaml": "solver: Solve the problem in Python 3 and end with one fenced python block holding the program.\n",
    "plain.yaml": "solver: |\n  You are a careful programmer. Read the problem, write a Python 3 program, and end your\n"
    "  reply with exactly one ```python fenced block holding the complete program.\n",
}
SETTING_ROWS = 5


@pytest.fixture(scope="module", params=sorted(SETTING_SWEEPS))
def setting_study(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path
) -> dict[str, Any]:
    """The sweep through the CLI (its end-of-sweep comparison printed), then `report --sweep` with the CSV
    export, the same compared along the setting, and `report --metric n_passed` over its experiment."""
    sw = SETTING_SWEEPS[request.param]
    cwd = tmp_path_factory.mktemp(f"setting-{request.param}")
    for name, text in PROMPTS.items():
        (cwd / name).write_text(text)
    db = fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env, experiment = cli_env(cwd), f"setting-{request.param}"
    values = [v.format(dir=cwd) for v in sw.values]
    r = run_cli(
        [
            "-m",
            f"topology={sw.topology}",
            f"{sw.key}={','.join(values)}",
            f"seed={','.join(SEEDS)}",
            "dataset=apps",
            f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
            f"limit={SETTING_ROWS}",
            "progress=false",
            f"tracking.experiment={experiment}",
            *sw.extra,
        ],
        cwd,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out: dict[str, Any] = {"sweep": sw, "sweep_out": r.stdout, "cells": {}, "cwd": cwd, "env": env}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    [parent] = [p for p in client.search_runs([exp.experiment_id]) if p.data.tags.get("sweep") == "true"]
    out["parent"] = parent.info.run_id
    out["parent_table"] = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "sweep_comparison.json", str(cwd))).read_text()
    )
    csv_path = cwd / "problems.csv"
    r = run_cli(["--sweep", parent.info.run_id, "--export", str(csv_path)], cwd, env=env, module="apps_bench.report")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["report"], out["csv"] = r.stdout, list(csv.DictReader(csv_path.open()))
    out["compare"] = run_cli(
        ["--sweep", parent.info.run_id, "--compare", f"{sw.shown}={sw.baseline}"], cwd, env=env, module="apps_bench.report"
    )
    r = run_cli(["--experiment", experiment, "--metric", "n_passed"], cwd, env=env, module="apps_bench.report")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["metric"] = r.stdout
    for d in (cwd / "outputs" / "cells").iterdir():  # (shown value, seed) -> cell folder, from the cell's own config
        node: Any = yaml.safe_load((d / "config.yaml").read_text())
        for part in sw.key.split("."):
            node = node[part]
        value = str(node)
        out["cells"][
            (Path(value).name if "/" in value else value, str(json.loads((d / "cell.json").read_text())["axes"]["seed"]))
        ] = d
    return out


def _setting_outcomes(study: dict[str, Any], value: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for seed in SEEDS:
        for r in _records(study["cells"][(value, seed)]):
            if not r["error"]:
                out.setdefault(r["key"], []).append(1.0 if r["passed"] else 0.0)
    return out


def _setting_values(study: dict[str, Any]) -> list[str]:
    return sorted({v for v, _ in study["cells"]})


def _baseline_value(study: dict[str, Any]) -> str:
    """The value of the baseline's cells as their config holds it (`--compare model.temperature=0`: 0.0)."""
    want = study["sweep"].baseline
    return next(v for v in _setting_values(study) if v == want or v.replace(".", "", 1).isdigit() and float(v) == float(want))


def _pass_rows_say_each_cell(text: str, study: dict[str, Any]) -> None:
    topology = study["sweep"].topology
    rows = [x for x in _section(text, "pass@1 by topology") if x.startswith(topology + " ")]
    assert len(rows) == len(_setting_values(study)), rows  # one row per setting value: every cell under its own label
    for v in _setting_values(study):
        est, lo, hi = _cell_interval(_setting_outcomes(study, v))
        [row] = [x for x in rows if x.split()[:3] == [topology, "gold", v]]
        assert f"{est:.3f} [{lo:.3f}, {hi:.3f}] (2s × {SETTING_ROWS}p)" in row, row
        per_seed = []
        for s in SEEDS:
            ok = [r["passed"] for r in _records(study["cells"][(v, s)]) if not r["error"]]
            per_seed.append(f"s{s} {sum(ok) / len(ok):.3f}")
        assert row.endswith("  ".join(per_seed)), row


def test_a_setting_sweep_shows_each_cell_in_the_report(setting_study: dict):
    assert len(setting_study["cells"]) == len(setting_study["sweep"].values) * len(SEEDS)
    header = next(x for x in _section(setting_study["report"], "pass@1 by topology") if x.startswith("topology"))
    assert header.split()[:3] == ["topology", "model", setting_study["sweep"].shown], header
    _pass_rows_say_each_cell(setting_study["report"], setting_study)


def test_a_setting_sweep_shows_each_cell_in_its_own_comparison(setting_study: dict):
    end = setting_study["sweep_out"].split("every cell has ended", 1)[1]
    _pass_rows_say_each_cell(end, setting_study)
    assert f"--compare {setting_study['sweep'].shown}=" in end.split("full report", 1)[1], end  # where to look next
    table = setting_study["parent_table"]
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    key = setting_study["sweep"].shown
    assert sorted(r["settings"] for r in rows) == sorted(f"{key}={v}" for v in _setting_values(setting_study))
    for r in rows:
        outcomes = _setting_outcomes(setting_study, r["settings"].split("=", 1)[1])
        assert r["pass_at_1"] == pytest.approx(_cell_interval(outcomes)[0]) and r["n_seeds"] == len(SEEDS), r


def test_a_comparison_along_the_setting_matches_the_records(setting_study: dict):
    sw = setting_study["sweep"]
    base = _setting_outcomes(setting_study, _baseline_value(setting_study))
    others = [v for v in _setting_values(setting_study) if v != _baseline_value(setting_study)]
    r = setting_study["compare"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert _section(r.stdout, "pass@1 by topology") == _section(setting_study["report"], "pass@1 by topology")
    rows = _section(r.stdout, "paired comparison against the baseline")
    for v in others:
        res = _paired(_setting_outcomes(setting_study, v), base)
        [row] = [x for x in rows if x.split()[:4] == ["gold", sw.topology, v, f"{sw.shown}={sw.baseline}"]]
        assert f"{res['diff']:+.3f}" in row and f"[{res['low']:+.3f}, {res['high']:+.3f}]" in row, row
        assert f"{res['wins']}/{res['losses']}" in row, row
        cols = row.split()
        assert cols[-4] == _p(res["p"]) and cols[-3] == _p(_holm([res["p"]])[0]), row


def test_a_setting_sweep_s_cost_and_other_metrics_match_the_records(setting_study: dict):
    topology = setting_study["sweep"].topology
    cost = _section(setting_study["report"], "cost per problem")
    metric = setting_study["metric"].splitlines()
    assert metric[1].split() == ["topology", setting_study["sweep"].shown, "gold"], metric
    for v in _setting_values(setting_study):
        recs = [r for s in SEEDS for r in _records(setting_study["cells"][(v, s)])]
        tokens = sum(r["usage"]["total_tokens"] for r in recs)
        [row] = [x.split() for x in cost if x.split()[:3] == [topology, "gold", v]]
        assert row[3] == str(len(recs)) and row[5] == f"{tokens / len(recs):,.0f}", row
        passed = [
            float(sum(bool(r["passed"]) for r in _records(setting_study["cells"][(v, s)]) if not r["error"])) for s in SEEDS
        ]
        [line] = [x for x in metric if x.split()[:2] == [topology, v]]
        assert f"{np.mean(passed):.3f} ± {np.std(passed, ddof=1):.3f} ({len(SEEDS)})" in line, line
    for (v, s), d in setting_study["cells"].items():  # the export: each cell's problems under its own key
        key = json.loads((d / "cell.json").read_text())["key"]
        mine = {r["problem_id"]: r["passed"] == "True" for r in setting_study["csv"] if r["cell_key"] == key}
        assert mine == {r["id"]: bool(r["passed"]) for r in _records(d)}, (v, s)


def test_what_the_report_cannot_tell_apart_or_compare_along_is_refused(setting_study: dict, tmp_path: Path):
    sw, cwd, env = setting_study["sweep"], setting_study["cwd"], setting_study["env"]

    def refused(*args: str) -> str:
        r = run_cli(list(args), cwd, env=env, module="apps_bench.report")
        assert r.returncode == 2 and r.stdout == "", r.stdout[-2000:] + r.stderr[-2000:]
        return r.stderr

    typo = sw.shown[:-1]
    err = refused("--sweep", setting_study["parent"], "--compare", f"{typo}={sw.baseline}")
    assert f"{typo} is not a setting these cells differ in; did you mean --compare {sw.shown}={sw.baseline}?" in err, err
    err = refused("--sweep", setting_study["parent"], "--compare", f"{sw.shown}=nowhere")
    assert f"no cell has {sw.shown}=nowhere" in err, err
    # two folders of one cell under two keys (a copy with its key edited): nothing tells them apart
    cell = setting_study["cells"][(_baseline_value(setting_study), "0")]
    for n in ("1", "2"):
        copy = tmp_path / "cells" / f"{cell.name}-{n}"
        shutil.copytree(cell, copy, ignore=shutil.ignore_patterns("*.lock", "rescore"))
        info = json.loads((copy / "cell.json").read_text())
        info["key"] += n
        (copy / "cell.json").write_text(json.dumps(info))
    err = refused("--cells-dir", str(tmp_path / "cells"))
    assert "cannot tell apart 2 cells labelled" in err and "never pools cells that differ" in err, err


# ----------------------------------------------------------------------------- a --config-dir model preset


@pytest.fixture(scope="module")
def preset_study(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict[str, Any]:
    """`-m model=gold,goldhalf seed=0,1 --config-dir DIR` where DIR/model/goldhalf.yaml is gold answering half
    the problems wrong; then `report --sweep`. Cells keyed by (model, seed) from their own cell.json."""
    cwd = tmp_path_factory.mktemp("preset")
    presets = config_dir_preset(cwd / "presets", "goldhalf", **{"gold.wrong_fraction": 0.5})
    fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env = cli_env(cwd)
    r = run_cli(
        [
            "--config-dir",
            str(presets),
            "-m",
            "model=gold,goldhalf",
            f"seed={','.join(SEEDS)}",
            "dataset=apps",
            f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
            f"limit={SETTING_ROWS}",
            "progress=false",
            "allow_any_cell=true",
            "tracking.experiment=preset",
        ],
        cwd,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out: dict[str, Any] = {"sweep_out": r.stdout, "cells": {}}
    r = run_cli(
        ["--config-dir", str(presets), "--experiment", "preset", "--model", "goldhalf"], cwd, env=env, module="apps_bench.report"
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["report_one"] = r.stdout
    r = run_cli(["--experiment", "preset"], cwd, env=env, module="apps_bench.report")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out["report"] = r.stdout
    for d in (cwd / "outputs" / "cells").iterdir():
        axes = json.loads((d / "cell.json").read_text())["axes"]
        out["cells"][(axes["model"], str(axes["seed"]))] = d
    return out


def _preset_rows_say_each_cell(text: str, study: dict[str, Any], models: tuple[str, ...]) -> None:
    rows = [x for x in _section(text, "pass@1 by topology") if x.startswith("single ")]
    assert sorted(x.split()[1] for x in rows) == sorted(models), rows  # one row per preset, under its own name
    for model in models:
        outcomes: dict[str, list[float]] = {}
        for s in SEEDS:
            for rec in _records(study["cells"][(model, s)]):
                if not rec["error"]:
                    outcomes.setdefault(rec["key"], []).append(1.0 if rec["passed"] else 0.0)
        est, lo, hi = _cell_interval(outcomes)
        [row] = [x for x in rows if x.split()[1] == model]
        assert f"{est:.3f} [{lo:.3f}, {hi:.3f}] (2s × {SETTING_ROWS}p)" in row, row


def test_a_config_dir_preset_is_its_own_cell_in_every_view(preset_study: dict):
    assert sorted(preset_study["cells"]) == sorted((m, s) for m in ("gold", "goldhalf") for s in SEEDS)
    keys = {json.loads((d / "cell.json").read_text())["key"] for d in preset_study["cells"].values()}
    assert len(keys) == 4  # the preset changes what runs: its own key, never gold's
    half = [r for s in SEEDS for r in _records(preset_study["cells"][("goldhalf", s)])]
    assert not all(r["passed"] for r in half)  # the overlay took effect: gold alone passes every row
    end = preset_study["sweep_out"].split("every cell has ended", 1)[1]
    for text in (preset_study["report"], end):
        _preset_rows_say_each_cell(text, preset_study, ("gold", "goldhalf"))
    _preset_rows_say_each_cell(preset_study["report_one"], preset_study, ("goldhalf",))
