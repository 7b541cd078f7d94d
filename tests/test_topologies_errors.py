"""How a runner reports a model endpoint that answers with errors (a real loopback HTTP server).

A context-length rejection is the conversation outgrowing the model: the attempt ends
with what exists ("context_limit"), scored as usual. Any other rejection or outage is
infrastructure: Attempt.error, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from apps_bench.config import register_configs
from apps_bench.types import Problem, Usage
from apps_bench.types import TestSuite as Suite  # not "Test*": pytest would try to collect it

CONF = Path(__file__).resolve().parents[1] / "conf"
PROBLEM = Problem(id="e1", question="Print the sum of two integers.", tests=Suite(("1 2\n",), ("3\n",)))


class _Rejecting(BaseHTTPRequestHandler):
    status = 400
    message = ""

    def do_POST(self):  # noqa: N802 - http.server naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": {"message": self.message, "type": "BadRequestError", "code": self.status}})
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def solve_against(status: int, message: str, topology: str = "sequential_langgraph"):
    from apps_bench.models import ModelClients
    from apps_bench.models.endpoint import Endpoint
    from apps_bench.topologies.context import build_context
    from apps_bench.topologies.registry import get_topology

    handler = type("H", (_Rejecting,), {"status": status, "message": message})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        register_configs()
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
            cfg = copy.deepcopy(compose("config", overrides=[f"topology={topology}", "model=openai",
                                                             "model.max_retries=0", "allow_any_cell=true"]))
        ep = Endpoint(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", "x", "openai", ("m",))
        usage = Usage()
        models = ModelClients(ep, cfg.model, usage)
        ctx = build_context(PROBLEM, cfg.topology, models=models, tool=None, seed=0, usage=usage)

        async def go():
            try:
                return await get_topology(cfg.topology).solve(ctx)
            finally:
                await models.aclose()

        return asyncio.run(go())
    finally:
        server.shutdown()
        server.server_close()


def test_context_length_rejection_ends_the_attempt_without_an_error():
    a = solve_against(400, "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.")
    assert a.stop_reason == "context_limit" and a.error is None and a.program is None
    assert [e.agent for e in a.transcript if e.kind == "input"] == ["analyzer"]  # the flow stopped there
    assert any(e.kind == "note" and "maximum context length" in e.content for e in a.transcript)


@pytest.mark.parametrize("status, message", [(400, "unknown parameter: foo"), (503, "overloaded"), (401, "bad key")])
def test_other_rejections_and_outages_are_infrastructure_errors(status, message):
    a = solve_against(status, message)
    assert a.stop_reason == "error" and a.error and message in a.error
    assert a.program is None
