"""launchers/mlflow_server.sh: the address it prints is one the server accepts."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from launchers.cluster_env import MlflowServer, Netns, start_mlflow_server

pytestmark = pytest.mark.slow


def test_server_accepts_printed_address_and_runs_no_job_runner(netns: Netns, mlflow_server: MlflowServer) -> None:
    probe = (
        "import mlflow, sys; mlflow.set_tracking_uri(sys.argv[1]);"
        "e = mlflow.set_experiment('probe');"
        "r = mlflow.start_run(); mlflow.log_metric('m', 1.5); mlflow.log_text('hi', 'a.txt'); mlflow.end_run();"
        "print(r.info.run_id)"
    )
    out = netns.run([_py(), "-c", probe, mlflow_server.uri], timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    run_id = out.stdout.split()[-1]
    run = mlflow_server.client().get_run(run_id)
    assert run.data.metrics["m"] == 1.5
    exp = run.info.experiment_id
    assert (mlflow_server.artifact_root / exp / run_id / "artifacts" / "a.txt").read_text() == "hi"
    # no GenAI job runner (huey consumers): the server is gunicorn/uvicorn workers only
    procs = [p for p in netns.pids() if _cmdline(p)]
    assert not [p for p in procs if "huey" in _cmdline(p) or "job_runner" in _cmdline(p)], [_cmdline(p) for p in procs]


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _py() -> str:
    import sys

    return sys.executable


def test_team_server_prints_this_hosts_name_and_accepts_it(netns: Netns, tmp_path: Path) -> None:
    """HOST=0.0.0.0 (inside the namespace: still unreachable from outside): the printed address uses
    this host's name, which MLflow's Host-header guard refuses unless the script allowed it."""
    server = start_mlflow_server(netns, tmp_path / "team", port=5056, workers=1, host="0.0.0.0")
    try:
        host = urlsplit(server.uri).hostname
        assert host not in ("127.0.0.1", "localhost") and server.uri.endswith(":5056"), server.uri
        probe = (
            "import sys, urllib.request, urllib.error\n"
            "def status(host):\n"
            "    req = urllib.request.Request('http://127.0.0.1:5056/api/2.0/mlflow/experiments/search?max_results=1',"
            " headers={'Host': host})\n"
            "    try:\n"
            "        return urllib.request.urlopen(req, timeout=10).status\n"
            "    except urllib.error.HTTPError as e:\n"
            "        return e.code\n"
            "print(status(sys.argv[1]), status('elsewhere.example:5056'))\n"
        )
        out = netns.run([_py(), "-c", probe, f"{host}:5056"], timeout=60)
        assert out.stdout.split() == ["200", "403"], out.stdout + out.stderr  # the guard is on; our name passes
        run = netns.run(
            [_py(), "-c", "import mlflow,sys; mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_experiment('t')", server.uri]
        )
        assert run.returncode == 0, run.stderr[-2000:]
    finally:
        server.stop()
