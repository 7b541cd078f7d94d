"""A cell's tracking run: an MLflow run (`tracking=mlflow`) or none (`tracking=none`).

The store is checked first, before the cell creates anything (`check_store`: one request
to a server, a permission look at a SQLite file). The cell then opens its run on a
background thread while its first problems run (importing mlflow and reaching the store
take seconds); a store that fails stops the cell at the next recorded problem, and the
records written so far are kept for the rerun (which logs them without solving them again).
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol

from apps_bench.cell.key import Cell
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking import provenance
from apps_bench.tracking.mlflow import StoreUnavailable
from apps_bench.types import JsonObject

if TYPE_CHECKING:
    from apps_bench.config.schema import Config


class DataSource(Protocol):
    """Where a cell's problems came from (data.load_problems' result), as its run's tags name it."""

    @property
    def revision(self) -> object: ...

    @property
    def source(self) -> object: ...


class Tracker(Protocol):
    """A cell's tracking run: tracking.mlflow.CellRun, or NoRun for `tracking=none`."""

    @property
    def run_id(self) -> str | None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None: ...

    def finish(
        self,
        *,
        metrics: Mapping[str, float],
        rows: list[JsonObject],
        files: Iterable[Path],
        complete: bool,
        tags: Mapping[str, str] | None = None,
        dirs: Mapping[str, Path] | None = None,
    ) -> None: ...

    def fail(self, message: str) -> None: ...


class NoRun:
    """`tracking=none`: the same calls as `tracking.mlflow.CellRun`, recording nothing."""

    run_id: str | None = None
    resumed = False

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        pass

    def finish(self, **_: object) -> None:
        pass

    def fail(self, message: str) -> None:
        pass


def fail_run(run: Tracker | Future[Tracker], exc: BaseException) -> None:
    """Mark `run` FAILED with `exc`, the error ending the cell (`run` still opening on a thread:
    once it is open). Not on Ctrl-C or exit (the run stays open for the rerun, which resumes it),
    nor when the store itself is gone (it cannot be told). Called while `exc` propagates, so the
    store failing too, or the run never opening, is swallowed: `exc` is the error to show."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, StoreUnavailable)):
        return
    try:
        (run.result() if isinstance(run, Future) else run).fail(f"{type(exc).__name__}: {exc}")
    except Exception:  # noqa: BLE001 - see above: never hide `exc`
        pass


def check_store(config: Config) -> None:
    """The cell's tracking store, checked before anything is created (StoreError with the fix)."""
    if config.tracking.backend == "none" or config.tracking.store is None:
        return

    mlf.check_store(mlf.tracking_uri(), config.tracking.store)


def cell_tags(config: Config, cell: Cell, loaded: DataSource) -> dict[str, str]:
    """What a cell's run is found and grouped by: its axes, the model's identity, judge, data, code."""

    return {
        **{k: str(v) for k, v in cell.axes().items()},
        # the model's identity: the report's "model" column must not merge different served models
        "model": cell.model_label,
        "model_preset": cell.model,
        "model_id": config.model.model_id,
        "endpoint_kind": config.model.provider,
        "cell_key": cell.key,
        "cell_name": cell.name,
        "framework": config.topology.framework,
        "judge_profile": config.judge.profile,
        "max_tests_per_row": str(config.max_tests_per_row),
        "dataset_revision": str(loaded.revision),
        "dataset_source": str(loaded.source),
        "package_version": provenance.package_version(),
        **provenance.git_info(),
    }


def open_run(
    config: Config, cell: Cell, loaded: DataSource, *, extra_tags: Mapping[str, str] | None = None, idle: bool = False
) -> Tracker:
    """The cell's run (found again by its cell key on resume); `idle`: nothing is left to solve, so a
    finished run found again is left as it is unless something to log changed."""
    if config.tracking.backend == "none":
        return NoRun()

    tags = {**cell_tags(config, cell, loaded), **(extra_tags or {})}
    return mlf.CellRun.open(
        experiment=config.tracking.experiment,
        cell_key=cell.key,
        run_name=cell.name,
        params=dict(cell.identity),
        tags=tags,
        idle=idle,
    )
