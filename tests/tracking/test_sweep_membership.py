"""Sweep membership that does not depend on order (apps_bench/tracking/membership.py) and the
comparison a sweep publishes once, at its end (apps_bench/report/sweep_run.py): the real CLI, gold
on real APPS rows, a real SQLite store and a real `mlflow server` on 127.0.0.1 (whose access log
counts every upload of the comparison)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, plain_mlflow_server, run_cli

from apps_bench.report import sweep_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _common(data_dir: Path, *extra: str) -> list[str]:
    return ["model=gold", "dataset=apps", f"dataset.path={data_dir / 'train_mini150.jsonl'}", "limit=3", "progress=false", *extra]


SWEEP_TIMEOUT = 900  # a loaded 2-core machine: a 4-cell gold sweep can take minutes


def _parent_id(stderr: str) -> str:
    m = re.search(r"MLflow parent run ([0-9a-f]{32})", stderr)
    assert m, stderr[-3000:]
    return m.group(1)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _cell_runs(uri: str, experiment: str = "apps") -> list:
    c = _client(uri)
    exp = c.get_experiment_by_name(experiment).experiment_id
    return [r for r in c.search_runs([exp]) if r.data.tags.get("cell_key")]


def _records(cwd: Path, topology: str, seed: int) -> list[dict]:
    [d] = [d for d in (cwd / "outputs" / "cells").iterdir() if f"-{topology}-gold-none-s{seed}-" in d.name]
    return [json.loads(line) for line in (d / "records.jsonl").read_text().splitlines()]


def _rows(uri: str, parent: str) -> set[tuple[str, str, int]]:
    return {(r["topology"], r["seeds"], r["n_problems"]) for r in sweep_run.read(uri, parent)}


def test_a_cell_that_ran_alone_first_is_one_of_the_sweeps_cells(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    """The natural first step, then the sweep: the resumed cell joins it without solving anything again."""
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    uri = f"sqlite:///{db}"
    alone = run_cli(["topology=single", "seed=0", *_common(apps_data_dir)], tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    first = _records(tmp_path, "single", 0)
    assert len(first) == 3

    r = run_cli(
        ["-m", "topology=single,sequential_langgraph", "seed=0,1", *_common(apps_data_dir)], tmp_path, timeout=SWEEP_TIMEOUT
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3 already recorded, 0 to run" in r.stderr
    parent = _parent_id(r.stderr)
    tags = _client(uri).get_run(parent).data.tags
    assert tags["n_cells"] == tags["comparison_cells"] == "4", tags
    assert _rows(uri, parent) == {("single", "0,1", 3), ("sequential_langgraph", "0,1", 3)}
    rep = run_cli(["--sweep", parent], tmp_path, module="apps_bench.report")
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert re.search(r"^single .*\(2s × 3p\)", rep.stdout, re.M), rep.stdout
    assert _records(tmp_path, "single", 0) == first  # nothing solved twice
    # the run it made alone is nested under the sweep in MLflow's UI too
    [alone_run] = [x for x in _cell_runs(uri) if x.data.tags["topology"] == "single" and x.data.tags["seed"] == "0"]
    assert alone_run.data.tags["mlflow.parentRunId"] == parent


def test_a_cell_of_two_sweeps_counts_in_both_and_each_sweep_publishes_once(tmp_path: Path, loopback_mlflow, apps_data_dir: Path):
    """Against a tracking server (cells on other hosts): a cell an earlier sweep ran is listed by
    both sweeps (it stays nested under the first); the comparison is uploaded once per sweep run,
    by the launching process at the end, never by the finishing cells."""
    server = loopback_mlflow
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=server.url)
    common = _common(apps_data_dir, "tracking.experiment=two_sweeps")
    a = run_cli(["-m", "topology=single", "seed=0,1", *common], tmp_path, env=env, timeout=SWEEP_TIMEOUT)
    assert a.returncode == 0, a.stderr[-3000:]
    b = run_cli(["-m", "topology=single,sequential_langgraph", "seed=0", *common], tmp_path, env=env, timeout=SWEEP_TIMEOUT)
    assert b.returncode == 0, b.stderr[-3000:]
    pa, pb = _parent_id(a.stderr), _parent_id(b.stderr)
    assert pa != pb and "3 already recorded, 0 to run" in b.stderr
    c = _client(server.url)
    for parent, rows in ((pa, {("single", "0,1", 3)}), (pb, {("single", "0", 3), ("sequential_langgraph", "0", 3)})):
        run = c.get_run(parent)
        assert run.info.status == "FINISHED" and run.data.tags["comparison_cells"] == run.data.tags["n_cells"] == "2"
        assert _rows(server.url, parent) == rows
        rep = run_cli(["--sweep", parent], tmp_path, env=env, module="apps_bench.report")
        assert rep.returncode == 0, rep.stderr[-3000:]
        assert set(re.findall(r"^(\S+) .*\(\ds × 3p\)", rep.stdout, re.M)) == {t for t, _, _ in rows}, rep.stdout
    [shared] = [
        x for x in _cell_runs(server.url, "two_sweeps") if (x.data.tags["topology"], x.data.tags["seed"]) == ("single", "0")
    ]
    assert shared.data.tags["mlflow.parentRunId"] == pa
    assert [server.artifact_writes(p, sweep_run.TABLE) for p in (pa, pb)] == [1, 1]

    # a rerun of a sweep is a launch of its own: its parent publishes once at its end, solving nothing,
    # and the earlier launch's parent is left as it was
    b2 = run_cli(["-m", "topology=single,sequential_langgraph", "seed=0", *common], tmp_path, env=env, timeout=SWEEP_TIMEOUT)
    assert b2.returncode == 0, b2.stderr[-3000:]
    pb2 = _parent_id(b2.stderr)
    assert pb2 not in (pa, pb) and b2.stderr.count("3 already recorded, 0 to run") == 2
    assert c.get_run(pb2).data.tags["sweep_earlier_run"] == pb and _rows(server.url, pb2) == _rows(server.url, pb)
    assert [server.artifact_writes(p, sweep_run.TABLE) for p in (pa, pb, pb2)] == [1, 1, 1]


LOSE = '''
from pathlib import Path
from urllib.parse import urlparse
from hydra.experimental.callback import Callback
from mlflow.tracking import MlflowClient
from apps_bench.tracking.callbacks import active_sweep


class LoseRecords(Callback):
    """An artifact store that lost one cell's records after the cell ended, before the sweep's end
    (this callback's end runs before the tracking callback's: Hydra ends callbacks in reverse)."""

    def on_multirun_end(self, config, **kwargs):
        uri, parent = active_sweep()
        c = MlflowClient(uri)
        exp = c.get_run(parent).info.experiment_id
        [run] = c.search_runs([exp], filter_string="tags.topology = 'sequential_langgraph' and tags.seed = '1'")
        for name in ("records.jsonl", "problems.json"):
            (Path(urlparse(run.info.artifact_uri).path) / name).unlink()
        Path("lost").write_text(run.data.tags["cell_name"])
'''


def test_a_member_missing_at_the_sweeps_end_is_named_never_a_smaller_table(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    uri = f"sqlite:///{db}"
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "h2_lose.py").write_text(LOSE)
    env = cli_env(tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path / "probe"), os.environ.get("PYTHONPATH", "")]))
    args = ["-m", "topology=single,sequential_langgraph", "seed=0,1", *_common(apps_data_dir)]
    r = run_cli([*args, "+hydra.callbacks.lose._target_=h2_lose.LoseRecords"], tmp_path, env=env, timeout=SWEEP_TIMEOUT)
    lost = (tmp_path / "lost").read_text()
    assert r.returncode == 1, r.stderr[-3000:]
    assert "1 member cell(s) missing" in r.stderr and lost in r.stderr and "no per-problem records" in r.stderr
    parent = _parent_id(r.stderr)
    run = _client(uri).get_run(parent)
    assert run.info.status == "FAILED" and lost in run.data.tags["comparison_missing"] and lost in run.data.tags["error"]
    assert sweep_run.TABLE not in {f.path for f in _client(uri).list_artifacts(parent)}  # no smaller table

    rep = run_cli(["--sweep", parent], tmp_path, module="apps_bench.report")
    assert rep.returncode == 1 and lost in rep.stderr and "Traceback" not in rep.stderr, rep.stderr[-3000:]
    assert "pass@1" not in rep.stdout
    part = run_cli(["--sweep", parent, "--include-incomplete"], tmp_path, module="apps_bench.report")
    assert part.returncode == 0 and "1 member cell(s) missing" in part.stdout and lost in part.stdout

    # the rerun logs the cell again from its folder (nothing solved again) and its own parent publishes the whole
    # table; the failed launch's parent is left as it ended
    failed = _client(uri).get_run(parent)
    again = run_cli(args, tmp_path, timeout=SWEEP_TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = _parent_id(again.stderr)
    assert rerun != parent and again.stderr.count("3 already recorded, 0 to run") == 4
    tags = _client(uri).get_run(rerun).data.tags
    assert tags["comparison_cells"] == "4" and "comparison_missing" not in tags and "error" not in tags
    assert tags["sweep_earlier_run"] == parent
    assert _rows(uri, rerun) == {("single", "0,1", 3), ("sequential_langgraph", "0,1", 3)}
    then = _client(uri).get_run(parent)
    assert (then.info.status, then.info.end_time, then.data.tags) == (failed.info.status, failed.info.end_time, failed.data.tags)


# ----------------------------------------------------------- a real MLflow server on loopback


@pytest.fixture(scope="module")
def loopback_mlflow(tmp_path_factory: pytest.TempPathFactory):
    with plain_mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as server:
        yield server
