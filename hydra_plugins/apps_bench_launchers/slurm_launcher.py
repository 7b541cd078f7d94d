"""`hydra/launcher=slurm`: hydra-submitit-launcher's SLURM launcher, watched by apps-bench
(apps_bench/launchers/slurm.py says what changes and why).

No `from __future__ import annotations`: Hydra executes this module outside sys.modules, where
dataclasses cannot resolve string annotations."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from omegaconf import MISSING

try:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError:  # extra `launchers` not installed; Hydra's plugin scan imports this module at every start
    _SubmititSlurmLauncher = None

if _SubmititSlurmLauncher is not None:

    @dataclass
    class WatchedSlurmConf(SlurmQueueConf):
        """submitit's SLURM settings and how often the sweep asks squeue about its jobs
        (conf/hydra/launcher/slurm.yaml sets it)."""

        _target_: str = "hydra_plugins.apps_bench_launchers.slurm_launcher.SlurmLauncher"
        poll_s: float = MISSING

    ConfigStore.instance().store(
        group="hydra/launcher", name="apps_bench_slurm", node=WatchedSlurmConf, provider="apps_bench"
    )

    class SlurmLauncher(_SubmititSlurmLauncher):
        def __init__(self, poll_s: float, **params: Any) -> None:
            super().__init__(**params)  # submitit's own settings only: it passes each one to sbatch
            self.poll_s = float(poll_s)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            from apps_bench.launchers.slurm import watched_launch

            return watched_launch(
                super().launch, self.params["submitit_folder"], job_overrides, initial_job_idx, poll_s=self.poll_s
            )
