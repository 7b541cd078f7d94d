"""The per-problem step: solve -> judge -> classify the error -> build the record.

One implementation for the cell's loop (cell/pipeline.py), the optimizers' rollout runner and
the tests. `solve` is whichever solver the caller has (this process, a worker of
cell/solver_pool.py); judging always runs here, on the problem with its hidden tests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from apps_bench.cell.solving import Solved
from apps_bench.judge.core import Judge, judge_program
from apps_bench.topologies.tool_use import tool_calls_by_role
from apps_bench.tracking.records import record_key
from apps_bench.types import Problem, ProblemRecord, UsageRecord, Verdict


@dataclass
class Judged:
    """A problem solved and judged. `error` set = infrastructure (not scored, retried by the next run)."""

    problem: Problem
    solved: Solved
    verdict: Verdict | None
    error: str | None
    judge_s: float

    @property
    def passed(self) -> bool:
        return bool(self.verdict is not None and self.verdict.passed and not self.error)


async def solve_and_judge(problem: Problem, solve: Callable[[Problem], Awaitable[Solved]], judge: Judge) -> Judged:
    """Solve `problem`, then judge its program in a thread; a sandbox failure or a judge crash
    while judging is the problem's infrastructure error, never a wrong answer (judge_program)."""
    solved = await solve(problem)
    error, verdict = solved.error, None
    t1 = time.perf_counter()
    if error is None:
        program = solved.attempt.program if solved.attempt is not None else None
        verdict, error = await asyncio.to_thread(judge_program, judge, problem, program)
    return Judged(problem=problem, solved=solved, verdict=verdict, error=error, judge_s=time.perf_counter() - t1)


def record_of(outcome: Judged, cell_key: str) -> ProblemRecord:
    """What records.jsonl keeps of a problem (the same whichever process solved it)."""
    problem, solved, verdict, error = outcome.problem, outcome.solved, outcome.verdict, outcome.error
    attempt = solved.attempt
    program = getattr(attempt, "program", None)
    vote = getattr(attempt, "vote", None)
    return ProblemRecord(
        key=record_key(problem.split, problem.id),
        id=problem.id,
        split=problem.split,
        difficulty=problem.difficulty,
        mode=problem.tests.mode,
        cell=cell_key,
        program=program,
        extracted=bool(program and program.strip()),
        passed=outcome.passed,
        verdict=verdict,
        usage=UsageRecord.of(solved.usage),
        tool_calls_by_role=tool_calls_by_role(getattr(attempt, "transcript", None) or ()),
        latency_s=round(solved.solve_s + outcome.judge_s, 4),
        solve_s=round(solved.solve_s, 4),
        judge_s=round(outcome.judge_s, 4),
        solver=solved.solver,
        error=error,
        stop_reason=getattr(attempt, "stop_reason", "error" if error else "done"),
        rounds=getattr(attempt, "rounds", 0),
        turns=getattr(attempt, "turns", 0),
        candidates=list(getattr(attempt, "candidates", None) or []),
        vote=vote,
        completed_at=time.time(),
    )
