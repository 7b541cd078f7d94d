"""Building a SolveContext for one problem: the one place a cell's pieces meet a runner."""

from __future__ import annotations

from typing import Any, Mapping

from apps_bench.topologies.base import PromptSet, SolveContext
from apps_bench.topologies.prompts import load_prompts, roles_for
from apps_bench.types import Problem, Usage


def as_topology_config(cfg: Any) -> Any:
    """A plain mapping (e.g. a resolved config dict) -> a TopologyConfig-typed DictConfig.

    Runners read `ctx.config.max_steps` etc. as attributes; typing it here also turns a
    wrong type in a hand-built config into a clear error before any model call.
    """
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg) or not isinstance(cfg, Mapping):
        return cfg
    from apps_bench.config import TopologyConfig

    return OmegaConf.merge(OmegaConf.structured(TopologyConfig), dict(cfg))


def build_context(
    problem: Problem,
    topology_cfg: Any,
    *,
    models: Any,
    tool: Any,
    seed: int,
    usage: Usage,
    prompts: PromptSet | None = None,
    prompt: str | None = None,
) -> SolveContext:
    """`usage` must be the Usage the ModelClients and the PythonExecTool count into.

    `prompts` defaults to the config's prompt set (or its prompt_file); an optimizer
    passes its candidate prompt set here. `prompt` defaults to `task.frame(problem)`.
    """
    topology_cfg = as_topology_config(topology_cfg)
    if prompt is None:
        from apps_bench.task import frame

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
