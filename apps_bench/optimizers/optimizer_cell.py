"""An optimizer cell (`optimizer=maspo|gepa|...`): optimize the topology's prompts on training
problems, then evaluate the chosen prompt set on the cell's own problems with the plain
cell's spine (pipeline.evaluate), as a child of the optimizer cell's run.

The protocol (apps_bench/optimizers/optimization.py) caches every rollout, so a rerun replays the
optimization instead of recomputing it; the run layout is optimizers/cell_runs.py's.
"""

from __future__ import annotations

import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from apps_bench.cell.engine import Engine, fork_solvers
from apps_bench.cell.pipeline import CellResult, CellSetupError, Prepared, evaluate, keep_lock
from apps_bench.config.schema import Config, config_data
from apps_bench.data import LoadResult
from apps_bench.optimizers import cell_runs
from apps_bench.optimizers.cell_runs import StepMetricsSink, link_tags, open_final_eval_run, seed_cell_of
from apps_bench.optimizers.entry import run_optimizer
from apps_bench.optimizers.optimization import OptimizeResult, pool_and_splits, step_metrics
from apps_bench.optimizers.protocol import load_eval_set
from apps_bench.optimizers.scoring import InfrastructureDown
from apps_bench.topologies.base import PromptSet
from apps_bench.tracking import provenance
from apps_bench.tracking.records import CONFIG, PROMPTS
from apps_bench.tracking.run import Tracker, fail_run, open_run
from apps_bench.tracking.summary import metrics_of

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.optimizers.entry import OptimizerPool  # imported where it runs: it needs the optimizers extra


def check_optimizer_cell(config: Config, loaded: LoadResult) -> OptimizerPool:
    """What an optimizer cell needs that only its settings and data decide, checked with the cell's
    other checks (pipeline.prepare), before any process starts or any file is written: the extra
    installed, the pool loaded, its train/val splits drawn, the optimizer model composed.
    -> the pool (entry.OptimizerPool)."""
    name = config.optimizer.name
    try:
        from apps_bench.optimizers.entry import load_pool, optimizer_model_config
    except ImportError as exc:
        raise CellSetupError(
            f"optimizer={name} needs the optimizers extra: pip install 'apps-bench[optimizers]' ({exc})"
        ) from exc
    try:
        pool = load_pool(config)
        pool_and_splits(pool.problems, load_eval_set(), pool.eval_rows, config.optimizer.params.pool)
        optimizer_model_config(config.optimizer.params.optimizer_model, config.model)
    except ValueError as exc:  # bad pool or optimizer settings: the message says which
        raise CellSetupError(f"optimizer={name}: {exc}; nothing was run") from None
    return pool


def run_optimizer_cell(prep: Prepared) -> CellResult:
    """One engine for the whole cell (cell/engine.py): the rollouts and the final evaluation are solved
    and judged by the same endpoint, sandbox pool, judge and solver processes. Its pool comes
    checked from `prepare` (`check_optimizer_cell`)."""
    cell = prep.cell
    pool = prep.checked if prep.checked is not None else check_optimizer_cell(prep.config, prep.loaded)
    rows = list({p.key: p for p in [*pool.problems, *prep.problems]}.values())  # what a built-in server answers
    forked = fork_solvers(prep.config, max(len(pool.problems), len(prep.todo)))  # before this process starts any thread
    keep_lock(prep)
    with Engine.open(prep.config, rows, forked=forked, endpoint=prep.endpoint) as engine:
        tracker, prompts, result = _optimize(prep, engine, pool)
        prep.store.write_json(PROMPTS, dict(prompts.texts))
        try:
            final_run = functools.partial(open_final_eval_run, prep.config, cell, prep.loaded, tracker)
            evaluated = evaluate(prep, engine=engine, prompts=prompts, open_tracker=final_run)
        except BaseException as exc:
            fail_run(tracker, exc)
            raise
    _finish(tracker, prep, result, evaluated)
    return evaluated


def _optimize(prep: Prepared, engine: Engine, pool: OptimizerPool) -> tuple[Tracker, PromptSet, OptimizeResult]:
    """-> (the optimizer cell's tracking run, the chosen PromptSet, the OptimizeResult)."""
    cell = prep.cell

    tags = {**link_tags(cell, seed_cell_of(config_data(prep.config))), "run_kind": "optimizer_cell"}
    tx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apps-bench-tracking")
    sink = StepMetricsSink(tx.submit(open_run, prep.config, cell, prep.loaded, extra_tags=tags), step_metrics)
    tx.shutdown(wait=False)
    print(f"apps-bench: optimizer={cell.optimizer}: optimizing the {cell.topology} prompts first", file=sys.stderr)
    try:
        result = run_optimizer(prep.config, out_dir=prep.dir / "optimizer", hook=sink, engine=engine, pool=pool)
        tracker = sink.flush()
    except ValueError as exc:  # bad pool / optimizer settings: the message says which
        sink.fail(f"{type(exc).__name__}: {exc}")
        raise CellSetupError(f"optimizer={cell.optimizer}: {exc}") from exc
    except InfrastructureDown as exc:  # model/sandbox down: a clean stop; the rerun resumes through the cache
        sink.fail(f"{type(exc).__name__}: {exc}")
        raise CellSetupError(f"optimizer={cell.optimizer} stopped: {exc}") from exc
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            sink.fail(f"{type(exc).__name__}: {exc}")
        raise
    print(
        f"apps-bench: optimizer={cell.optimizer} chose a prompt set (val strict: seed {result.seed_val.strict:.3f} -> "
        f"chosen {result.chosen_val.strict:.3f}); evaluating it on the cell's problems",
        file=sys.stderr,
    )
    return tracker, PromptSet(dict(result.chosen)), result


def _finish(tracker: Tracker, prep: Prepared, result: OptimizeResult, evaluated: CellResult) -> None:
    """The optimizer cell's run: its optimization figures and artifacts, the final eval's
    headline copied over, the seed cell's pass@1 when it ran here; then the comparison line."""
    summary = evaluated.summary
    seed = cell_runs.seed_cell_result(cell_runs.seed_cell_of(config_data(prep.config)))
    metrics = {**cell_runs.optimizer_metrics(result), **cell_runs.headline(metrics_of(summary), seed)}
    tracker.finish(
        metrics=metrics,
        rows=[],
        files=[prep.dir / CONFIG, prep.dir / PROMPTS],
        complete=bool(summary["complete"]),
        tags={"final_eval_run_id": evaluated.run_id or "", **provenance.as_tags(summary["provenance"])},
        dirs={"optimizer": prep.dir / "optimizer"},
    )
    print(f"MLflow: optimizer cell run {tracker.run_id} (final evaluation: child run {evaluated.run_id})")
    print(cell_runs.comparison_line(float(summary["pass_at_1"]), seed))
