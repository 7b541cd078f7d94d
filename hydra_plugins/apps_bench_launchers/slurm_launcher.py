"""`hydra/launcher=slurm`: hydra-submitit-launcher's SLURM launcher, watched by apps-bench
(apps_bench/launchers/slurm.py says what changes and why); `hydra/launcher=slurm_local`: its local
executor, whose cells stop the sweep on a failure of their surroundings the same way.

No `from __future__ import annotations`: Hydra executes this module outside sys.modules, where
dataclasses cannot resolve string annotations."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from omegaconf import MISSING

try:
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher as _SubmititLocalLauncher
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

    @dataclass
    class StoppingLocalConf(LocalQueueConf):
        """submitit's local executor, each cell a job on this machine (conf/hydra/launcher/slurm_local.yaml)."""

        _target_: str = "hydra_plugins.apps_bench_launchers.slurm_launcher.LocalLauncher"

    ConfigStore.instance().store(group="hydra/launcher", name="apps_bench_slurm", node=WatchedSlurmConf, provider="apps_bench")
    ConfigStore.instance().store(group="hydra/launcher", name="apps_bench_local", node=StoppingLocalConf, provider="apps_bench")

    def _stopped_job(job: Callable[..., Any], *args: Any) -> Any:
        """Run a cell in its job; a cell that stops the sweep (faults.SweepStopped, a SystemExit after which
        the job would leave no result) hands it back as its result, for the launching process to raise."""
        from apps_bench.tracking.faults import SweepStopped

        try:
            return job(*args)
        except SweepStopped as stop:
            return stop

    def _disks(launcher: Any) -> list[str]:
        """Where the sweep's jobs write: their submitit files and the cells' folders."""
        return [launcher.params["submitit_folder"], str(launcher.config.get("out_dir") or ".")]

    class LocalLauncher(_SubmititLocalLauncher):
        def __call__(self, *args: Any) -> Any:
            return _stopped_job(super().__call__, *args)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            from apps_bench.launchers.slurm import stopping_launch

            return stopping_launch(
                super().launch, self.params["submitit_folder"], job_overrides, initial_job_idx, disks=_disks(self)
            )

    class SlurmLauncher(_SubmititSlurmLauncher):
        def __init__(self, poll_s: float, **params: Any) -> None:
            super().__init__(**params)  # submitit's own settings only: it passes each one to sbatch
            self.poll_s = float(poll_s)

        def __call__(self, *args: Any) -> Any:
            return _stopped_job(super().__call__, *args)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            from apps_bench.launchers.slurm import watched_launch

            folder = self.params["submitit_folder"]
            return watched_launch(super().launch, folder, job_overrides, initial_job_idx, poll_s=self.poll_s, disks=_disks(self))
