"""Building a SolveContext for one problem: the one place a cell's pieces meet a runner."""

from __future__ import annotations

from typing import TYPE_CHECKING

from apps_bench.config.schema import TopologyConfig
from apps_bench.task import frame
from apps_bench.topologies.base import PromptSet, SolveContext
from apps_bench.topologies.prompts import load_prompts, roles_for
from apps_bench.types import Problem, Usage

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.models.clients import ModelClients
    from apps_bench.sandbox.tool import PythonExecTool


def build_context(
    problem: Problem,
    topology_cfg: TopologyConfig,
    *,
    models: ModelClients,
    tool: PythonExecTool,
    seed: int,
    usage: Usage,
    prompts: PromptSet | None = None,
    prompt: str | None = None,
) -> SolveContext:
    """`usage` must be the Usage the ModelClients and the PythonExecTool count into; runners
    read `ctx.config` (the typed topology config) as attributes.

    `prompts` defaults to the config's prompt set (or its prompt_file); an optimizer
    passes its candidate prompt set here. `prompt` defaults to `task.frame(problem)`.
    """
    if prompt is None:
        prompt = frame(problem)
    return SolveContext(
        problem=problem,
        prompt=prompt,
        prompts=prompts if prompts is not None else load_prompts(topology_cfg),
        roles=roles_for(topology_cfg),
        seed=int(seed),
        config=topology_cfg,
        models=models,
        tool=tool,
        usage=usage,
    )
