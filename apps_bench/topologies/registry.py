"""A topology's runner class (its config's `_target_`), imported only when a cell asks for it.

Each framework is an optional extra; a cell whose framework is not installed fails
here, at start, with the pip command that fixes it, instead of deep inside a run.
"""

from __future__ import annotations

import importlib

from apps_bench.cell.frameworks import FRAMEWORKS
from apps_bench.config.schema import TargetError, TopologyConfig, resolve_target
from apps_bench.models.clients import MissingFrameworkError
from apps_bench.topologies.base import Topology
from apps_bench.topologies.prompts import TopologyConfigError

# What every runner's first problem would import lazily: the connection stack of our httpx2 clients
# (models/clients.py; our own modules are imported at the top, so they need no entry). Imported after
# the framework (in the forkserver, before workers fork), so no solving process pays for it mid-cell;
# these are the project's own dependencies, so one missing is its own ImportError, never "framework
# not installed".
FIRST_PROBLEM = ("httpcore2", "h11", "anyio._backends._asyncio", "truststore")


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
    """Import the framework's modules now, so a missing extra fails the cell at start; then what the
    first problem would import (FIRST_PROBLEM)."""
    for mod in FRAMEWORKS[framework][0]:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise _missing(framework, topology, f"{mod}: {exc}") from exc
    for mod in FIRST_PROBLEM:
        importlib.import_module(mod)


def runner_module(cfg: TopologyConfig) -> str:
    """The module of the topology's runner class (`topology._target_`)."""
    return cfg._target_.rpartition(".")[0]


def get_topology(cfg: TopologyConfig) -> Topology:
    """Build the runner class `cfg._target_` names, after importing its framework."""
    name = cfg.name
    require_framework(cfg.framework, name)
    try:
        runner = resolve_target(cfg._target_)
    except TargetError as e:
        raise TopologyConfigError(f"topology {name!r}: {e}; check topology._target_ (conf/topology/{name}.yaml)") from None
    if getattr(runner, "framework", None) != cfg.framework:
        raise TopologyConfigError(
            f"topology {name!r} runs on {getattr(runner, 'framework', '?')}, but its config says framework={cfg.framework!r}"
        )
    return runner(cfg)  # type: ignore[no-any-return]
