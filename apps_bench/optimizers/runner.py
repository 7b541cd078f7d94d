"""The protocol's `Runner` over the real pipeline: a topology run per (problem, seed) with a
candidate PromptSet, judged on the problem's training tests with the eval cell's settings.

It is the same per-problem path as a cell (`build_context` -> `topology.solve` -> judge),
with two differences an optimizer needs: the prompt set is the candidate's (a value,
passed in), and each problem's request seed is the protocol's paired seed. A failure of
one problem is a Rollout with `error` set (infrastructure), never an exception.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from apps_bench import event_loop
from apps_bench.optimizers.protocol import ProblemKey
from apps_bench.optimizers.scoring import Rollout, rollout_from_attempt
from apps_bench.topologies.base import PromptSet
from apps_bench.types import Problem


class PipelineRunner:
    """`cfg`: the resolved cell config (attribute access: an OmegaConf node); `endpoint`:
    an open model endpoint (`models.open_endpoint`); `pool`: the SandboxPool; `judge`: a
    `judge.Judge` built from `cfg.judge` (the eval cell's profile, timeouts, test cap);
    `replayed`: behind a `replay.ReplayProxy`, its `pop_replayed` (each rollout's requests
    then carry the rollout's tag, and its replayed tokens are booked apart)."""

    def __init__(self, cfg: Any, *, endpoint: Any, pool: Any, judge: Any, problems: Mapping[ProblemKey, Problem],
                 concurrency: int | None = None, replayed: Callable[[str], int] | None = None) -> None:  # fmt: skip
        from apps_bench.config import problems_in_flight, typed_config  # noqa: PLC0415
        from apps_bench.topologies.registry import get_topology  # noqa: PLC0415

        self.cfg = typed_config(cfg)
        self.endpoint = endpoint
        self.pool = pool
        self.judge = judge
        self.problems = dict(problems)
        self.replayed = replayed
        self.topology = get_topology(self.cfg.topology)
        self.concurrency = max(1, int(concurrency or problems_in_flight(self.cfg)))

    def run_batch(self, prompt_set: PromptSet, jobs: Sequence[tuple[ProblemKey, int]]) -> list[Rollout]:
        missing = [k for k, _ in jobs if tuple(k) not in self.problems]
        if missing:
            raise KeyError(f"the runner was given no problem rows for {missing[:5]}")
        return event_loop.run(self._run_all(prompt_set, list(jobs)))

    async def _run_all(self, prompt_set: PromptSet, jobs: list[tuple[ProblemKey, int]]) -> list[Rollout]:
        from apps_bench.solving import solver_threads  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=solver_threads(self.concurrency), thread_name_prefix="apps-bench-opt")
        loop.set_default_executor(executor)
        sem = asyncio.Semaphore(self.concurrency)
        from apps_bench.models.client_stack import SharedConnections  # noqa: PLC0415

        connections = SharedConnections()  # this batch's event loop: one HTTP pool for its rollouts
        try:
            return list(await asyncio.gather(*(self._one(sem, connections, prompt_set, tuple(k), int(s)) for k, s in jobs)))
        finally:
            await connections.aclose()
            executor.shutdown(wait=False)

    async def _one(self, sem: asyncio.Semaphore, connections: Any, prompt_set: PromptSet, key: ProblemKey,
                   seed: int) -> Rollout:  # fmt: skip
        if self.replayed is None:
            return await self._solve(sem, connections, prompt_set, key, seed, {})
        from apps_bench.optimizers.cache import stable_hash  # noqa: PLC0415
        from apps_bench.optimizers.replay import ROLLOUT_HEADER  # noqa: PLC0415

        tag = stable_hash({"roles": dict(prompt_set.texts), "problem": list(key), "seed": seed})[:20]
        r = await self._solve(sem, connections, prompt_set, key, seed, {ROLLOUT_HEADER: tag})
        return dataclasses.replace(r, replayed_tokens=self.replayed(tag))

    async def _solve(self, sem: asyncio.Semaphore, connections: Any, prompt_set: PromptSet, key: ProblemKey, seed: int,
                     headers: dict[str, str]) -> Rollout:  # fmt: skip
        from apps_bench.solving import solve_problem  # noqa: PLC0415
        from apps_bench.step import solve_and_judge  # noqa: PLC0415

        async def solve(problem: Problem) -> Any:
            return await solve_problem(
                problem, cfg=self.cfg, topology=self.topology, endpoint=self.endpoint, pool=self.pool,
                prompts=prompt_set, connections=connections, seed=seed, headers=headers,
            )  # fmt: skip

        async with sem:
            outcome = await solve_and_judge(self.problems[key], solve, self.judge)
        solved = outcome.solved
        if outcome.error:  # tokens count when the runner returned (its own error), not after an exception
            spent = solved.usage.total_tokens if solved.attempt is not None else 0
            return Rollout(key=key, seed=seed, error=outcome.error, task_tokens=spent)
        return rollout_from_attempt(outcome.problem, seed, solved.attempt, outcome.verdict)

    def score_program(self, problem: Problem, program: str | None) -> Any:
        """The judge on a problem's training tests (MASPO's reward for intermediate programs)."""
        return self.judge.score(problem, program)

    def settings(self) -> dict[str, Any]:
        """What goes into the rollout cache key besides prompts: everything that changes a run."""
        topo = {k: v for k, v in dataclasses.asdict(self.cfg.topology).items() if k not in ("prompts", "prompt_file")}
        judge = {k: v for k, v in dataclasses.asdict(self.cfg.judge).items() if k != "workers"}
        return {"topology": topo, "judge": judge, "tool": dataclasses.asdict(self.cfg.tool),
                "max_tests_per_row": self.cfg.max_tests_per_row}  # fmt: skip

    def model_identity(self) -> dict[str, Any]:
        m = dataclasses.asdict(self.cfg.model)
        keys = ("name", "provider", "model_id", "temperature", "top_p", "max_tokens", "extra_body", "wrong_fraction")
        return {k: m[k] for k in keys}
