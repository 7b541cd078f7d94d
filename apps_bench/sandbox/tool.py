"""`python_exec`: the agents' tool, backed by the same sandbox as the judge.

The time limit comes from configuration (constructor), never from the model: the
tool's schema has no timeout parameter and `__call__` accepts none. Every call gets
a fresh interpreter state (a fresh contained child), and is counted in
`usage.tool_calls` so tool use is measured the same way for every framework.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

from apps_bench.tracking.capture import exec_call

from ..types import JsonObject, Usage
from .api import ExecResult
from .pool import SandboxPool

DESCRIPTION = (
    "Run a self-contained Python 3 program in a sandbox (no network, no files kept between "
    "calls, time-limited) and get back its exit code, standard output and standard error. "
    "Pass the program's standard input as `stdin`. Use it to test a solution on examples."
)

PARAMETERS: JsonObject = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "The complete Python 3 program to run."},
        "stdin": {"type": "string", "description": "Text given to the program on standard input.", "default": ""},
    },
    "required": ["code"],
    "additionalProperties": False,
}


def format_exec_result(r: ExecResult, timeout_s: float) -> str:
    """The short text the model sees."""
    if r.timed_out:
        head = f"timed out: killed after the {timeout_s:g}s limit"
    else:
        head = f"exit code: {r.exit_code}"
    parts = [head, "--- stdout ---", r.stdout if r.stdout else "(empty)"]
    if r.stderr:
        parts += ["--- stderr ---", r.stderr]
    return "\n".join(parts)


def compile_message(code: str) -> str:
    """The SyntaxError (or other compile failure) text Python prints for `code`; compiled, never run."""
    import traceback

    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    return "the program did not compile"


class PythonExecTool:
    """Callable tool for one problem; counts its calls into `usage`."""

    name = "python_exec"
    description = DESCRIPTION
    parameters = PARAMETERS

    def __init__(self, pool: SandboxPool, timeout_s: float, output_chars: int, usage: Usage | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"python_exec timeout_s must be > 0, got {timeout_s}")
        if output_chars <= 0:
            raise ValueError(f"python_exec output_chars must be > 0, got {output_chars}")
        self.pool = pool
        self.timeout_s = float(timeout_s)
        self.output_chars = int(output_chars)
        self.usage = usage
        self.calls = 0
        self._lock = threading.Lock()

    def openai_schema(self) -> JsonObject:
        """The tool in OpenAI chat-completions `tools=[...]` form."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def run(self, code: object, stdin: object = "") -> ExecResult | str:
        """`code` and `stdin` as the model sent them: anything but strings is refused with a message."""
        with self._lock:
            self.calls += 1
            if self.usage is not None:
                self.usage.tool_calls += 1
        log = getattr(self.usage, "trace", None)
        start_ns = time.time_ns()
        result = self._run(code, stdin)
        if log is not None:
            log.add_exec(exec_call(code, stdin, result, start_ns))
        return result

    def _run(self, code: object, stdin: object) -> ExecResult | str:
        if not isinstance(code, str):
            return f"python_exec error: `code` must be a string, got {type(code).__name__}"
        if stdin is None:
            stdin = ""
        if not isinstance(stdin, str):
            return f"python_exec error: `stdin` must be a string, got {type(stdin).__name__}"
        t0 = time.perf_counter()
        try:
            return self.pool.python_exec(code, stdin, timeout_s=self.timeout_s, output_chars=self.output_chars)
        finally:
            if self.usage is not None:
                with self._lock:
                    self.usage.tool_s += time.perf_counter() - t0

    def __call__(self, code: str, stdin: str = "") -> str:
        r = self.run(code, stdin)
        if isinstance(r, str):
            return r
        if r.status == "compile_error" and not r.stderr:  # the sandbox reports no text for it
            r = dataclasses.replace(r, stderr=compile_message(code))
        return format_exec_result(r, self.timeout_s)

    async def acall(self, code: str, stdin: str = "") -> str:
        return await asyncio.to_thread(self.__call__, code, stdin)
