"""One multirun over all eight topologies: eight child runs under one parent in MLflow (issue 4)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import cli_env, fresh_store, run_cli

pytestmark = pytest.mark.slow

TOPOLOGIES = {
    "single": "langgraph",
    "independent": "langgraph",
    "sequential_langgraph": "langgraph",
    "sequential_crewai": "crewai",
    "centralized_langgraph": "langgraph",
    "centralized_autogen": "autogen",
    "decentralized_langgraph": "langgraph",
    "decentralized_openai": "openai",
}


def test_multirun_over_all_eight_topologies(tmp_path: Path, mlflow_template: Path):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    db = fresh_store(mlflow_template, tmp_path / "store" / "mlflow.db")
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    r = run_cli(["-m", f"topology={','.join(TOPOLOGIES)}", "progress=false"], tmp_path, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    [parent] = [x for x in runs if x.data.tags.get("sweep") == "true"]
    kids = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(kids) == 8 and len(runs) == 9
    assert {k.data.tags["topology"] for k in kids} == set(TOPOLOGIES)
    for k in kids:
        name = k.data.tags["topology"]
        assert k.info.status == "FINISHED", name
        assert k.data.metrics["pass_at_1"] == 1.0, name  # gold answers every demo problem correctly
        assert k.data.tags.get("framework") == TOPOLOGIES[name], (name, k.data.tags)
        assert k.data.metrics["model_calls"] >= 2, (name, k.data.metrics)  # counted at the HTTP layer
    # the multi-agent teams talk more than the single agent: their flows show in the counts
    calls = {k.data.tags["topology"]: k.data.metrics["model_calls"] for k in kids}
    assert all(calls[t] > calls["single"] for t in TOPOLOGIES if t != "single"), calls
