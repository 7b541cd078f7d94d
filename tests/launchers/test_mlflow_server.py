"""launchers/mlflow_server.sh: the address it prints is one the server accepts."""

from __future__ import annotations

import pytest

from launchers.cluster_env import MlflowServer, Netns

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
