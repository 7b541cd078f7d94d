"""The Hydra plugin class of `hydra/launcher=ray_cluster`: cells as Ray tasks.

Hydra imports every module under `hydra_plugins` at startup, so this one imports only Hydra;
the work (and `import ray`) is in `apps_bench.launchers.ray_cluster`.
"""

from __future__ import annotations

from typing import Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class RayCellLauncher(Launcher):
    """`ray`: `init` (ray.init's arguments) and `remote` (each cell task's ray.remote options);
    `report_every_s`: how often a sweep that is waiting says what it waits for."""

    def __init__(self, ray: DictConfig, report_every_s: float) -> None:
        self.ray_cfg = ray
        self.report_every_s = float(report_every_s)
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from apps_bench.launchers.ray_cluster import launch

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return launch(
            ray_cfg=self.ray_cfg,
            report_every_s=self.report_every_s,
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=self.config,
            job_overrides=job_overrides,
            initial_job_idx=initial_job_idx,
        )
