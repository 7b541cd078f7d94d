"""The tracking store checked at the start, through the real CLI: a server that does not answer,
refuses this host (a real `mlflow server` with --allowed-hosts) or wants a login fails at once with
exit 2 and the fix, with nothing created; a real server killed mid-cell loses nothing, and the
rerun with the server back solves nothing and logs the cell."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import cli_env, free_port, run_cli

pytestmark = pytest.mark.slow


def _nothing_created(cwd: Path, r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "nothing was created" in r.stderr
    assert not (cwd / "outputs").exists(), sorted(str(p) for p in (cwd / "outputs").rglob("*"))  # no cell, no Hydra run
    assert not (cwd / "mlruns").exists()


def test_a_server_that_does_not_answer_fails_at_once(tmp_path: Path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = run_cli(["progress=false"], tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), timeout=120)
    _nothing_created(tmp_path, r)
    assert f"the MLflow tracking server at {uri} does not answer" in r.stderr and "launchers/mlflow_server.sh" in r.stderr
    assert "Retry" not in r.stderr  # no urllib3 retry warnings: one request

    sweep = run_cli(["-m", "seed=0,1", "progress=false"], tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), timeout=120)
    _nothing_created(tmp_path, sweep)
    assert sweep.stderr.count("does not answer") == 1  # checked once, by the launching process


class _LoginRequired(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        body = b"You are not authenticated. Please see the docs."
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_wants_a_login_says_so(tmp_path: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LoginRequired)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_port}"
        r = run_cli(["progress=false"], tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri), timeout=120)
    finally:
        server.shutdown()
    _nothing_created(tmp_path, r)
    assert "HTTP 401" in r.stderr and "MLFLOW_TRACKING_USERNAME" in r.stderr and "none were given" in r.stderr
    assert len(_LoginRequired.seen) == 1  # one request, not MLflow's retries


def _start_server(root: Path, port: int, *extra: str) -> subprocess.Popen:
    """A real `mlflow server` on 127.0.0.1:`port` with its store under `root`, once it answers HTTP."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = (root / "server.log").open("a")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--serve-artifacts",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            *extra,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).close()
            return proc
        except urllib.error.HTTPError:
            return proc  # it answers (a refusal is an answer)
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
        time.sleep(0.3)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the server and its worker, at once
    proc.wait(timeout=30)


def test_a_server_that_refuses_this_host_says_how_to_allow_it(tmp_path: Path):
    port = free_port()
    server = _start_server(tmp_path / "server", port, "--allowed-hosts", "mlflow.example.invalid")
    try:
        cwd = tmp_path / "work"
        cwd.mkdir()
        r = run_cli(["progress=false"], cwd, env=cli_env(cwd, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}"), timeout=120)
    finally:
        _stop(server)
    _nothing_created(cwd, r)
    assert "HTTP 403" in r.stderr and "MLFLOW_SERVER_ALLOWED_HOSTS" in r.stderr


N = 5


def _records(cell: Path) -> list[dict]:
    path = cell / "records.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _logged_params(db: Path) -> int:
    """Params the server's store holds (read with sqlite3: the server may be busy writing)."""
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return int(con.execute("SELECT COUNT(*) FROM params").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def test_a_server_lost_mid_cell_loses_nothing_and_the_rerun_only_logs(tmp_path: Path, apps_data_dir: Path):
    root, port = tmp_path / "server", free_port()
    uri = f"http://127.0.0.1:{port}"
    cwd, cell = tmp_path / "work", tmp_path / "cell"
    cwd.mkdir()
    env = cli_env(cwd, MLFLOW_TRACKING_URI=uri)
    args = [
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "dataset.split=train",
        f"limit={N}",
        "concurrency=1",
        "processes=1",
        "progress=false",
        f"out_dir={cell}",
    ]
    server = _start_server(root, port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args, "model.gold.latency_ms=300"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (_logged_params(root / "mlflow.db") and len(_records(cell)) >= 2):  # its run open, mid-cell
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the cell never reached its second record with its run open"
            time.sleep(0.1)
        n_at_kill = len(_records(cell))
        _stop(server)  # the store goes away while the cell runs
        out = proc.communicate(timeout=280)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert n_at_kill < N
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and f"the MLflow store at {uri} does not answer any more" in out
    assert f"Nothing computed is lost: {cell} keeps every record ({N} of {N} problems recorded)" in out
    assert "it logs the finished cell to its MLflow run without solving anything again" in out
    recorded = {r["key"]: r["completed_at"] for r in _records(cell)}
    assert len(recorded) == N and (cell / "summary.json").exists()

    server = _start_server(root, port)  # the store is back, with what it held
    try:
        r = run_cli(args, cwd, env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"{N} already recorded, 0 to run" in r.stderr
        assert {x["key"]: x["completed_at"] for x in _records(cell)} == recorded  # nothing solved again
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=uri)
        runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    finally:
        _stop(server)
    [run] = [x for x in runs if x.data.tags.get("cell_key")]  # the cell's one run, continued
    assert run.info.status == "FINISHED" and run.data.metrics["n_recorded"] == N
