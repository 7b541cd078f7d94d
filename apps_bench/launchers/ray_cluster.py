"""Cells of a sweep as Ray tasks: the body of `hydra/launcher=ray_cluster`.

The Hydra plugin class (`hydra_plugins/apps_bench_launchers/ray_launcher.py`) only hands over;
this module connects to the cluster, checks that some node can run a cell at all, submits
one task per cell and waits, reporting instead of waiting silently.

Why our own launcher and not hydra-ray-launcher: every release of it requires
`cloudpickle<3` (for its AWS launcher), and joblib 1.6 requires `cloudpickle>=3`, so
installing it downgrades both for the whole project. It also always passes
`object_store_memory` to `ray.init`, which Ray refuses when joining a running cluster.

What a cell sees in its Ray worker: the driver's working directory (`hydra.runtime.cwd`),
so `outputs/` (cell folders, Hydra's sweep folder, a default SQLite store) land where the
sweep was launched, not where `ray start` ran; the sweep's tracking settings, which Hydra's
`hydra.job.env_set` sets in the job (tracking/callbacks.py, the same on every launcher); and
any `ray.init.runtime_env.env_vars`. `ray` is imported only here, inside functions.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Mapping, Sequence

from apps_bench.config.schema import as_plain
from apps_bench.tracking.faults import SweepStopped
from apps_bench.types import JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig

TASK_NAME = "apps_bench_cell"  # the Ray task name (Ray's logs and state API show it)


def _say(msg: str) -> None:
    sys.stdout.flush()
    print(f"apps-bench: ray: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- resources


def demand(remote: JsonObject) -> dict[str, float]:
    """What one cell's task asks of a node, in Ray's resource names (a task's CPU default is 1)."""
    cpus = remote.get("num_cpus")
    need = {"CPU": float(1 if cpus is None else cpus)}
    for key, name in (("num_gpus", "GPU"), ("memory", "memory")):
        if remote.get(key):
            need[name] = float(remote[key])
    for name, amount in (remote.get("resources") or {}).items():
        need[str(name)] = float(amount)
    return {k: v for k, v in need.items() if v > 0}


@dataclass(frozen=True)
class Node:
    address: str
    resources: dict[str, float]

    def fits(self, need: Mapping[str, float]) -> bool:
        return all(self.resources.get(k, 0.0) >= v for k, v in need.items())


def alive_nodes(ray_nodes: Sequence[JsonObject]) -> list[Node]:
    """`ray.nodes()` -> the nodes that are alive."""
    return [
        Node(str(n.get("NodeManagerAddress", "?")), {k: float(v) for k, v in (n.get("Resources") or {}).items()})
        for n in ray_nodes
        if n.get("Alive")
    ]


def _fmt(res: Mapping[str, float], keys: Sequence[str]) -> str:
    def num(v: float) -> str:
        return f"{v:g}" if v < 1e6 else f"{v / 2**30:.1f} GiB"

    return ", ".join(f"{k}={num(res.get(k, 0.0))}" for k in keys)


def infeasible(need: Mapping[str, float], nodes: Sequence[Node]) -> str | None:
    """Why no node can ever run a cell (None when one can): the request, the nodes, the fix."""
    if any(n.fits(need) for n in nodes):
        return None
    keys = list(need)
    if not nodes:
        return "the Ray cluster has no live node. Fix: start one (`ray start --head`) and rerun."
    biggest = max(nodes, key=lambda n: tuple(n.resources.get(k, 0.0) for k in keys))
    fix = []
    if "CPU" in need and need["CPU"] > biggest.resources.get("CPU", 0.0):
        fix.append(f"hydra.launcher.ray.remote.num_cpus={max(1, int(biggest.resources.get('CPU', 0.0)))} (or fewer)")
    if "GPU" in need and need["GPU"] > biggest.resources.get("GPU", 0.0):
        fix.append(
            "hydra.launcher.ray.remote.num_gpus=0"
            if not biggest.resources.get("GPU")
            else f"hydra.launcher.ray.remote.num_gpus={biggest.resources['GPU']:g}"
        )
    fix.append("or add a node that large to the cluster")
    return (
        f"no node of the Ray cluster can run a cell: each cell asks {_fmt(need, keys)} "
        f"(hydra.launcher.ray.remote), the largest of its {len(nodes)} node(s) ({biggest.address}) has "
        f"{_fmt(biggest.resources, keys)}. Fix: {', '.join(fix)}."
    )


# ----------------------------------------------------------------------------- the worker side


def run_cell_task(
    hydra_context: HydraContext, sweep_config: DictConfig, task_function: TaskFunction, singleton_state: object
) -> JobReturn | SweepStopped:
    """Run one cell as a Hydra job inside a Ray worker, in the driver's working directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    enter_driver_cwd(str(sweep_config.hydra.runtime.cwd))
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    try:
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except SweepStopped as stop:  # a SystemExit would end this worker without a result: the driver raises it
        return stop


def enter_driver_cwd(cwd: str) -> None:
    """chdir to the directory the sweep was launched from; on a node that lacks it (no shared
    filesystem) it is made, and the cell's files stay on that node: say so."""
    path = Path(cwd)
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        _say(
            f"{cwd} (the sweep's working directory) did not exist on this node; the cell's outputs/ stay here, "
            "on this node's disk. Run the sweep from a shared filesystem to gather them."
        )
    os.chdir(path)


# ----------------------------------------------------------------------------- the driver side


def _init_kwargs(init: JsonObject) -> JsonObject:
    """ray.init's arguments from the preset: unset (null) ones left out, so Ray's own defaults
    apply (joining a running cluster, Ray refuses e.g. `object_store_memory`); env var values
    as strings (an unset variable of the driver arrives as "", which cells read as unset)."""
    kw = {k: v for k, v in init.items() if v is not None or k == "address"}
    env = (kw.get("runtime_env") or {}).get("env_vars") or {}
    if env:
        kw["runtime_env"] = {**kw["runtime_env"], "env_vars": {str(k): "" if v is None else str(v) for k, v in env.items()}}
    return kw


def _warn_local_store(nodes: Sequence[Node]) -> None:
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if len(nodes) > 1 and (not uri or uri.startswith("sqlite:")):
        _say(
            f"WARNING: the cluster has {len(nodes)} nodes and cells log to a local SQLite store ({uri or 'the default'}): "
            "cells on other nodes would each write their own file. Start one tracking server "
            "(launchers/mlflow_server.sh) and export MLFLOW_TRACKING_URI before the sweep."
        )


def launch(
    *,
    ray_cfg: DictConfig,
    report_every_s: float,
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> list[JobReturn]:
    """Run every cell of the batch as a Ray task; the JobReturns in launch order."""
    import ray
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, filter_overrides, setup_globals
    from omegaconf import open_dict

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    init, remote = dict(as_plain(ray_cfg["init"])), dict(as_plain(ray_cfg["remote"]))
    if not ray.is_initialized():
        try:
            ray.init(**_init_kwargs(init))
        except ConnectionError as exc:
            _say(
                f"cannot reach the Ray cluster at {init.get('address')!r}: {exc} Fix: start it (`ray start --head`) and "
                "export RAY_ADDRESS=<the address `ray start` printed>, or unset RAY_ADDRESS to start a local Ray "
                "for this sweep. Nothing was run."
            )
            raise SystemExit(2) from None
    need = demand(remote)
    nodes = alive_nodes(ray.nodes())
    why = infeasible(need, nodes)
    if why:
        _say(f"{why} Nothing was run.")
        raise SystemExit(2)
    _warn_local_store(nodes)

    task = ray.remote(**{"name": TASK_NAME, **remote})(run_cell_task)
    refs: list[object] = []  # Ray's ObjectRefs
    labels: list[str] = []
    for i, overrides in enumerate(job_overrides):
        idx = initial_job_idx + i
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"ray_{idx}"
            sweep_config.hydra.job.num = idx
        labels.append(f"#{idx} {' '.join(filter_overrides(overrides))}")
        refs.append(task.remote(hydra_context, sweep_config, task_function, Singleton.get_state()))
    _say(f"{len(refs)} cells submitted as Ray tasks ({_fmt(need, list(need))} each) to {len(nodes)} node(s)")
    try:
        return _wait(ray, refs, labels, job_overrides, need, report_every_s)
    except BaseException:
        # only the cells still running: force-cancelling a task that has ended (the cell that stopped the sweep)
        # races its reply, which has crashed the driver inside Ray (task_manager.cc "unexpected system state")
        _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in running:
            ray.cancel(ref, force=True)
        raise


def _wait(
    ray: ModuleType,
    refs: list[object],
    labels: list[str],
    job_overrides: Sequence[Sequence[str]],
    need: Mapping[str, float],
    report_every_s: float,
) -> list[JobReturn]:
    """Collect the cells as they finish; say what is still waiting every `report_every_s`, and stop
    with a message when no live node can run the remaining cells any more (a node left)."""
    index = {ref: i for i, ref in enumerate(refs)}
    results: dict[int, JobReturn] = {}
    pending = list(refs)
    t0 = time.monotonic()
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=report_every_s)
        for ref in ready:
            i = index[ref]
            results[i] = _result(ray, ref, job_overrides[i], labels[i])
        if ready or not pending:
            continue
        why = infeasible(need, alive_nodes(ray.nodes()))
        if why:
            _say(f"{len(pending)} cell(s) can no longer be scheduled: {why}")
            raise SystemExit(2)
        free = ray.available_resources()
        _say(
            f"{len(refs) - len(pending)} of {len(refs)} cells done after {time.monotonic() - t0:.0f}s; "
            f"{len(pending)} running or queued (free now: {_fmt(free, list(need))})"
        )
    return [results[i] for i in range(len(refs))]


def _result(ray: ModuleType, ref: object, overrides: Sequence[str], label: str) -> JobReturn:
    """The cell's JobReturn; a task that ended without one (its worker died, it was cancelled)
    becomes a failed JobReturn saying so, and the other cells go on. A cell that stopped the sweep
    (faults.SweepStopped: a full disk, a lost store) stops it here too."""
    from hydra.core.utils import JobReturn, JobStatus

    try:
        result = ray.get(ref)
    except ray.exceptions.RayError as exc:
        _say(f"cell {label} ended without a result: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
        err = RuntimeError(
            f"Ray task of cell {label} ended without a result ({type(exc).__name__}); "
            "rerun the sweep: finished cells are skipped, this one resumes from its records"
        )
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=err)
    if isinstance(result, SweepStopped):  # the cell's surroundings failed: the sweep stops (its other cells cancelled)
        print(f"apps-bench: {result.line}", file=sys.stderr, flush=True)  # Ray forwards the cell's own output late, if at all
        raise result
    return result
