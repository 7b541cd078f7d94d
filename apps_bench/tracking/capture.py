"""What a problem's trace is built from, captured where it happens (no mlflow here).

When a cell writes traces (`tracking.traces`), the problem's `Usage` carries a `TraceLog`:
the metering transport adds each model call (request body, reply body, times), the
`python_exec` tool each run, `SolveContext.log` the time of each transcript event. It
travels with `Usage` from a solver process to the cell's, which builds the MLflow trace
after judging (tracking/traces.py). Nothing here enters a record: records are the same
with traces on or off. Only bodies are kept, never headers (the API key lives there).
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

_LOCK = threading.Lock()
# The transcript index of the agent turn running in this context (its "input" event): set when
# a turn logs its input, read by the calls made in the same task or thread (and those it starts),
# so the calls of agents running side by side land in their own turns.
_TURN: ContextVar[int] = ContextVar("apps_bench_turn", default=-1)


def current_turn() -> int:
    return _TURN.get()


@dataclass
class ModelCall:
    role: str
    start_ns: int
    end_ns: int
    turn: int  # the transcript index of the input event of the turn it ran in (-1: unknown)
    request: bytes  # the JSON body as sent (messages, tools, sampling settings)
    reply: bytes  # the reply body (JSON or an SSE stream); empty when the call failed
    content_type: str = ""
    ok: bool = True
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    retries: int = 0


@dataclass
class ExecCall:
    start_ns: int
    end_ns: int
    turn: int
    code: str
    stdin: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    status: str = ""
    timed_out: bool = False
    error: str = ""  # the tool refused the call (bad arguments)


@dataclass
class TraceLog:
    """One problem's captured calls, in the order they ended."""

    start_ns: int = field(default_factory=time.time_ns)
    event_ns: list[int] = field(default_factory=list)  # one per transcript event, same order
    calls: list[ModelCall] = field(default_factory=list)
    execs: list[ExecCall] = field(default_factory=list)

    def event(self, index: int, kind: str) -> None:
        """Transcript event `index` was just logged; an "input" starts a turn in this context."""
        with _LOCK:
            self.event_ns.append(time.time_ns())
        if kind == "input":
            _TURN.set(index)

    def add_call(self, call: ModelCall) -> None:
        with _LOCK:
            self.calls.append(call)

    def add_exec(self, call: ExecCall) -> None:
        with _LOCK:
            self.execs.append(call)


def log_of(usage: object) -> TraceLog | None:
    """The TraceLog a problem's usage carries (None: this cell writes no traces)."""
    return getattr(usage, "trace", None)


def exec_call(code: object, stdin: object, result: object, start_ns: int) -> ExecCall:
    """A python_exec run as captured: `result` is the sandbox's ExecResult, or the refusal text."""
    end, turn = time.time_ns(), current_turn()
    code_s, stdin_s = str(code), "" if stdin is None else str(stdin)
    if isinstance(result, str):
        return ExecCall(start_ns, end, turn, code_s, stdin_s, error=result)
    return ExecCall(
        start_ns,
        end,
        turn,
        code_s,
        stdin_s,
        exit_code=getattr(result, "exit_code", None),
        stdout=getattr(result, "stdout", "") or "",
        stderr=getattr(result, "stderr", "") or "",
        status=str(getattr(result, "status", "")),
        timed_out=bool(getattr(result, "timed_out", False)),
    )
