"""What each launcher needs on the launching host, checked before a sweep creates anything.

Hydra imports a launcher's package only when it launches the first cell, after the sweep's
parent run exists: a missing package ended in a raw ModuleNotFoundError, and SLURM's tools
missing in "did not accept the sweep's jobs". Checked first, both are a setting the user can
fix: one line, the fix, exit 2, nothing written. Data, keyed by the launcher's `_target_`
(conf/hydra/launcher/*.yaml); a launcher not listed needs nothing beyond the core install.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Needs:
    option: str  # the hydra/launcher option that selects it
    modules: tuple[str, ...]  # importable in the launching process
    pip: str  # the command that installs them
    commands: tuple[str, ...] = ()  # on PATH in the launching process
    without_commands: str = ""  # what to do where those commands are not


_LAUNCHERS_EXTRA = "pip install 'apps-bench[launchers]'"
_SLURM_TOOLS = (
    "Run the sweep on a SLURM login node, start the one-node cluster of launchers/slurm_local.sh, "
    "or choose a launcher of this machine: hydra/launcher=local_parallel"
)
LAUNCHERS: dict[str, Needs] = {
    "hydra_plugins.apps_bench_launchers.ray_launcher.RayCellLauncher": Needs(
        "ray_cluster", ("ray",), "pip install 'apps-bench[ray]'"
    ),
    "hydra_plugins.apps_bench_launchers.slurm_launcher.SlurmLauncher": Needs(
        "slurm",
        ("submitit", "hydra_plugins.hydra_submitit_launcher"),
        _LAUNCHERS_EXTRA,
        ("sbatch", "srun", "squeue"),
        _SLURM_TOOLS,
    ),
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": Needs(
        "slurm_local", ("submitit", "hydra_plugins.hydra_submitit_launcher"), _LAUNCHERS_EXTRA
    ),
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": Needs(
        "local_parallel", ("joblib", "hydra_plugins.hydra_joblib_launcher"), _LAUNCHERS_EXTRA
    ),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing, or an import hook that refuses it
        return False


def launcher_problem(target: str) -> str | None:
    """Why the launcher `target` cannot launch from this process, with the fix; None when it can."""
    needs = LAUNCHERS.get(target)
    if needs is None:
        return None
    missing = [m for m in needs.modules if not _importable(m)]
    if missing:
        return (
            f"hydra/launcher={needs.option} needs {', '.join(missing)}, which is not installed here; "
            f"nothing was run. Install it: {needs.pip}"
        )
    absent = [c for c in needs.commands if shutil.which(c) is None]
    if absent:
        return (
            f"hydra/launcher={needs.option} needs {', '.join(absent)} on PATH, not found on this host; "
            f"nothing was run. {needs.without_commands}"
        )
    return None
