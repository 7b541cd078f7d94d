"""Hydra callbacks for multirun sweeps: check the whole sweep, then set up MLflow once.

`on_multirun_start` runs in the launching process before any cell starts. It expands
the sweep exactly as Hydra's basic sweeper does (sweep params declared in config first,
command-line overrides win), composes every cell, and refuses the sweep if any cell lies
outside the grid: `SystemExit(2)` (Hydra only warns on a plain exception from a callback).
Then it creates the tracking store, the experiment and the sweep's parent run, and hands
the store URI and parent run id to the cells through the environment (cells may run in
other processes: joblib, submitit, Ray). The parent run is closed in `on_multirun_end`, or
at exit when a cell failed (Hydra skips `on_multirun_end` then).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def sweep_overrides(config: DictConfig) -> list[list[str]]:
    """The override list of every cell of the sweep, in launch order."""
    import itertools

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    args = [f"{k}={v}" for k, v in params.items()]
    args += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))  # type: ignore[arg-type]
    loader = GlobalHydra.instance().config_loader()
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(args)
    choices = []  # the basic sweeper's order: the cartesian product, in the order the overrides come
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([f"{key}={o.get_value_element_as_str()}"])
    return [list(cell) for cell in itertools.product(*choices)]


def check_sweep(config: DictConfig) -> tuple[int, list[str]]:
    """Compose every cell of the sweep; check its settings and the grid guard, and (for local
    data: the demos or a file) that its selection holds problems. -> (cells, refusals).

    A hub dataset's selection is checked by each cell at its start instead: reading the hub
    here would stream the rows once more, and the launching host may not be where cells run."""
    import json

    from hydra.core.global_hydra import GlobalHydra

    from apps_bench.cell import CellRefused, guard
    from apps_bench.config import cell_data

    loader = GlobalHydra.instance().config_loader()
    cells = sweep_overrides(config)
    refusals: list[str] = []
    checked: dict[str, str | None] = {}  # selection -> refusal (cells of a sweep mostly share one)
    for overrides in cells:
        data = cell_data(loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides)))
        try:
            guard(data)
            ds = data.get("dataset") or {}
            if ds.get("source") == "demo" or ds.get("path"):
                sel = {k: data.get(k) for k in ("limit", "offset", "only", "difficulty", "max_tests_per_row")}
                key = json.dumps([ds, sel], sort_keys=True, default=str)
                if key not in checked:
                    checked[key] = _selection_refusal(data)
                if checked[key]:
                    raise CellRefused(checked[key])
        except CellRefused as e:
            refusals.append(f"[{' '.join(overrides)}] {e}")
    return len(cells), refusals


def _selection_refusal(data: dict[str, Any]) -> str | None:
    from apps_bench.config import typed_config
    from apps_bench.data import load_selection
    from apps_bench.validate import InvalidSettings, empty_selection

    try:
        bad = empty_selection(load_selection(typed_config(data)), data)
    except (ValueError, OSError) as exc:
        return f"cannot load dataset {data['dataset'].get('name')}: {exc}"
    return str(InvalidSettings([bad])) if bad is not None else None


class SweepTracking(Callback):
    def __init__(self) -> None:
        self._parent: tuple[str, str] | None = None
        self._closed = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        n, refusals = check_sweep(config)
        if refusals:
            print(
                f"apps-bench: {len(refusals)} of {n} cells of this sweep are refused; nothing was run.",
                file=sys.stderr,
            )
            for r in refusals:
                print("  " + r, file=sys.stderr)
            sys.stderr.flush()
            raise SystemExit(2)

        from apps_bench.tracking import mlflow as mlf

        experiment = str(OmegaConf.select(config, "tracking.experiment") or "apps")
        uri = mlf.tracking_uri()
        overrides = " ".join(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))  # type: ignore[arg-type]
        tags = {"sweep_overrides": overrides[:5000], "n_cells": str(n), **mlf.git_info()}
        tags["package_version"] = mlf.package_version()
        name = f"sweep·{n} cells"
        uri, run_id = mlf.start_parent_run(experiment=experiment, run_name=name, tags=tags, uri=uri)
        self._parent = (uri, run_id)
        os.environ["MLFLOW_TRACKING_URI"] = uri
        os.environ[mlf.PARENT_RUN_ENV] = run_id
        print(f"apps-bench: sweep of {n} cells; MLflow parent run {run_id} ({uri})", file=sys.stderr)
        atexit.register(self._close, "FAILED")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._close("FINISHED")
        finally:
            _stop_idle_launcher_workers()

    def _close(self, status: str) -> None:
        if self._closed or self._parent is None:
            return
        self._closed = True
        from apps_bench.tracking import mlflow as mlf

        uri, run_id = self._parent
        if status == "FINISHED":
            # cells that failed or stayed incomplete make the sweep incomplete
            kids = mlf.child_runs(uri, run_id)
            if any(k.info.status != "FINISHED" for k in kids):
                status = "FAILED"
        try:
            mlf.end_run(uri, run_id, status)
        finally:
            os.environ.pop(mlf.PARENT_RUN_ENV, None)


def _stop_idle_launcher_workers() -> None:
    """The joblib launcher (loky) keeps its worker processes for minutes after the sweep,
    holding the command's stdout open: `apps-bench -m ... | tee log` would wait for them."""
    mod = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(mod, "_executor", None) if mod is not None else None
    if executor is not None:
        stop = getattr(executor, "terminate", None)  # joblib's executor also removes its /dev/shm folder
        stop() if stop is not None else executor.shutdown(wait=True)
