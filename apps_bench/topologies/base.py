"""The topology interface: every runner is a flow over the same shared pieces.

A runner receives a `SolveContext` (framed prompt, prompt set, model clients,
python_exec tool, seed, limits) and returns an `Attempt`. Loading, framing,
extraction, voting, judging and logging are never a runner's business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

from apps_bench.types import Attempt, Problem, TranscriptEvent, Usage

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.config.schema import TopologyConfig
    from apps_bench.models.clients import ModelClients
    from apps_bench.sandbox.tool import PythonExecTool


@dataclass(frozen=True)
class PromptSet:
    """Role -> prompt text, for exactly the roles a topology declares. A value, never a global."""

    texts: Mapping[str, str]

    def __getitem__(self, role: str) -> str:
        try:
            return self.texts[role]
        except KeyError:
            raise KeyError(f"no prompt for role {role!r}; the prompt set has {sorted(self.texts)}") from None

    def replace(self, role: str, text: str) -> PromptSet:
        return PromptSet({**self.texts, role: text})


def agent_seed(cell_seed: int, agent_index: int) -> int:
    """Distinct, reproducible request seed for agent i of a team (agent 0 keeps the cell seed)."""
    return cell_seed if agent_index == 0 else (cell_seed * 1_000_003 + agent_index * 7919) % (2**31 - 1)


@dataclass
class SolveContext:
    problem: Problem
    prompt: str  # the framed problem (task.frame)
    prompts: PromptSet
    roles: list[str]  # ordered roles for the configured team size
    seed: int
    config: TopologyConfig
    models: ModelClients  # builds metered clients for each framework; usage lands in `usage`
    tool: PythonExecTool  # python_exec through the shared sandbox
    usage: Usage = field(default_factory=Usage)
    transcript: list[TranscriptEvent] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.started + float(self.config.time_limit_s)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, agent: str, role: str, kind: str, content: object, round: int = 0) -> None:
        self.transcript.append(TranscriptEvent(agent, role, kind, str(content), round))  # type: ignore[arg-type]
        if self.usage.trace is not None:
            self.usage.trace.event(len(self.transcript) - 1, kind)


class Topology(Protocol):
    name: str
    framework: str

    async def solve(self, ctx: SolveContext) -> Attempt: ...
