"""The cell's spine: prepare -> solve every problem -> finish.

prepare: the grid guard and settings, the selection, the cell's folder and what is left
to run. evaluate: the cell's engine (cell/engine.py: the model endpoint, the sandbox pool, the
judge, the solver processes) and the tracking run; every problem goes through the engine's
step, `concurrency` in flight at once (asyncio), judging in threads on the shared
SandboxPool. Every problem's record is flushed as it completes, so a
killed cell resumes where it stopped. A problem whose model calls still fail after
retries (or whose judging hit a sandbox error) is recorded as an *error*, never as a wrong
answer: it is left out of pass@1, counted apart, marks the cell incomplete, and is retried
by the next run of the same cell.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from apps_bench.cell.engine import Engine, fork_solvers
from apps_bench.cell.key import Cell, CellSetupError, guard
from apps_bench.cell.solving import CELL_JOB, Job
from apps_bench.cell.step import record_of
from apps_bench.config.schema import Config, config_data, problems_in_flight
from apps_bench.config.validate import InvalidSettings, empty_selection
from apps_bench.data import LoadResult, load_selection
from apps_bench.data.rows import split_named_by
from apps_bench.models import ModelEndpointError, open_endpoint
from apps_bench.models.endpoint import Endpoint
from apps_bench.models.gold_policy import print_start_notes
from apps_bench.models.local import LocalModelError
from apps_bench.models.server_gate import ToolDropRefused, cell_check
from apps_bench.report import money
from apps_bench.topologies.base import PromptSet
from apps_bench.topologies.prompts import load_prompts
from apps_bench.topologies.tool_use import tool_protocol, tool_warnings
from apps_bench.tracking import cell_counts, provenance
from apps_bench.tracking.cell_lock import CellBusy, lock_times
from apps_bench.tracking.console import Progress, print_problem, print_summary
from apps_bench.tracking.mlflow import LoggingPending, StoreUnavailable
from apps_bench.tracking.records import (
    CELL,
    CONFIG,
    PROMPTS,
    RECORDS,
    SUMMARY,
    TRANSCRIPTS,
    RecordStore,
    RecordsUnreadable,
    ResumeState,
    record_key,
)
from apps_bench.tracking.run import Tracker, check_store, fail_run, open_run
from apps_bench.tracking.summary import metrics_of, summarize_cell, summary_tags, table_rows
from apps_bench.tracking.traces import TraceChoice, TraceWriter, traces_enabled
from apps_bench.types import JsonObject, Problem, ProblemRecord


@dataclass
class CellResult:
    cell: Cell
    dir: Path
    summary: JsonObject  # summary.json
    complete: bool
    run_id: str | None = None
    records: list[ProblemRecord] = field(default_factory=list)


# ----------------------------------------------------------------------------- config


def cell_dir_for(out_dir: str | None, cell: Cell, cwd: Path | None = None) -> Path:
    """The cell's folder: `out_dir` when set, else outputs/cells/<cell> under the working directory."""
    if out_dir:
        return Path(out_dir).expanduser().resolve()
    return (cwd or Path.cwd()).resolve() / "outputs" / "cells" / cell.dir_name


# ----------------------------------------------------------------------------- the spine


@dataclass
class Prepared:
    """A cell ready to run: its config, selection, folder and what is left to solve."""

    config: Config  # the composed cell, typed (apps_bench/config/schema.py)
    cell: Cell
    loaded: LoadResult
    store: RecordStore
    todo: list[Problem]
    n_done: int
    t_start: float
    endpoint: Endpoint | None = None  # a remote model endpoint, probed by prepare (None: a built-in server, started by evaluate)
    server: JsonObject | None = (
        None  # what the server check found for this cell's tool requests (models/server_gate.py); None: not run
    )
    checked: Any = None  # what `prepare`'s `check` returned (an optimizer cell: its pool, already checked)

    @property
    def problems(self) -> list[Problem]:
        return list(self.loaded.problems)

    @property
    def dir(self) -> Path:
        return self.store.dir


def prepare(config: Config, check: Callable[[Config, LoadResult], object] | None = None) -> Prepared:
    """Check the cell against the grid and its settings, load its problems, check the model
    endpoint and the tracking store, then claim (lock) its folder: a refusal writes nothing.
    `config`: the composed cell, typed once at the door (validate.typed_cell).
    `check(config, loaded)`: the checks of a kind of cell that need only its settings and data
    (an optimizer's pool and splits), run with the others, before any process or file exists."""
    t_start = time.perf_counter()
    _quiet_libraries()
    cell = guard(config)  # raises CellRefused (or InvalidSettings) before anything runs
    loaded = _selection(config, cell)
    try:
        prompts = dict(load_prompts(config.topology).texts)
    except Exception as exc:  # noqa: BLE001 - a bad prompt set is a setup error with its own message
        raise CellSetupError(str(exc)) from exc
    checked = check(config, loaded) if check is not None else None
    store = RecordStore(cell_dir_for(config.out_dir, cell))
    try:
        recorded = {r.key for r in store.records() if not r.error}  # read only, before any check
    except RecordsUnreadable as exc:
        raise CellSetupError(
            f"{exc}. Nothing was changed; run this cell with the apps-bench that wrote these records, or give it another out_dir."
        ) from None
    left = cell.optimizer != "none" or any(record_key(p.split, p.id) not in recorded for p in loaded.problems)
    endpoint = _check_endpoint(config) if left else None  # a cell with nothing to solve needs no model
    server = _check_server(config, endpoint) if left else None
    check_store(config)
    state = _claim(store, config, cell, prompts)
    todo = [p for p in loaded.problems if record_key(p.split, p.id) not in state.done]
    prep = Prepared(
        config=config,
        cell=cell,
        loaded=loaded,
        store=store,
        todo=todo,
        n_done=len(loaded.problems) - len(todo),
        t_start=t_start,
        endpoint=endpoint,
        server=server,
        checked=checked,
    )
    _announce(prep, len(state.retried))
    return prep


def _selection(config: Config, cell: Cell) -> LoadResult:
    """The cell's problems; a selection of none is a bad setting (a cell of zero problems is an error, not a 0.0 score)."""
    try:
        loaded = load_selection(config)
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise CellSetupError(f"cannot load dataset {cell.dataset}: {exc}") from exc
    empty = empty_selection(loaded, config)
    if empty is not None:
        raise InvalidSettings([empty])
    if loaded.missing_ids:
        print(f"warning: no row has IDs {', '.join(loaded.missing_ids)}", file=sys.stderr)
    return loaded


def _claim(store: RecordStore, config: Config, cell: Cell, prompts: dict[str, str]) -> ResumeState:
    """Claim (lock) the cell's folder, write its config and prompts, and read what is recorded there."""
    import yaml

    try:
        note = store.claim(cell.key, _cell_info(cell), lock=lock_times(config.tracking.cell_lock))
    except CellBusy as exc:
        raise CellSetupError(str(exc)) from None
    if note:
        print(f"apps-bench: {note}", file=sys.stderr)
    try:
        store.write_config(yaml.safe_dump(config_data(config), sort_keys=False, allow_unicode=True))
        store.write_json(PROMPTS, prompts)
        return store.resume()
    except BaseException:
        store.release()
        raise


def _announce(prep: Prepared, retried: int) -> None:
    """The cell's header on stderr: what it is, its rows, what is left to run, and the warnings about its rows."""
    config, cell, loaded = prep.config, prep.cell, prep.loaded
    print(
        f"apps-bench: cell {cell.name} [{cell.key}] dataset={cell.dataset} split={cell.split} "
        f"({loaded.source}, revision {loaded.revision}): "
        f"{len(loaded.problems)} problems, {prep.n_done} already recorded, {len(prep.todo)} to run"
        + (f" ({retried} retried after errors)" if retried else "")
        + (f", {loaded.n_skipped} rows skipped" if loaded.n_skipped else ""),
        file=sys.stderr,
    )
    if loaded.skipped_rows:
        shown = "; ".join(loaded.skipped_rows[:10]) + (
            f"; and {len(loaded.skipped_rows) - 10} more" if len(loaded.skipped_rows) > 10 else ""
        )
        print(f"apps-bench: rows skipped (they still count toward limit/offset): {shown}", file=sys.stderr)
    rows_file = config.dataset.path
    named = split_named_by(rows_file) if rows_file else None
    if rows_file and named and named != cell.split:
        print(
            f"apps-bench: warning: the rows file {Path(rows_file).name} names the {named} split, but its problems "
            f"are recorded as split {cell.split} (dataset.split); if they are {named} rows, say dataset.split={named}",
            file=sys.stderr,
        )
    print_start_notes(config.model, loaded.problems)  # model=gold: what it is, the rows it cannot answer


def evaluate(
    prep: Prepared,
    *,
    engine: Engine | None = None,
    prompts: PromptSet | None = None,
    open_tracker: Callable[[], Tracker] | None = None,
) -> CellResult:
    """Solve, judge and record every problem left, then write the summary and finish the run.

    `engine`: an optimizer cell's, already open (default: this cell's, opened here);
    `prompts`: the PromptSet to solve with (an optimizer's choice; default the config's);
    `open_tracker`: opens the run this evaluation logs to (default: the cell's own,
    tracking/run.py), on a thread while the first problems are solved."""
    config, cell = prep.config, prep.cell
    open_tracker = open_tracker or functools.partial(open_run, config, cell, prep.loaded, idle=not prep.todo)
    phases: dict[str, float] = {}
    previous = _previous_provenance(prep.dir)  # a rerun with nothing to solve starts no sandbox, checks no server
    sandbox: JsonObject | None = previous.get("sandbox")
    solvers = 0
    tracker_future: Future[Tracker] | None = None
    try:
        if not prep.todo:
            keep_lock(prep)
            tracker = open_tracker()
        else:
            with ExitStack() as stack:
                forked = fork_solvers(config, len(prep.todo)) if engine is None else None  # before any thread starts
                keep_lock(prep)
                tx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apps-bench-tracking")
                stack.callback(tx.shutdown, wait=True)
                tracker_future = tx.submit(open_tracker)  # importing mlflow and reaching the store overlap the engine's start
                if engine is None:
                    engine = stack.enter_context(
                        Engine.open(config, prep.problems, forked=forked, endpoint=prep.endpoint, left=len(prep.todo))
                    )
                progress = Progress(len(prep.problems), prep.n_done, config.progress, cell.name)
                stack.callback(progress.close)
                phases["setup_s"] = time.perf_counter() - prep.t_start
                job = Job(prompts=prompts) if prompts is not None else CELL_JOB
                engine.run(lambda: _solve_all(prep, engine, job, progress, tracker_future))
                phases["problems_s"] = time.perf_counter() - prep.t_start - phases["setup_s"]
                sandbox, solvers = engine.features, engine.solvers
            tracker = tracker_future.result()
    except BaseException as exc:
        if tracker_future is not None:
            fail_run(tracker_future, exc)
        if isinstance(exc, StoreUnavailable):
            raise _store_lost(prep, exc) from None
        raise
    finally:
        prep.store.close()
    try:
        return finish(
            prep, tracker, phases=phases, solvers=solvers, sandbox=sandbox, server=prep.server or previous.get("server")
        )
    except StoreUnavailable as exc:
        raise _store_lost(prep, exc, finished=True) from None


def finish(
    prep: Prepared,
    tracker: Tracker,
    *,
    phases: Mapping[str, float],
    solvers: int,
    sandbox: JsonObject | None,
    server: JsonObject | None,
) -> CellResult:
    """summary.json, the tracking run's metrics/tags/artifacts, and the printed summary."""
    config, cell, loaded, store = prep.config, prep.cell, prep.loaded, prep.store
    selected = {record_key(p.split, p.id): i for i, p in enumerate(loaded.problems)}
    records = sorted((r for r in store.records() if r.key in selected), key=lambda r: selected[r.key])
    summary = summarize_cell(
        records,
        n_selected=len(selected),
        skipped=loaded.skipped,
        profile=config.judge.profile,
        stopped_early=config.judge.stop_on_first_failure,
        wall_s=time.perf_counter() - prep.t_start,
    )
    summary["phases_s"] = {k: round(v, 3) for k, v in phases.items()}
    summary["run"] = {
        "concurrency": config.concurrency,
        "problems_in_flight": problems_in_flight(config),
        "processes": config.processes,
        "solvers": solvers,
    }
    if not prep.todo:  # a rerun that solved nothing keeps the times of the run that did (and logs nothing new)
        earlier = _previous_summary(store.dir)
        summary.update({k: earlier[k] for k in ("wall_s", "phases_s", "run") if k in earlier})
    summary["cell"] = {"key": cell.key, "name": cell.name, **cell.axes(), "model_label": cell.model_label}
    summary["tool_protocol"] = tool_protocol(records)
    summary["warnings"] = tool_warnings(records, config.topology, config.model)
    summary["dataset"] = {"source": loaded.source, "revision": loaded.revision, "rows_skipped": list(loaded.skipped_rows)}
    summary["provenance"] = provenance.collect(config.topology.framework, sandbox)
    summary["provenance"]["server"] = server
    summary["cost"] = money.cell_cost(records, money.price_of(config.model.price))
    store.write_json(CELL, {"key": cell.key, **_cell_info(cell), "provenance": summary["provenance"]})
    summary_path = store.write_summary(summary)
    counts_path = cell_counts.write(store.dir)  # what the report and plan read instead of the transcripts
    if config.verbose or config.dataset.source == "demo":
        for rec in records:
            print_problem(rec)
        print()
    files = [store.dir / RECORDS, summary_path, counts_path, store.dir / CONFIG, store.dir / PROMPTS]
    if config.tracking.log_transcripts:
        files.append(store.dir / TRANSCRIPTS)
    tracker.finish(
        metrics=metrics_of(summary),
        rows=table_rows(records),
        files=files,
        complete=bool(summary["complete"]),
        tags={**summary_tags(summary), **provenance.as_tags(summary["provenance"])},
    )
    print_summary(summary, cell, store.dir, tracker.run_id, getattr(tracker, "uri", None))
    return CellResult(
        cell=cell, dir=store.dir, summary=summary, complete=bool(summary["complete"]), run_id=tracker.run_id, records=records
    )


# ----------------------------------------------------------------------------- its steps


async def _solve_all(prep: Prepared, engine: Engine, job: Job, progress: Progress, tracker_future: Future[Tracker]) -> None:
    """Every problem left through the engine's step, `problems_in_flight` at a time, each record
    flushed as it completes."""
    keep = prep.config.tracking.log_transcripts
    traces = _trace_writer(prep, tracker_future)
    store_failed: list[BaseException] = []

    async def one(problem: Problem) -> None:
        async with engine.slot():
            if store_failed:
                return  # the tracking store is unusable: start no more problems
            outcome = await engine.step(problem, job)
            rec = record_of(outcome, prep.cell.key)
            await asyncio.to_thread(prep.store.append, rec, outcome.solved.transcript if keep else None)  # fsync off the loop
            if traces is not None:
                traces.submit(outcome, rec)  # after the record: a trace never changes what is recorded
            progress.update(1, rec)
            failed = tracker_future.exception() if tracker_future.done() else None
            if failed is not None and not store_failed:
                store_failed.append(failed)

    try:
        await asyncio.gather(*(one(p) for p in prep.todo))
    finally:
        if traces is not None:
            await asyncio.to_thread(traces.close)
    if store_failed:  # raised once the problems in flight are recorded (none is cut halfway)
        raise store_failed[0]


def _trace_writer(prep: Prepared, tracker_future: Future[Tracker]) -> TraceWriter | None:
    """The cell's TraceWriter (tracking/traces.py) when it writes traces, else None."""
    if not traces_enabled(prep.config):
        return None
    keys = [record_key(p.split, p.id) for p in prep.problems]
    return TraceWriter(tracker_future, TraceChoice.of(prep.config, keys))


def _check_endpoint(config: Config) -> Endpoint | None:
    """A remote model endpoint, probed now, before the cell's folder exists (an unreachable one
    leaves nothing behind); None for a built-in server (gold, local), which `evaluate` starts."""
    if config.model.provider in ("gold", "local") and not config.model.base_url:
        return None
    try:
        with open_endpoint(config.model, ()) as endpoint:  # a remote endpoint: nothing to stop afterwards
            return endpoint
    except ModelEndpointError as exc:
        raise CellSetupError(str(exc)) from exc


def _check_server(config: Config, endpoint: Endpoint | None) -> JsonObject:
    """The quick server check (models/server_gate.py): a tool-using topology on a server that drops its
    tools is refused here, before the cell's folder exists."""
    try:
        return cell_check(config, endpoint)
    except (ToolDropRefused, ModelEndpointError, LocalModelError, ImportError) as exc:  # ImportError: a framework not installed
        raise CellSetupError(str(exc)) from exc


def keep_lock(prep: Prepared) -> None:
    """Start the heartbeat of the cell's folder lock (after the forkserver: it is a thread)."""
    if prep.store.lock is not None:
        prep.store.lock.start_heartbeat()


def _store_lost(prep: Prepared, exc: BaseException, *, finished: bool = False) -> StoreUnavailable:
    """What a store that failed mid-cell means for the cell: nothing is lost, and what the rerun does;
    once every problem was answered (or the cell `finished`), the cell is done: LoggingPending."""
    selected = {record_key(p.split, p.id) for p in prep.loaded.problems}
    n = sum(1 for r in prep.store.records() if r.key in selected and not r.error)
    done = finished or n == len(selected)
    rerun = (
        "it logs the finished cell to its MLflow run without solving anything again"
        if n == len(selected)
        else f"it solves only the {len(selected) - n} problems left, then logs the cell"
    )
    text = (
        f"{exc}. Nothing computed is lost: {prep.dir} keeps every record ({n} of {len(selected)} problems "
        f"recorded). Once the store answers again, rerun the same command: {rerun}."
    )
    return LoggingPending(text) if done else StoreUnavailable(text)


def _cell_info(cell: Cell) -> JsonObject:
    return {"name": cell.name, "axes": cell.axes(), "identity": dict(cell.identity)}


def _quiet_libraries() -> None:
    """Per-request INFO lines of the HTTP clients drown the progress bar and the summary."""
    import logging

    for name in ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "mlflow", "alembic", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _previous_provenance(cell_dir: Path) -> JsonObject:
    """The provenance an earlier run of this cell recorded ({} when none did)."""
    prov = _previous_summary(cell_dir).get("provenance")
    return prov if isinstance(prov, dict) else {}


def _previous_summary(cell_dir: Path) -> JsonObject:
    """The summary an earlier run of this cell wrote ({} when none did)."""
    try:
        summary = json.loads((cell_dir / SUMMARY).read_text(encoding="utf-8"))
        return summary if isinstance(summary, dict) else {}
    except (OSError, ValueError):
        return {}
