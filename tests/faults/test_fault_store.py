"""The tracking store fails (#43 point 1): a closed port, and a real `mlflow server` that goes away at a chosen
request (a proxy in front of it dies there, as a killed server does), through the real CLI.

Every command answers in seconds with one line (what failed, what is safe, the fix) and its exit code, never a
traceback; nothing is half made; a store lost once a cell's records are safe never fails the cell, and the rerun
logs what is missing without solving anything again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_env, free_port, mlflow_server, run_cli
from faults.http_proxy import DyingProxy, Request

SWEEP = ["-m", "seed=0,1", "model=gold", "dataset=demo", "progress=false"]


def _one_line(stderr: str, prog: str) -> str:
    said = [line for line in stderr.splitlines() if line.startswith(f"{prog}: ")]
    assert len(said) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    return said[0]


@pytest.fixture(scope="module")
def demo_cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished demo cell (no tracking), to be re-scored."""
    cwd = tmp_path_factory.mktemp("demo_cell")
    r = run_cli(["tracking=none", "progress=false"], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (cell,) = (cwd / "outputs" / "cells").iterdir()
    return cell


def test_report_at_a_closed_port_says_so_at_once(tmp_path: Path):
    uri = f"http://127.0.0.1:{free_port()}"
    r = run_cli(["--tracking-uri", uri], tmp_path, module="apps_bench.report", timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    line = _one_line(r.stderr, "apps-bench report")
    assert uri in line and "does not answer" in line and "The report only reads" in line
    assert not (tmp_path / "outputs").exists()
    debug = run_cli(["--tracking-uri", uri, "--debug"], tmp_path, module="apps_bench.report", timeout=120)
    assert debug.returncode == 2 and "Traceback" in debug.stderr  # the traceback when asked for
    assert debug.stderr.strip().splitlines()[-1] == line


def test_rescore_at_a_closed_port_says_so_at_once_and_makes_no_folder(tmp_path: Path, demo_cell: Path):
    uri = f"http://127.0.0.1:{free_port()}"
    r = run_cli(
        [str(demo_cell), "judge=reference"],
        tmp_path,
        env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri),
        module="apps_bench.rescore",
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    line = _one_line(r.stderr, "apps-bench rescore")
    assert uri in line and "does not answer" in line
    assert not (demo_cell / "rescore").exists()


def _finished_updates(n: int):
    """Dies at the `n`th request that ends a run FINISHED (each cell's run, then the sweep's parent run)."""
    seen = [0]

    def dies(request: Request) -> bool:
        if request.path.endswith("/runs/update") and b'"FINISHED"' in request.body:
            seen[0] += 1
            return seen[0] == n
        return False

    return dies


def _records(cwd: Path) -> dict[str, list[str]]:
    return {
        c.name: [json.loads(x)["key"] for x in (c / "records.jsonl").read_text().splitlines() if x.strip()]
        for c in sorted((cwd / "outputs" / "cells").iterdir())
    }


@pytest.mark.slow
def test_a_store_lost_as_the_sweep_ends_fails_no_cell_and_the_rerun_logs_the_rest(tmp_path: Path):
    from mlflow import MlflowClient

    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as uri:
        # the last cell's run is ended FINISHED: that request, and every later one, finds the server gone
        with DyingProxy(uri, _finished_updates(2)).running() as proxy:
            r = run_cli(SWEEP, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=proxy.url), timeout=600)
            assert proxy.dead.is_set()
        out = r.stdout + r.stderr
        assert r.returncode == 2, out[-4000:]
        assert "Traceback" not in out and "Error executing job" not in out
        said = [line for line in r.stderr.splitlines() if line.startswith("apps-bench: ") and proxy.url in line]
        assert said and any("parent run" in line and "stays open" in line for line in said), r.stderr[-3000:]
        first = _records(tmp_path)
        assert len(first) == 2 and all(sorted(keys) == sorted(set(keys)) and len(keys) == 2 for keys in first.values())

        again = run_cli(SWEEP, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), timeout=600)
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        assert again.stderr.count("2 already recorded, 0 to run") == 2  # nothing solved again
        assert _records(tmp_path) == first  # unique and complete, nothing recorded twice
        c = MlflowClient(tracking_uri=uri)
        runs = c.search_runs([c.get_experiment_by_name("apps").experiment_id])
        cells = [x for x in runs if x.data.tags.get("cell_key")]
        parents = sorted((x for x in runs if x.data.tags.get("sweep") == "true"), key=lambda x: x.info.start_time)
        assert len(cells) == 2 and all(x.info.status == "FINISHED" for x in cells)
        # a parent run per launch: the rerun's FINISHED, linking the first's, which the lost store left RUNNING:
        # the rerun's launch ends it FAILED, saying why
        assert len(parents) == 2 and [x.info.status for x in parents] == ["FAILED", "FINISHED"]
        assert parents[1].data.tags["sweep_earlier_run"] == parents[0].info.run_id
        assert "lost the tracking store" in parents[0].data.tags["error"]


@pytest.mark.slow
def test_a_store_killed_while_the_report_reads_it_is_one_line(tmp_path: Path):
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as uri:
        cell = run_cli(["progress=false"], tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri))  # a cell to report
        assert cell.returncode == 0, cell.stderr[-3000:]
        reads = [0]

        def dies(request: Request) -> bool:  # the report's third call through MLflow's client: mid-report
            if request.path.startswith("/api/2.0/mlflow/") and "apps-bench-store-check" not in request.user_agent:
                reads[0] += 1
            return reads[0] == 3

        with DyingProxy(uri, dies).running() as proxy:
            r = run_cli(["--tracking-uri", proxy.url], tmp_path, module="apps_bench.report", timeout=300)
            assert proxy.dead.is_set()
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    line = _one_line(r.stderr, "apps-bench report")
    assert f"the MLflow store at {proxy.url} does not answer any more" in line and "only reads" in line
