"""Topology name -> runner class, imported only when a cell asks for it.

Each framework is an optional extra; a cell whose framework is not installed fails
here, at start, with the pip command that fixes it, instead of deep inside a run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from apps_bench.config import TopologyConfig
from apps_bench.models.clients import MissingFrameworkError
from apps_bench.topologies.base import Topology
from apps_bench.topologies.prompts import TopologyConfigError


@dataclass(frozen=True)
class RunnerSpec:
    target: str  # "module:Class"; the class is built as Class(topology_cfg)
    framework: str


RUNNERS: dict[str, RunnerSpec] = {
    "single": RunnerSpec("apps_bench.topologies.single:SingleTopology", "langgraph"),
    "independent": RunnerSpec("apps_bench.topologies.independent:IndependentTopology", "langgraph"),
    "sequential_langgraph": RunnerSpec("apps_bench.topologies.sequential_langgraph:SequentialLangGraph", "langgraph"),
    "sequential_crewai": RunnerSpec("apps_bench.topologies.sequential_crewai:SequentialCrewAI", "crewai"),
    "centralized_langgraph": RunnerSpec(
        "apps_bench.topologies.centralized_langgraph:CentralizedLangGraph", "langgraph"
    ),
    "centralized_autogen": RunnerSpec("apps_bench.topologies.centralized_autogen:CentralizedAutoGen", "autogen"),
    "decentralized_langgraph": RunnerSpec(
        "apps_bench.topologies.decentralized_langgraph:DecentralizedLangGraph", "langgraph"
    ),
    "decentralized_openai": RunnerSpec("apps_bench.topologies.decentralized_openai:DecentralizedOpenAI", "openai"),
}

# What every runner's first problem would import lazily: framing and extraction, and the
# connection stack of our httpx2 clients (models/clients.py). Imported with the framework
# (in the forkserver, before workers fork), so no solving process pays for it mid-cell.
FIRST_PROBLEM = ("apps_bench.task.prompt", "apps_bench.task.extract", "httpcore2", "h11", "anyio._backends._asyncio", "truststore")

# framework -> (modules it needs, imported at cell start; the pip command that installs them)
FRAMEWORKS: dict[str, tuple[tuple[str, ...], str]] = {
    # everything the LangGraph runners import lazily, so the first problem does not pay for it
    "langgraph": (
        ("langgraph.graph", "langgraph.types", "langgraph.errors", "langchain_core.messages", "langchain_core.tools",
         "langchain_openai", "openai.resources", "langchain_core.tracers.stdout", *FIRST_PROBLEM),
        "pip install apps-bench",
    ),
    "crewai": (("crewai", *FIRST_PROBLEM), "pip install 'apps-bench[crewai]'"),
    "autogen": (("autogen_agentchat", "autogen_ext.models.openai", *FIRST_PROBLEM), "pip install 'apps-bench[autogen]'"),
    "openai": (("openai", "openai.resources", *FIRST_PROBLEM), "pip install apps-bench"),  # the SDK loads resources on first use
}


def _missing(framework: str, topology: str, why: str) -> MissingFrameworkError:
    who = f"topology {topology!r} needs " if topology else ""
    return MissingFrameworkError(
        f"{who}the {framework} framework, which is not installed ({why}). Install it with: {FRAMEWORKS[framework][1]}"
    )


def check_framework(framework: str, topology: str = "") -> None:
    """Without importing it (the solver processes do): is the framework installed?"""
    import importlib.util

    for top in dict.fromkeys(mod.split(".")[0] for mod in FRAMEWORKS[framework][0]):
        if importlib.util.find_spec(top) is None:
            raise _missing(framework, topology, f"no module named {top!r}")


def require_framework(framework: str, topology: str = "") -> None:
    """Import the framework's modules now, so a missing extra fails the cell at start."""
    for mod in FRAMEWORKS[framework][0]:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise _missing(framework, topology, f"{mod}: {exc}") from exc


def get_topology(cfg: TopologyConfig) -> Topology:
    """Build the runner named by `cfg.name`."""
    name = cfg.name
    spec = RUNNERS.get(name)
    if spec is None:
        raise TopologyConfigError(f"unknown topology {name!r}; valid topologies: {', '.join(sorted(RUNNERS))}")
    framework = cfg.framework
    if framework != spec.framework:
        raise TopologyConfigError(
            f"topology {name!r} runs on {spec.framework}, but its config says framework={framework!r}"
        )
    require_framework(spec.framework, name)
    module_name, cls_name = spec.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise TopologyConfigError(
                f"topology {name!r} is registered but its runner module {module_name} is not in this install"
            ) from exc
        raise
    return getattr(module, cls_name)(cfg)
