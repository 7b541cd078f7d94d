"""A cell's start: the quick part of the server check, and the refusal of a tool-using topology
on a server that drops its tools.

A cell on a real model asks, before it creates anything, what the server does with a request
offering a tool in the cell's framework's own shape (models/server_check.py, `quick_findings`),
cached per endpoint, model and server identity in `server_check.cache`. A topology whose roles
are given tools, on a server that leaves them out (or returns calls as text), is refused
(exit 2, nothing written) unless `model.accept_tool_drop=true`. The result goes into the cell's
provenance (`server`), so its MLflow tags say what the server did with the tools and the report
does not compare cells whose servers differed in that.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack
from pathlib import Path

from apps_bench.config.schema import Config
from apps_bench.errors import AppsBenchError
from apps_bench.models import open_endpoint
from apps_bench.models import server_check as sc
from apps_bench.models.endpoint import Endpoint
from apps_bench.models.local import server_for
from apps_bench.topologies.tool_use import roles_offered_tools
from apps_bench.types import JsonObject


class ToolDropRefused(AppsBenchError):
    """The cell's topology needs tools and the server drops them; the message says what to do."""


REFUSED_VERDICTS = ("dropped", "as_text", "error")


def needs_tools(config: Config) -> bool:
    """The topology gives roles tools through the API (CrewAI describes its tools in the prompt)."""
    return config.topology.framework != "crewai" and bool(roles_offered_tools(config.topology))


def cell_check(config: Config, endpoint: Endpoint | None) -> JsonObject:
    """The server's verdict on this cell's tool requests (cached), or the refusal.

    `endpoint`: the remote endpoint prepare probed; None for a server the cell starts itself
    (gold: not checked, it is the harness's own double; local: started here on a cache miss)."""
    framework = config.topology.framework
    base = {"framework": framework, "needs_tools": needs_tools(config), "accepted": config.model.accept_tool_drop}
    if config.model.provider == "gold":
        return {**base, "tools": sc.NOT_CHECKED, "kind": "gold", "why": "model=gold: the harness's own double"}
    if not config.server_check.at_cell_start:
        return {**base, "tools": sc.NOT_CHECKED, "why": "server_check.at_cell_start=false"}
    with ExitStack() as stack:
        if endpoint is None:
            server = sc.local_server_identity(server_for(config.model), config.model.model_id)
            key = sc.cache_key("local", config.model.model_id, server, framework)
        else:
            server = sc.describe_server(endpoint, config.model)
            key = sc.cache_key(endpoint.provider, endpoint.model_id, server, framework)
        path = Path(config.server_check.cache).expanduser()
        entry = sc.cache_read(path, key, config.server_check.cache_max_age_s, "local" if endpoint is None else endpoint.provider)
        cached = entry is not None
        if entry is None:
            if endpoint is None:
                endpoint = stack.enter_context(open_endpoint(config.model, ()))
            findings = asyncio.run(
                sc.quick_findings(endpoint, config.model, server, [framework], max_tokens=config.server_check.max_tokens)
            )
            entry = {
                "tools": sc.tools_verdict(findings, framework),
                "kind": server.kind,
                "server_key": server.key,
                "checked_at": time.time(),
                "findings": sc.as_json(findings),
            }
            if entry["tools"] != "error":  # an error may pass (a server still loading): asked again next time
                sc.cache_write(path, key, entry)
    result = {**base, **entry, "cached": cached}
    if result["needs_tools"] and result["tools"] in REFUSED_VERDICTS and not result["accepted"]:
        raise ToolDropRefused(refusal(result))
    return result


def refusal(result: JsonObject) -> str:
    """What the server did with the tools, what to change, and how to run the cell anyway."""
    own = [f for f in result.get("findings") or () if f.get("status") != "ok" and f.get("framework") == result["framework"]]
    first = own[0] if own else {}
    lines = [
        f"the model server drops this cell's tools: its {result['framework']} requests offering python_exec "
        f"got {first.get('detail', result['tools'])} (server check, {result.get('kind', '?')} server).",
    ]
    if first.get("fix"):
        lines.append(f"Fix: {first['fix']}.")
    lines.append(
        "This topology's roles would run without their tools, so its tool use measures nothing. "
        "To run it anyway: model.accept_tool_drop=true (recorded in the cell's provenance: server.tools). "
        "The full check: python -m apps_bench.check model=... ."
    )
    return " ".join(lines)
