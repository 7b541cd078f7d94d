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

from apps_bench.config.schema import register_configs
from apps_bench.types import Problem, Usage
from apps_bench.types import TestSuite as Suite  # not "Test*": pytest would try to collect it

CONF = Path(__file__).resolve().parents[2] / "conf"
PROBLEM = Problem(id="e1", question="Print the sum of two integers.", tests=Suite(("1 2\n",), ("3\n",)))


class _Scripted(BaseHTTPRequestHandler):
    """Answers chat completions from a script: (status, body) per request, the last one repeating."""

    script: list = []
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server naming
        self.seen.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        status, payload = self.script[min(len(self.seen), len(self.script)) - 1]
        body = json.dumps(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def error(status: int, message: str):
    return status, {"error": {"message": message, "type": "BadRequestError", "code": status}}


def completion(content: str | None, tool_calls: list | None = None):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(tool_calls)
        ]
    return 200, {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def solve_scripted(script: list, topology: str = "sequential_langgraph", *overrides: str):
    from apps_bench.models import ModelClients
    from apps_bench.models.endpoint import Endpoint
    from apps_bench.sandbox.tool import PythonExecTool
    from apps_bench.topologies.context import build_context
    from apps_bench.topologies.registry import get_topology

    handler = type("H", (_Scripted,), {"script": script, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        register_configs()
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
            cfg = copy.deepcopy(
                compose(
                    "config",
                    overrides=[f"topology={topology}", "model=openai", "model.max_retries=0", "allow_any_cell=true", *overrides],
                )
            )
        ep = Endpoint(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", "x", "openai", ("m",))
        usage = Usage()
        models = ModelClients(ep, cfg.model, usage)
        # these scripts never reach the sandbox: the tool object is real, its pool is never used
        tool = PythonExecTool(None, 5.0, 1000, usage)  # type: ignore[arg-type]
        ctx = build_context(PROBLEM, cfg.topology, models=models, tool=tool, seed=0, usage=usage)

        async def go():
            try:
                return await get_topology(cfg.topology).solve(ctx)
            finally:
                await models.aclose()

        return asyncio.run(go()), handler.seen
    finally:
        server.shutdown()
        server.server_close()


def solve_against(status: int, message: str):
    return solve_scripted([error(status, message)])[0]


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


def test_bad_tool_calls_are_answered_and_the_loop_goes_on():
    attempt, seen = solve_scripted(
        [
            completion("Let me test.", [("python_exec", '{"stdin": "1 2"}'), ("shell", '{"cmd": "ls"}')]),
            completion("Done.\n\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"),
        ],
        "single",
    )
    results = [e.content for e in attempt.transcript if e.kind == "tool_result"]
    assert len(results) == 2
    assert results[0].startswith("error: bad arguments for python_exec") and "code" in results[0]
    assert results[1].startswith("error: no tool named 'shell'") and "python_exec" in results[1]
    assert attempt.stop_reason == "done" and attempt.program.startswith("a, b = map(int")
    assert attempt.usage.model_calls == 2 and attempt.usage.tool_calls == 0  # nothing reached the sandbox
    # both errors went back to the model as tool results, in call order
    tool_msgs = [m for m in seen[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_0", "call_1"]
    assert seen[0]["seed"] == 0 and seen[0]["tools"][0]["function"]["name"] == "python_exec"


def test_unparsable_tool_arguments_are_answered_and_retried():
    attempt, seen = solve_scripted(
        [
            completion("Trying.", [("python_exec", '{"code": ')]),
            completion("```python\nprint(sum(map(int, input().split())))\n```"),
        ],
        "single",
    )
    assert any(e.kind == "note" and "unparsable tool call" in e.content for e in attempt.transcript)
    (result,) = [e.content for e in attempt.transcript if e.kind == "tool_result"]
    assert "not valid JSON" in result
    assert attempt.stop_reason == "done" and attempt.program.strip() == "print(sum(map(int, input().split())))"
    # the malformed call went back with its id, so the conversation stays well-formed
    assistant = [m for m in seen[1]["messages"] if m["role"] == "assistant"][0]
    tool = [m for m in seen[1]["messages"] if m["role"] == "tool"][0]
    assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"] == "call_0"


def test_step_cap_counts_malformed_calls_too():
    attempt, seen = solve_scripted([completion("Trying.", [("python_exec", '{"code": ')])], "single", "topology.max_steps=3")
    assert attempt.stop_reason == "step_cap" and len(seen) == 3 and attempt.program is None
