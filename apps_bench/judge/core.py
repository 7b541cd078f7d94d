"""Score one program on one problem's kept tests, through the shared sandbox.

The sandbox runs the tests in one contained child per (problem, program) and
hands back plain data after each test; the comparison happens in the judge process
(the profile's rules, judge/rules.py, named by the profile's `_target_`), so an expected output never enters the process that runs
the program, and `stop_on_first_failure` can stop the child early.
A SANDBOX_ERROR is infrastructure: the run is retried, and if it persists the
verdict says so (`Verdict.results`), it is never scored as a wrong answer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from apps_bench.config.schema import TargetError, resolve_target
from apps_bench.judge.reference import passes
from apps_bench.judge.rules import ProfileRules
from apps_bench.types import Outcome, Problem, Verdict

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.config.schema import JudgeConfig
    from apps_bench.sandbox.api import Sandbox


def has_sandbox_error(verdict: Verdict) -> bool:
    """True when infrastructure failed on this verdict: count it apart, never as a wrong answer."""
    return any(r.outcome is Outcome.SANDBOX_ERROR for r in verdict.results)


SANDBOX_ERROR = "sandbox_error: the sandbox failed while judging (infrastructure, not the program)"


class ProgramScorer(Protocol):
    """What judges one program: a Judge, or a test's stand-in for one."""

    def score(self, problem: Problem, program: str | None) -> Verdict: ...


def judge_program(judge: ProgramScorer, problem: Problem, program: str | None) -> tuple[Verdict | None, str | None]:
    """(verdict, infrastructure error) for one program: a sandbox failure or a judge crash while
    judging is an error of the problem's run (not scored, retried), never a wrong answer. The one
    rule for a cell's problems, an optimizer's rollouts and re-scoring (rescore.py): cell/step.py and rescore.py call it."""
    try:
        verdict = judge.score(problem, program)
    except Exception as exc:  # noqa: BLE001 - a judge crash is infrastructure for this problem
        return None, f"judge {type(exc).__name__}: {exc}"
    return verdict, SANDBOX_ERROR if has_sandbox_error(verdict) else None


def profile_rules(judge_cfg: JudgeConfig) -> ProfileRules:
    """The rules object a judge config's `_target_` names (judge/rules.py), built with no arguments."""
    where = f"check judge._target_ (conf/judge/{judge_cfg.profile}.yaml)"
    try:
        target = resolve_target(judge_cfg._target_)
    except TargetError as e:
        raise ValueError(f"judge profile {judge_cfg.profile!r}: {e}; {where}") from None
    if not isinstance(target, type) or not callable(getattr(target, "run", None)) or not callable(getattr(target, "check", None)):
        raise ValueError(
            f"judge profile {judge_cfg.profile!r}: {judge_cfg._target_} is not a profile's rules class (judge/rules.py); {where}"
        )
    rules: ProfileRules = target()
    return rules


class Judge:
    """Strict-accuracy judge of one profile. Thread-safe: score() keeps no state between calls."""

    def __init__(
        self,
        pool: Sandbox,
        *,
        profile: str,
        rules: ProfileRules,
        timeout_s: float,
        stop_on_first_failure: bool,
        call_memory_bytes: int,
        stdin_memory_bytes: int,
        program_timeout_s: float | None,
        sandbox_retries: int = 1,
    ) -> None:
        """The settings are a judge config's (conf/judge/<profile>.yaml; `from_config`); none has a
        default here. `rules` is the profile's behaviour (judge/rules.py); `sandbox_retries`: reruns
        of a program whose sandbox failed, not a verdict rule."""
        self.pool = pool
        self.profile = profile
        self.rules = rules
        self.program_timeout_s = float(program_timeout_s) if program_timeout_s else None
        self.timeout_s = float(timeout_s)
        self.stop_on_first_failure = bool(stop_on_first_failure)
        self.call_memory_bytes = int(call_memory_bytes)
        self.stdin_memory_bytes = int(stdin_memory_bytes)
        self.sandbox_retries = int(sandbox_retries)
        rules.check(self)

    @classmethod
    def from_config(cls, pool: Sandbox, judge_cfg: JudgeConfig) -> Judge:
        """Build from the typed judge config (conf/judge/*.yaml), its rules the class `_target_` names."""
        return cls(
            pool,
            profile=judge_cfg.profile,
            rules=profile_rules(judge_cfg),
            timeout_s=float(judge_cfg.timeout_s),
            stop_on_first_failure=judge_cfg.stop_on_first_failure,
            call_memory_bytes=judge_cfg.call_memory_bytes,
            stdin_memory_bytes=judge_cfg.stdin_memory_bytes,
            program_timeout_s=judge_cfg.program_timeout_s,
        )

    def score(self, problem: Problem, program: str | None) -> Verdict:
        """Strict accuracy of `program` on `problem` (None = no program extracted: fails, not run)."""
        n = len(problem.tests)
        if program is None or not program.strip():
            return Verdict(
                problem.id, False, n, 0, 0, (), self.profile, extracted=False, reference_results=self.rules.no_program_results
            )
        start = time.perf_counter()
        results, values = self.rules.run(self, problem, program)
        for _ in range(self.sandbox_retries):
            if not any(r.outcome is Outcome.SANDBOX_ERROR for r in results):
                break
            results, values = self.rules.run(self, problem, program)
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
