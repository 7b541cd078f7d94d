"""The protocol's `Runner` over the real pipeline: a topology run per (problem, seed) with a
candidate PromptSet, judged on the problem's training tests with the eval cell's settings.

It is the cell's own engine and step (cell/engine.py: the same endpoint, sandbox pool, judge and
solver processes), with two differences an optimizer needs: the prompt set is the candidate's
(a value, passed in), and each problem's request seed is the protocol's paired seed. A failure
of one problem is a Rollout with `error` set (infrastructure), never an exception.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable, Mapping, Sequence

from apps_bench.cell.engine import Engine
from apps_bench.cell.solving import Job
from apps_bench.config.schema import flat_model
from apps_bench.optimizers.cache import stable_hash
from apps_bench.optimizers.protocol import ProblemKey
from apps_bench.optimizers.replay import ROLLOUT_HEADER
from apps_bench.optimizers.scoring import Rollout, rollout_from_attempt
from apps_bench.topologies.base import PromptSet
from apps_bench.types import JsonObject, Problem, Verdict


class PipelineRunner:
    """The protocol's Runner on a cell's engine (cell/engine.py): every rollout is one engine job with the
    candidate's prompt set and the protocol's paired seed, on the engine's solver processes.

    `problems`: the rows the rollouts draw from (with their training tests); `replay_url`: the
    `replay.ReplayProxy` in front of the engine's model, and `replayed` its `pop_replayed` (each
    rollout's requests then carry the rollout's tag, and its replayed tokens are booked apart)."""

    def __init__(
        self,
        engine: Engine,
        *,
        problems: Mapping[ProblemKey, Problem],
        replay_url: str | None = None,
        replayed: Callable[[str], int] | None = None,
    ) -> None:
        self.engine = engine
        self.cfg = engine.config
        self.problems = dict(problems)
        self.replay_url = replay_url
        self.replayed = replayed

    def run_batch(self, prompt_set: PromptSet, jobs: Sequence[tuple[ProblemKey, int]]) -> list[Rollout]:
        missing = [k for k, _ in jobs if tuple(k) not in self.problems]
        if missing:
            raise KeyError(f"the runner was given no problem rows for {missing[:5]}")
        batch = [((str(k[0]), str(k[1])), int(s)) for k, s in jobs]
        return list(self.engine.run(lambda: asyncio.gather(*(self._one(prompt_set, k, s) for k, s in batch))))

    async def _one(self, prompt_set: PromptSet, key: ProblemKey, seed: int) -> Rollout:
        tag = None
        if self.replayed is not None:
            tag = stable_hash({"roles": dict(prompt_set.texts), "problem": list(key), "seed": seed})[:20]
        job = Job(
            prompts=prompt_set, seed=seed, headers={ROLLOUT_HEADER: tag} if tag else None, base_url=self.replay_url, trace=False
        )
        async with self.engine.slot():
            outcome = await self.engine.step(self.problems[key], job)
        solved = outcome.solved
        if outcome.error:  # tokens count when the runner returned (its own error), not after an exception
            spent = solved.usage.total_tokens if solved.attempt is not None and solved.usage is not None else 0
            rollout = Rollout(key=key, seed=seed, error=outcome.error, task_tokens=spent)
        else:
            assert solved.attempt is not None and outcome.verdict is not None  # no error: solved and judged
            rollout = rollout_from_attempt(outcome.problem, seed, solved.attempt, outcome.verdict)
        if tag is None or self.replayed is None:
            return rollout
        return dataclasses.replace(rollout, replayed_tokens=self.replayed(tag))

    def score_program(self, problem: Problem, program: str | None) -> Verdict:
        """The judge on a problem's training tests (MASPO's reward for intermediate programs)."""
        return self.engine.judge.score(problem, program)

    def settings(self) -> JsonObject:
        """What goes into the rollout cache key besides prompts: everything that changes a run."""
        topo = {k: v for k, v in dataclasses.asdict(self.cfg.topology).items() if k not in ("prompts", "prompt_file", "_target_")}
        judge = {k: v for k, v in dataclasses.asdict(self.cfg.judge).items() if k != "workers"}
        return {
            "topology": topo,
            "judge": judge,
            "tool": dataclasses.asdict(self.cfg.tool),
            "max_tests_per_row": self.cfg.max_tests_per_row,
        }

    def model_identity(self) -> JsonObject:
        m = flat_model(dataclasses.asdict(self.cfg.model))  # the cache's keys were made from the flat layout
        keys = ("name", "provider", "model_id", "temperature", "top_p", "max_tokens", "extra_body", "wrong_fraction")
        return {k: m[k] for k in keys}
