"""The judge profiles' rules: how each profile runs a program and judges its tests.

A profile's file (conf/judge/<profile>.yaml) names its rules by `_target_`, a class here that
`Judge.from_config` builds with no arguments. The `Judge` keeps what every profile shares (the
sandbox pool, the limits, retries of a failed sandbox); a rules object reads them from it
(`JudgeSettings`) and keeps nothing between calls, so one Judge serves many threads.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, ClassVar, Protocol

from apps_bench.data.rows import lift_int_digit_limit
from apps_bench.judge.compare import compare_call, compare_stdin
from apps_bench.judge.reference import GLOBAL_TIMEOUT_RESULTS, HarnessCrash, judge_test, passes
from apps_bench.sandbox import RunRequest
from apps_bench.types import Outcome, Problem, TestResult

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.sandbox import RawRun
    from apps_bench.sandbox.api import Sandbox

DETAIL_CHARS = 300

_STATUS_OUTCOME = {
    "timeout": Outcome.TIMEOUT,
    "runtime_error": Outcome.RUNTIME_ERROR,
    "compile_error": Outcome.COMPILE_ERROR,
    "output_limit": Outcome.OUTPUT_LIMIT,
    "memory_limit": Outcome.MEMORY_LIMIT,
    "sandbox_error": Outcome.SANDBOX_ERROR,
}

# (the test results, the original harness's own result list when the rules keep one)
Run = tuple[list[TestResult], tuple[object, ...] | None]


def clip(text: str, n: int = DETAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= n else "…" + text[-n:]


class JudgeSettings(Protocol):
    """What a profile's rules read of the Judge that uses them (conf/judge/<profile>.yaml's values)."""

    pool: Sandbox
    timeout_s: float
    program_timeout_s: float | None
    stop_on_first_failure: bool
    call_memory_bytes: int
    stdin_memory_bytes: int


class ProfileRules(Protocol):
    """A judge profile's behaviour, the class its `_target_` names."""

    # the result list a verdict without a program records (None: the profile keeps no such list)
    no_program_results: ClassVar[tuple[int, ...] | None]

    def check(self, judge: JudgeSettings) -> None:
        """Refuse (ValueError) settings these rules cannot judge with."""

    def run(self, judge: JudgeSettings, problem: Problem, program: str) -> Run:
        """Run `program` on the problem's tests once; a failed pool is a SANDBOX_ERROR result."""


def _memory(judge: JudgeSettings, problem: Problem) -> int:
    return judge.call_memory_bytes if problem.tests.mode == "call" else judge.stdin_memory_bytes


def _pool_failed(n: int, e: Exception) -> TestResult:
    """The pool itself failed: infrastructure, not the program."""
    return TestResult(n, Outcome.SANDBOX_ERROR, 0.0, clip(f"{type(e).__name__}: {e}"))


class SeedRules:
    """Profile `seed`: one contained child per program, a fresh one after a timed-out or crashed
    test, the outputs compared by the seed's cascades (judge/compare.py) in the judge process."""

    no_program_results: ClassVar[tuple[int, ...] | None] = None

    def check(self, judge: JudgeSettings) -> None:
        pass

    def outcome(self, problem: Problem, raw: RawRun) -> TestResult:
        """Turn the sandbox's plain-data report of test `raw.index` into a TestResult (comparing here)."""
        seconds = float(raw.seconds or 0.0)
        if raw.status != "ok":
            outcome = _STATUS_OUTCOME.get(raw.status, Outcome.SANDBOX_ERROR)
            detail = "; ".join(x for x in (raw.detail, clip(raw.stderr or "")) if x)
            if raw.status not in _STATUS_OUTCOME:
                detail = f"unknown sandbox status {raw.status!r}; {detail}"
            return TestResult(raw.index, outcome, seconds, clip(detail))
        tests = problem.tests
        if not 0 <= raw.index < len(tests):
            return TestResult(raw.index, Outcome.SANDBOX_ERROR, seconds, f"sandbox reported test {raw.index} of {len(tests)}")
        expected = tests.outputs[raw.index]
        if tests.mode == "stdin":
            got = raw.stdout or ""
            ok, rule = compare_stdin(got, expected)
            detail = rule if ok else f"{rule}; got {clip(got, 120)!r}"
            return TestResult(raw.index, Outcome.PASS if ok else Outcome.WRONG_ANSWER, seconds, detail)
        if raw.value_json is None:
            return TestResult(raw.index, Outcome.WRONG_ANSWER, seconds, "no JSON-convertible return value")
        lift_int_digit_limit()
        try:
            value = json.loads(raw.value_json)
        except (ValueError, RecursionError) as e:
            return TestResult(raw.index, Outcome.WRONG_ANSWER, seconds, f"return value is not JSON: {e}")
        ok, rule = compare_call(value, expected)
        detail = rule if ok else f"{rule}; got {clip(raw.value_json, 120)}"
        return TestResult(raw.index, Outcome.PASS if ok else Outcome.WRONG_ANSWER, seconds, detail)

    def run(self, judge: JudgeSettings, problem: Problem, program: str) -> Run:
        tests = problem.tests
        req = RunRequest(
            code=program,
            mode=tests.mode,
            inputs=list(tests.inputs),
            fn_name=tests.fn_name,
            timeout_s=judge.timeout_s,
            memory_bytes=_memory(judge, problem),
        )
        results: dict[int, TestResult] = {}

        def keep_going(raw: RawRun) -> bool:
            r = self.outcome(problem, raw)
            results[r.index] = r
            if r.outcome is Outcome.SANDBOX_ERROR:
                return False
            return r.outcome is Outcome.PASS or not judge.stop_on_first_failure

        try:
            raws = judge.pool.run(req, keep_going)
        except Exception as e:  # noqa: BLE001 - the pool failed: recorded as infrastructure
            return [_pool_failed(len(results), e)], None
        for raw in raws or ():  # runs the pool reported without consulting keep_going
            if raw.index not in results:
                results[raw.index] = self.outcome(problem, raw)
        ordered = [results[i] for i in sorted(results)]
        # A verdict never extends past the first failure when stopping on it.
        if judge.stop_on_first_failure:
            for k, r in enumerate(ordered):
                if r.outcome is not Outcome.PASS:
                    ordered = ordered[: k + 1]
                    break
        return ordered, None


class ReferenceRules:
    """Profile `reference`: the original APPS harness. One child runs every test (an alarm per test,
    `program_timeout_s` for the whole program), judged by judge/reference.py; verdicts keep the
    original's result list."""

    no_program_results: ClassVar[tuple[int, ...] | None] = (-2,)  # ref_judge's value for no program

    def check(self, judge: JudgeSettings) -> None:
        if not judge.program_timeout_s:
            raise ValueError("judge profile 'reference' needs program_timeout_s (the original's global limit per program)")

    def run(self, judge: JudgeSettings, problem: Problem, program: str) -> Run:
        tests = problem.tests
        assert judge.program_timeout_s is not None  # check() refuses a reference judge without one
        req = RunRequest(
            code=program,
            mode=tests.mode,
            inputs=list(tests.raw_inputs or tests.inputs),
            fn_name=tests.fn_name,
            timeout_s=judge.program_timeout_s,
            alarm_s=judge.timeout_s,
            reference=True,
            memory_bytes=_memory(judge, problem),
        )
        results: list[TestResult] = []
        values: list[object] = []
        lost: list[str] = []

        def keep_going(raw: RawRun) -> bool:
            try:
                r, value = judge_test(problem, raw, clip)
            except HarnessCrash as e:
                outcome = Outcome.TIMEOUT if raw.status == "timeout" else Outcome.RUNTIME_ERROR
                results.append(
                    TestResult(raw.index, outcome, float(raw.seconds or 0.0), clip(f"{e}; the original reports [-1] * 21"))
                )
                lost.append(str(e))
                return False
            results.append(r)
            values.append(value)
            if r.outcome in (Outcome.SANDBOX_ERROR, Outcome.COMPILE_ERROR):
                return False
            return passes(value) or not judge.stop_on_first_failure

        try:
            judge.pool.run(req, keep_going)
        except Exception as e:  # noqa: BLE001 - the pool failed: recorded as infrastructure
            return [_pool_failed(len(results), e)], None
        if any(r.outcome is Outcome.SANDBOX_ERROR for r in results):
            return results, None
        return results, (GLOBAL_TIMEOUT_RESULTS if lost else tuple(values))
