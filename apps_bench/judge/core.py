"""Score one program on one problem's kept tests, through the shared sandbox.

The sandbox runs the tests in one contained child per (problem, program) and
hands back plain data after each test; the comparison happens here, in the judge
process (`keep_going`), so an expected output never enters the process that runs
the program, and `stop_on_first_failure` can stop the child early.
A SANDBOX_ERROR is infrastructure: the run is retried, and if it persists the
verdict says so (`Verdict.results`), it is never scored as a wrong answer.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Callable

from apps_bench.data.rows import lift_int_digit_limit
from apps_bench.judge.compare import compare_call, compare_stdin
from apps_bench.judge.reference import GLOBAL_TIMEOUT_RESULTS, HarnessCrash, judge_test, passes
from apps_bench.sandbox import RunRequest
from apps_bench.types import Outcome, Problem, TestResult, Verdict

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.config import JudgeConfig
    from apps_bench.sandbox import RawRun
    from apps_bench.sandbox.api import Sandbox

DETAIL_CHARS = 300

# profile -> (stdin comparison, call-based comparison); each returns (passed, rule).
# `reference` runs in the sandbox's reference mode and is judged by judge/reference.py.
PROFILES: dict[str, tuple[Callable[[str, Any], tuple[bool, str]], Callable[[Any, Any], tuple[bool, str]]] | None] = {
    "seed": (compare_stdin, compare_call),
    "reference": None,
}

_STATUS_OUTCOME = {
    "timeout": Outcome.TIMEOUT,
    "runtime_error": Outcome.RUNTIME_ERROR,
    "compile_error": Outcome.COMPILE_ERROR,
    "output_limit": Outcome.OUTPUT_LIMIT,
    "memory_limit": Outcome.MEMORY_LIMIT,
    "sandbox_error": Outcome.SANDBOX_ERROR,
}


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"unknown judge profile {profile!r}; available: {', '.join(sorted(PROFILES))}")
    return profile


def _clip(text: str, n: int = DETAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= n else "…" + text[-n:]


def has_sandbox_error(verdict: Verdict) -> bool:
    """True when infrastructure failed on this verdict: count it apart, never as a wrong answer."""
    return any(r.outcome is Outcome.SANDBOX_ERROR for r in verdict.results)


SANDBOX_ERROR = "sandbox_error: the sandbox failed while judging (infrastructure, not the program)"


def judge_program(judge: Any, problem: Problem, program: str | None) -> tuple[Verdict | None, str | None]:
    """(verdict, infrastructure error) for one program: a sandbox failure or a judge crash while
    judging is an error of the problem's run (not scored, retried), never a wrong answer. The one
    rule for a cell's problems, an optimizer's rollouts and re-scoring (rescore.py): step.py and rescore.py call it."""
    try:
        verdict = judge.score(problem, program)
    except Exception as exc:  # noqa: BLE001 - a judge crash is infrastructure for this problem
        return None, f"judge {type(exc).__name__}: {exc}"
    return verdict, SANDBOX_ERROR if has_sandbox_error(verdict) else None


class Judge:
    """Strict-accuracy judge of one profile. Thread-safe: score() keeps no state between calls."""

    def __init__(
        self,
        pool: Sandbox,
        *,
        profile: str,
        timeout_s: float,
        stop_on_first_failure: bool,
        call_memory_bytes: int,
        stdin_memory_bytes: int,
        program_timeout_s: float | None,
        sandbox_retries: int = 1,
    ) -> None:
        """The settings are a judge config's (conf/judge/<profile>.yaml; `from_config`); none has a
        default here. `sandbox_retries`: reruns of a program whose sandbox failed, not a verdict rule."""
        self.pool = pool
        self.profile = check_profile(profile)
        self.reference = PROFILES[self.profile] is None
        if self.reference and not program_timeout_s:
            raise ValueError("judge profile 'reference' needs program_timeout_s (the original's global limit per program)")
        self.program_timeout_s = float(program_timeout_s) if program_timeout_s else None
        self.timeout_s = float(timeout_s)
        self.stop_on_first_failure = bool(stop_on_first_failure)
        self.call_memory_bytes = int(call_memory_bytes)
        self.stdin_memory_bytes = int(stdin_memory_bytes)
        self.sandbox_retries = int(sandbox_retries)
        self._compare_stdin, self._compare_call = PROFILES[self.profile] or (compare_stdin, compare_call)

    @classmethod
    def from_config(cls, pool: Sandbox, judge_cfg: JudgeConfig) -> Judge:
        """Build from the typed judge config (conf/judge/*.yaml)."""
        return cls(
            pool,
            profile=judge_cfg.profile,
            timeout_s=float(judge_cfg.timeout_s),
            stop_on_first_failure=judge_cfg.stop_on_first_failure,
            call_memory_bytes=judge_cfg.call_memory_bytes,
            stdin_memory_bytes=judge_cfg.stdin_memory_bytes,
            program_timeout_s=judge_cfg.program_timeout_s,
        )

    # ------------------------------------------------------------------ one test

    def outcome(self, problem: Problem, raw: RawRun) -> TestResult:
        """Turn the sandbox's plain-data report of test `raw.index` into a TestResult (comparing here)."""
        seconds = float(raw.seconds or 0.0)
        if raw.status != "ok":
            outcome = _STATUS_OUTCOME.get(raw.status, Outcome.SANDBOX_ERROR)
            detail = "; ".join(x for x in (raw.detail, _clip(raw.stderr or "")) if x)
            if raw.status not in _STATUS_OUTCOME and raw.status != "ok":
                detail = f"unknown sandbox status {raw.status!r}; {detail}"
            return TestResult(raw.index, outcome, seconds, _clip(detail))
        tests = problem.tests
        if not 0 <= raw.index < len(tests):
            return TestResult(raw.index, Outcome.SANDBOX_ERROR, seconds, f"sandbox reported test {raw.index} of {len(tests)}")
        expected = tests.outputs[raw.index]
        if tests.mode == "stdin":
            got = raw.stdout or ""
            ok, rule = self._compare_stdin(got, expected)
            detail = rule if ok else f"{rule}; got {_clip(got, 120)!r}"
            return TestResult(raw.index, Outcome.PASS if ok else Outcome.WRONG_ANSWER, seconds, detail)
        if raw.value_json is None:
            return TestResult(raw.index, Outcome.WRONG_ANSWER, seconds, "no JSON-convertible return value")
        lift_int_digit_limit()
        try:
            value = json.loads(raw.value_json)
        except (ValueError, RecursionError) as e:
            return TestResult(raw.index, Outcome.WRONG_ANSWER, seconds, f"return value is not JSON: {e}")
        ok, rule = self._compare_call(value, expected)
        detail = rule if ok else f"{rule}; got {_clip(raw.value_json, 120)}"
        return TestResult(raw.index, Outcome.PASS if ok else Outcome.WRONG_ANSWER, seconds, detail)

    # ------------------------------------------------------------------ one program

    def _request(self, problem: Problem, program: str) -> Any:
        tests = problem.tests
        memory = self.call_memory_bytes if tests.mode == "call" else self.stdin_memory_bytes
        if self.reference:  # the original: one process, an alarm per test, a limit for the whole program
            assert self.program_timeout_s is not None  # __init__ refuses a reference judge without one
            return RunRequest(code=program, mode=tests.mode, inputs=list(tests.raw_inputs or tests.inputs),
                              fn_name=tests.fn_name, timeout_s=self.program_timeout_s, alarm_s=self.timeout_s,
                              reference=True, memory_bytes=memory)
        return RunRequest(code=program, mode=tests.mode, inputs=list(tests.inputs), fn_name=tests.fn_name,
                          timeout_s=self.timeout_s, memory_bytes=memory)

    def _run_reference(self, problem: Problem, program: str) -> tuple[list[TestResult], tuple[Any, ...] | None]:
        """Run in the sandbox's reference mode; (results, the original's result list)."""
        results: list[TestResult] = []
        values: list[Any] = []
        lost: list[str] = []

        def keep_going(raw: RawRun) -> bool:
            try:
                r, value = judge_test(problem, raw, _clip)
            except HarnessCrash as e:
                outcome = Outcome.TIMEOUT if raw.status == "timeout" else Outcome.RUNTIME_ERROR
                results.append(TestResult(raw.index, outcome, float(raw.seconds or 0.0),
                                          _clip(f"{e}; the original reports [-1] * 21")))
                lost.append(str(e))
                return False
            results.append(r)
            values.append(value)
            if r.outcome in (Outcome.SANDBOX_ERROR, Outcome.COMPILE_ERROR):
                return False
            return passes(value) or not self.stop_on_first_failure

        try:
            self.pool.run(self._request(problem, program), keep_going)
        except Exception as e:  # noqa: BLE001 - the pool itself failed: infrastructure, not the program
            return [TestResult(len(results), Outcome.SANDBOX_ERROR, 0.0, _clip(f"{type(e).__name__}: {e}"))], None
        if any(r.outcome is Outcome.SANDBOX_ERROR for r in results):
            return results, None
        return results, (GLOBAL_TIMEOUT_RESULTS if lost else tuple(values))

    def _run_once(self, problem: Problem, program: str) -> list[TestResult]:
        req = self._request(problem, program)
        results: dict[int, TestResult] = {}

        def keep_going(raw: RawRun) -> bool:
            r = self.outcome(problem, raw)
            results[r.index] = r
            if r.outcome is Outcome.SANDBOX_ERROR:
                return False
            return r.outcome is Outcome.PASS or not self.stop_on_first_failure

        try:
            raws = self.pool.run(req, keep_going)
        except Exception as e:  # noqa: BLE001 - the pool itself failed: infrastructure, not the program
            return [TestResult(len(results), Outcome.SANDBOX_ERROR, 0.0, _clip(f"{type(e).__name__}: {e}"))]
        for raw in raws or ():  # runs the pool reported without consulting keep_going
            if raw.index not in results:
                results[raw.index] = self.outcome(problem, raw)
        ordered = [results[i] for i in sorted(results)]
        # A verdict never extends past the first failure when stopping on it.
        if self.stop_on_first_failure:
            for k, r in enumerate(ordered):
                if r.outcome is not Outcome.PASS:
                    ordered = ordered[: k + 1]
                    break
        return ordered

    def score(self, problem: Problem, program: str | None) -> Verdict:
        """Strict accuracy of `program` on `problem` (None = no program extracted: fails, not run)."""
        n = len(problem.tests)
        if program is None or not program.strip():
            return Verdict(problem.id, False, n, 0, 0, (), self.profile, extracted=False,
                           reference_results=(-2,) if self.reference else None)  # ref_judge's value for no program
        start = time.perf_counter()
        run = self._run_reference if self.reference else lambda p, c: (self._run_once(p, c), None)
        results, values = run(problem, program)
        for _ in range(self.sandbox_retries):
            if not any(r.outcome is Outcome.SANDBOX_ERROR for r in results):
                break
            results, values = run(problem, program)
        passed_n = sum(r.outcome is Outcome.PASS for r in results)
        passed = n > 0 and passed_n == n and len(results) == n
        if values is not None:  # the original's strict rule on its own list

            passed = n > 0 and len(values) == n and all(passes(v) for v in values)
        return Verdict(
            problem_id=problem.id,
            passed=passed,
            n_tests=n,
            tests_run=len(results),
            tests_passed=passed_n,
            results=tuple(results),
            profile=self.profile,
            extracted=True,
            seconds=time.perf_counter() - start,
            reference_results=values,
        )
