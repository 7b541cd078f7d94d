"""`hydra/launcher=slurm`: hydra-submitit-launcher's SLURM launcher, watched by apps-bench
(apps_bench/launchers/slurm.py says what changes and why)."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError:  # extra `launchers` not installed; Hydra's plugin scan imports this module at every start
    _SubmititSlurmLauncher = None

if _SubmititSlurmLauncher is not None:

    class SlurmLauncher(_SubmititSlurmLauncher):
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            from apps_bench.launchers.slurm import watched_launch

            return watched_launch(super().launch, self.params["submitit_folder"], job_overrides, initial_job_idx)
