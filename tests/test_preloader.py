"""The preloader (apps_bench/preloader.py): its topology guess, a wrong guess, a preloader
that is gone, and what it hands the helpers."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from apps_bench import preloader
from apps_bench import types
from conftest import cli_env, fresh_store, run_cli

CONF = Path(preloader.__file__).resolve().parent / "conf"


def test_the_guess_is_the_command_lines_topology_else_the_configs_default():
    assert preloader.guess_topology(["dataset=apps", "topology=centralized_autogen"]) == "centralized_autogen"
    assert preloader.guess_topology(["+topology=independent", "topology=decentralized_openai"]) == "decentralized_openai"
    assert preloader.guess_topology(["topology.max_steps=3"]) == preloader.guess_topology([])  # a setting, not the group
    from apps_bench.config import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        default = compose(config_name="config").topology.name
    assert preloader.guess_topology([]) == default


def test_helpers_are_handed_problems_without_their_tests():
    p = types.Problem(
        id="7", question="Q?", tests=types.TestSuite(inputs=("1\n",), outputs=("2\n",), fn_name="f", n_available=3),
        starter_code="def f(x):", difficulty="interview", solutions=("secret",), split="train",
    )  # fmt: skip
    q = preloader._without_tests(p)
    assert q.tests.inputs == () and q.tests.outputs == () and q.solutions == ()
    assert (q.id, q.question, q.starter_code, q.difficulty, q.split) == (p.id, p.question, p.starter_code, p.difficulty, p.split)
    assert q.tests.mode == "call" and q.tests.fn_name == "f"  # what framing needs stays


def test_a_preloader_that_is_gone_sends_the_cell_back_in_process(capsys: pytest.CaptureFixture[str]):
    preloader.start(["topology=single"])
    pre = preloader.take()
    assert pre is not None and preloader.take() is None  # handed out once
    os.kill(pre.pid, signal.SIGKILL)
    got = pre.spawn(2, [], cfg={}, endpoint=None, prompts=None, threads=2)
    assert got is None
    assert "the preloader could not start the solvers (the preloader process is gone)" in capsys.readouterr().err
    with pytest.raises(ChildProcessError):  # and it was reaped
        os.waitpid(pre.pid, os.WNOHANG)


@pytest.mark.slow
def test_a_wrong_guess_costs_time_not_the_cell(tmp_path: Path, mlflow_template: Path):
    """An experiment picks the topology, so the command line names none: the preloader
    imports the default's framework (LangGraph), and the cell runs on the OpenAI SDK."""
    exp = tmp_path / "conf" / "experiment"
    exp.mkdir(parents=True)
    (exp / "openai_team.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /topology: decentralized_openai\n"
    )
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(
        ["--config-dir", str(tmp_path / "conf"), "experiment=openai_team", "processes=2", "progress=false"],
        tmp_path, env=cli_env(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [cell] = sorted(p for p in (tmp_path / "outputs" / "cells").iterdir() if p.is_dir())
    recs = [json.loads(x) for x in (cell / "records.jsonl").read_text().splitlines() if x.strip()]
    assert json.loads((cell / "summary.json").read_text())["cell"]["topology"] == "decentralized_openai"
    assert len(recs) == 2 and all(x["passed"] and not x["error"] for x in recs)
    assert {x["solver"] for x in recs} <= {"helper-1", "helper-2"}  # preloaded helpers solved them
