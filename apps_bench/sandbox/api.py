"""The plain-data records that cross the sandbox boundary.

Only these frozen dataclasses of str/int/float/None leave the sandbox: a program's
output, or its return value already turned into JSON text inside the child. Nothing
of the user's is ever unpickled in the judge process, so an object with a lying
`__eq__` cannot reach the comparison.
"""

from __future__ import annotations

import decimal
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.types import JsonObject

RawStatus = Literal["ok", "timeout", "runtime_error", "compile_error", "output_limit", "memory_limit", "sandbox_error"]
RAW_STATUSES: frozenset[str] = frozenset(
    ("ok", "timeout", "runtime_error", "compile_error", "output_limit", "memory_limit", "sandbox_error")
)


@dataclass(frozen=True)
class RunRequest:
    """One program and the inputs of its tests (never the expected outputs).

    stdin mode: each input is the program's standard input (a list is joined with
    newlines). call mode: each input is the positional-argument list of `fn_name`.
    """

    code: str
    mode: Literal["stdin", "call"]
    inputs: Sequence[object]  # pickled to the child as they are
    fn_name: str | None = None
    timeout_s: float = 4.0
    memory_bytes: int = 0
    # reference: run as the original APPS harness does (sandbox/reference_child.py): one process
    # for every test, `timeout_s` is then the whole program's limit and `alarm_s` each test's.
    reference: bool = False
    alarm_s: float = 4.0

    def __post_init__(self) -> None:
        if self.mode not in ("stdin", "call"):
            raise ValueError(f"RunRequest.mode must be 'stdin' or 'call', got {self.mode!r}")
        if self.mode == "call" and not self.fn_name:
            raise ValueError("RunRequest in call mode needs fn_name (the function the tests call)")
        if not isinstance(self.code, str):
            raise TypeError(f"RunRequest.code must be a str, got {type(self.code).__name__}")
        if not self.timeout_s or self.timeout_s <= 0:
            raise ValueError(f"RunRequest.timeout_s must be > 0, got {self.timeout_s!r}")
        if self.reference and (not self.alarm_s or self.alarm_s <= 0):
            raise ValueError(f"RunRequest.alarm_s must be > 0, got {self.alarm_s!r}")
        if self.memory_bytes < 0:
            raise ValueError(f"RunRequest.memory_bytes must be >= 0 (0 = no cap), got {self.memory_bytes!r}")


@dataclass(frozen=True)
class RawRun:
    """What one test of one program did. Plain data only; the judge compares."""

    index: int
    status: RawStatus
    stdout: str = ""
    value_json: str | None = None
    stderr: str = ""
    exit_code: int | None = None
    seconds: float = 0.0
    detail: str = ""
    fatal: bool = False  # the program's process ended (died or was killed) during this test
    # a `timeout` the program finished: its process reported a result, but later than the limit as the
    # worker measured it (`reference` judges it as the original judges output after a swallowed alarm)
    late: bool = False


@dataclass(frozen=True)
class ExecResult:
    """Result of one `python_exec` call (the agents' tool)."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    seconds: float
    status: str = ""  # the RawRun status behind it (ok, timeout, output_limit, ...)


def _parse_big_int(text: str) -> int:
    # int(str) refuses > 4300 digits by default; Decimal has no such limit.
    return int(text) if len(text) <= 4000 else int(decimal.Decimal(text))


def decode_value(value_json: str) -> object:
    """Parse `RawRun.value_json` into plain Python data (lists, dicts, str, int, float,
    bool, None), accepting integers of any length and NaN/Infinity, without touching
    the process-wide int-string digit limit."""
    return json.loads(value_json, parse_int=_parse_big_int)


class Sandbox(Protocol):
    """What a cell's engine needs of its sandbox: the judge's runs, the agents' `python_exec`, and what
    it enforces (provenance). pool.SandboxPool is the one there is; a solver worker's `python_exec`
    goes to its cell's pool (solver_pool.ExecProxy)."""

    @property
    def features(self) -> JsonObject: ...

    def run(self, req: RunRequest, keep_going: Callable[[RawRun], bool] | None = None) -> list[RawRun]: ...

    def python_exec(self, code: str, stdin: str = "", *, timeout_s: float, output_chars: int) -> ExecResult: ...
