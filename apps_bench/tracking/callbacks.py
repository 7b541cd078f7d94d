"""Hydra callbacks for multirun sweeps: check the whole sweep, then set up MLflow once.

`on_multirun_start` runs in the launching process before any cell starts. It checks that the
launcher can run here (its package, SLURM's tools: launchers/needs.py), expands the sweep
exactly as Hydra's basic sweeper does (sweep params declared in config first, command-line
overrides win), composes every cell, and refuses the sweep if any cell lies outside the grid or
cannot read its data: `SystemExit(2)` (Hydra only warns on a plain exception from a callback).
Then it takes this launch's lock on the sweep (a second launch of the same cells, or of a cell
another command runs, is refused: tracking/sweep_lock.py), creates the tracking store, the
experiment and this launch's parent run (never an earlier launch's: that one is left as it
ended, and linked by the tag `sweep_earlier_run`; one an earlier launch from here left RUNNING, having
lost its store or been killed, is ended FAILED), and hands the store URI, the parent run id
and the launching directory to every cell through `hydra.job.env_set` (cells may run in other
processes or hosts: joblib, submitit, Ray; a cell that misses them refuses to run). The parent
records its member cells first (tracking/membership.py), so a cell that ran before the sweep,
alone or in another sweep or launch, is one of its cells all the same.

The parent run is closed in `on_multirun_end`; when a cell or the launcher failed (Hydra skips
`on_multirun_end` then) FAILED, by the entrypoint once Hydra returns (`end_unfinished_sweep`);
KILLED on Ctrl-C / SIGTERM after the launchers' cancel hooks (`on_sweep_interrupt`) ran. Closing
it (unless interrupted) publishes the sweep's comparison once, from the launching process
(report/sweep_run.py); a member missing from it ends the parent FAILED and the command with
exit 1, naming the member (tag `comparison_missing`).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from apps_bench.cell.cpus import SHARE_ENV, usable_cpus
from apps_bench.cell.key import CellRefused, guard
from apps_bench.cell.pipeline import cell_dir_for
from apps_bench.config.schema import cell_data, typed_config
from apps_bench.config.validate import InvalidSettings, empty_selection
from apps_bench.data import load_selection
from apps_bench.launchers.needs import launcher_problem
from apps_bench.report.sweep_run import publish_or_say
from apps_bench.tracking import faults, membership, provenance, sweep_lock
from apps_bench.tracking import mlflow as mlf
from apps_bench.tracking.cell_lock import CellLock, lock_times
from apps_bench.tracking.membership import Member

ROOT_ENV = "APPS_BENCH_ROOT"  # the launching command's directory: cells' outputs/ go under it on every launcher


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


def check_sweep(config: DictConfig) -> tuple[int, list[tuple[str, str]], list[Member], list[Path]]:
    """Compose every cell of the sweep; check its settings, the grid guard, and that its data can
    be read and its selection holds problems, as `plan` does (a hub selection is read once here:
    the first rows, streamed). -> (cells, (overrides, why) of each refused cell, members, each member's folder)."""
    import json

    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    cells = sweep_overrides(config)
    refusals: list[tuple[str, str]] = []
    members: list[Member] = []
    folders: list[Path] = []
    checked: dict[str, str | None] = {}  # selection -> refusal (cells of a sweep mostly share one)
    for overrides in cells:
        data = cell_data(loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides)))
        try:
            cell = guard(data)
            members.append(Member(key=cell.key, name=cell.name, overrides=" ".join(overrides)))
            folders.append(cell_dir_for(data.get("out_dir"), cell))
            sel = {k: data.get(k) for k in ("limit", "offset", "only", "difficulty", "max_tests_per_row")}
            key = json.dumps([data.get("dataset") or {}, sel], sort_keys=True, default=str)
            if key not in checked:
                checked[key] = _selection_refusal(data)
            if checked[key]:
                raise CellRefused(checked[key])
        except CellRefused as e:
            refusals.append((" ".join(overrides), str(e)))
    return len(cells), refusals, members, folders


def _selection_refusal(data: dict[str, Any]) -> str | None:
    try:
        config = typed_config(data)
        bad = empty_selection(load_selection(config), config)
    except (ValueError, OSError) as exc:
        return f"cannot load dataset {data['dataset'].get('name')}: {exc}"
    return str(InvalidSettings([bad])) if bad is not None else None


# --- the running sweep, for launchers: what to cancel when it is interrupted, how to end it ---

_ACTIVE: SweepTracking | None = None
_ON_INTERRUPT: list[Callable[[], None]] = []


def on_sweep_interrupt(cancel: Callable[[], None]) -> None:
    """Call `cancel()` when the launching command is stopped (Ctrl-C, SIGTERM) while the sweep
    runs, before its parent run is ended KILLED: e.g. a launcher's `scancel` of the jobs it
    submitted. Hooks run in the launching process, newest first; one that raises does not stop
    the others. Cleared when the sweep ends."""
    _ON_INTERRUPT.append(cancel)


def active_sweep() -> tuple[str, str] | None:
    """(tracking URI, parent run id) of the sweep this process launches, None outside one."""
    return _ACTIVE._parent if _ACTIVE is not None else None


def end_sweep(status: str, message: str = "") -> None:
    """End the running sweep's parent run now with `status` (FINISHED, FAILED or KILLED) and an
    `error` tag `message`: for a launcher that finds a job cancelled or killed and gives up on
    the sweep, so the parent never stays RUNNING. A no-op outside a sweep or once ended."""
    if _ACTIVE is not None:
        _ACTIVE._close(status, message)


def stop_sweep(line: str, *, store_lost: bool) -> None:
    """A cell's surroundings failed (the store, the disk) and the sweep stops after it, `line` said on stderr:
    its parent run is ended FAILED with `line` as its error, without the comparison (the rerun publishes it),
    or, the store lost, left open as a sweep whose end lost the store (the rerun's launch ends it FAILED). A no-op
    outside a sweep launched by this process."""
    if _ACTIVE is not None:
        _ACTIVE._stopped = (line, store_lost)


def end_unfinished_sweep() -> None:
    """End the parent run of a sweep that did not reach its end (a cell or the launcher failed:
    Hydra skips `on_multirun_end` then) FAILED, or KILLED after a signal, naming its missing cells.
    The entrypoint calls it when Hydra returns, while MLflow can still read the sweep's artifacts: at
    interpreter exit its thread pools are shut down ("Failed to download artifacts"). A no-op
    outside a sweep or once ended; the exit hook stays for any other caller."""
    if _ACTIVE is not None:
        _ACTIVE._close("FAILED")


def forward_to_jobs(config: DictConfig, env: dict[str, str]) -> None:
    """Make every job of the sweep see `env`, on every launcher: each launcher recomposes a job's
    config from the sweep config's `hydra.overrides.hydra` (in its own worker: joblib, submitit,
    Ray), and Hydra sets the job's `hydra.job.env_set` in the process that runs it."""
    with open_dict(config), read_write(config):
        for k, v in env.items():
            config.hydra.job.env_set[k] = v
            quoted = "'" + v.replace("'", "\\'") + "'"  # a quoted value: URIs hold ':' and '/'
            config.hydra.overrides.hydra.append(f"++hydra.job.env_set.{k}={quoted}")


def joblib_share(config: DictConfig, n_cells: int) -> int | None:
    """CPUs per cell under the joblib launcher: this host's usable CPUs over the cells it runs at
    once (`hydra.launcher.n_jobs`, negative as joblib counts it); None for any other launcher
    (SLURM and Ray cells read their own allocation)."""
    if "joblib" not in str(OmegaConf.select(config, "hydra.launcher._target_") or "").lower():
        return None

    cpus = usable_cpus()
    n_jobs = int(OmegaConf.select(config, "hydra.launcher.n_jobs") or 1)
    at_once = n_jobs if n_jobs > 0 else max(1, cpus + 1 + n_jobs)
    return max(1, cpus // max(1, min(at_once, n_cells)))


def sweep_key(experiment: str, cell_keys: list[str]) -> str:
    """The same cells in the same experiment = the same sweep: one launch of it at a time, and each
    launch's parent run links the one before (`sweep_earlier_run`)."""
    import hashlib

    return hashlib.sha256(json.dumps([experiment, sorted(cell_keys)]).encode()).hexdigest()[:16]


def _by_reason(refusals: list[tuple[str, str]]) -> str:
    """One line per distinct reason, naming its cells (cells of a sweep mostly share one: its data)."""
    reasons: dict[str, list[str]] = {}
    for overrides, why in refusals:
        reasons.setdefault(why, []).append(overrides)
    lines = []
    for why, cells in reasons.items():
        more = f" and {len(cells) - 3} more cells" if len(cells) > 3 else ""
        lines.append(f"[{'], ['.join(cells[:3])}]{more}: {why}" if len(cells) > 1 else f"[{cells[0]}] {why}")
    return "\n  ".join(lines)


def _refuse(message: str) -> NoReturn:
    """A sweep refused before it created anything: one line (or a list), exit 2."""
    print(f"apps-bench: {message}", file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(2)


class SweepTracking(Callback):
    def __init__(self) -> None:
        self._parent: tuple[str, str] | None = None
        self._lock: CellLock | None = None  # this launch's hold on its sweep (tracking/sweep_lock.py)
        self._closed = False
        self._handlers: dict[int, Any] = {}
        self._interrupted: str | None = None
        self._missing: list[str] = []  # member cells the comparison could not cover at the end
        self._members: list[Any] | None = None  # the member list this process recorded on the parent
        self._store_failed = False  # the store failed while the parent run was closed
        self._stopped: tuple[str, bool] | None = None  # (the line said, the store lost) when a cell's surroundings failed

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _ACTIVE
        problem = launcher_problem(str(OmegaConf.select(config, "hydra.launcher._target_") or ""))
        if problem:
            _refuse(problem)
        n, refusals, members, folders = check_sweep(config)
        if refusals:
            _refuse(f"{len(refusals)} of {n} cells of this sweep are refused; nothing was run.\n  " + _by_reason(refusals))

        experiment = str(OmegaConf.select(config, "tracking.experiment") or "apps")
        uri = mlf.tracking_uri()
        _check_store(uri, OmegaConf.select(config, "tracking.store"))
        key = sweep_key(experiment, [m.key for m in members])
        self._hold(
            key,
            f"this sweep ({n} cells in experiment {experiment})",
            members,
            folders,
            lock_times(OmegaConf.select(config, "tracking.cell_lock")),
        )
        overrides = " ".join(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))  # type: ignore[arg-type]
        tags = {"sweep_overrides": overrides[:5000], "n_cells": str(n), LAUNCH_TAG: _launch_place(), **provenance.git_info()}
        tags["package_version"] = provenance.package_version()
        name = f"sweep·{n} cells"
        stale: list[str] = []
        try:
            with faults.answered("apps-bench", "No cell was run.", uri=uri):
                uri, run_id, earlier = mlf.start_parent_run(
                    experiment=experiment, run_name=name, tags=tags, uri=uri, sweep_key=key
                )
                self._parent = (uri, run_id)
                self._members = list(members)
                membership.record(mlf.client(uri), run_id, members)  # before any cell: membership never depends on order
                stale = _end_stale_parents(uri, run_id, key)
        except BaseException:
            if self._parent is None:  # else the parent's end releases it
                self._let_go()
            raise
        _ACTIVE = self
        env = {"MLFLOW_TRACKING_URI": uri, mlf.PARENT_RUN_ENV: run_id, ROOT_ENV: str(Path.cwd().resolve())}
        share = joblib_share(config, n)
        if share is not None:
            env[SHARE_ENV] = f"{share}:joblib"
        os.environ.update(env)
        forward_to_jobs(config, env)
        before = f"; its earlier launch's parent run {earlier} is left as it ended" if earlier and not stale else ""
        if stale:
            before = f"; the parent run of its earlier launch {', '.join(stale)}, left RUNNING, is ended FAILED ({STALE_WHY})"
        print(f"apps-bench: sweep of {n} cells; MLflow parent run {run_id} ({uri}){before}", file=sys.stderr)
        atexit.register(self._close, "FAILED")
        self._install_signal_handlers()

    def __getstate__(self) -> dict[str, Any]:
        """joblib pickles the callbacks into its workers: the launch's lock (a thread) stays here."""
        return {**self.__dict__, "_lock": None}

    def _hold(self, key: str, what: str, members: list[Member], folders: list[Path], times: Any) -> None:
        """Take this launch's lock on the sweep, then check no member cell is being run by another
        command: else exit 2 before anything is created (tracking/sweep_lock.py)."""
        try:
            self._lock, note = sweep_lock.take(Path.cwd().resolve(), key, what, times)
        except sweep_lock.SweepBusy as exc:
            _refuse(str(exc))
        if note:
            print(f"apps-bench: {note}", file=sys.stderr)
        busy = sweep_lock.busy_cells(((m.describe(), d) for m, d in zip(members, folders)), times)
        if busy:
            self._let_go()
            _refuse(
                f"{len(busy)} of {len(members)} cells of this sweep are being run by another command right now; "
                "nothing was run.\n  " + "\n  ".join(busy)
            )

    def _let_go(self) -> None:
        if self._lock is not None:
            sweep_lock.release(self._lock)
            self._lock = None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._close("FINISHED")
        finally:
            _stop_idle_launcher_workers()
        if self._store_failed:  # said on stderr in one line: the cells are done, their logging waits for the rerun
            raise SystemExit(faults.EXIT_FAILED)
        if self._missing:  # said on stderr and in the parent's tags by the comparison
            raise SystemExit(1)

    def _install_signal_handlers(self) -> None:
        """Ctrl-C and SIGTERM on the launching command cancel what the sweep submitted and end
        its parent run KILLED (SIGTERM's default action would end the process with it RUNNING)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Cancel hooks now; the parent run is ended KILLED at exit, once the launcher has unwound
        (ending it here could wait on a lock the interrupted code holds). A second signal ends it now."""
        name = signal.Signals(signum).name
        if self._interrupted is None:
            self._interrupted = name
            print(f"apps-bench: {name}: cancelling the sweep", file=sys.stderr)
            while _ON_INTERRUPT:
                try:
                    _ON_INTERRUPT.pop()()
                except Exception as exc:  # noqa: BLE001 - the next hook and the run's status still matter
                    print(f"apps-bench: a cancel hook failed: {exc}", file=sys.stderr)
            _end_launcher_workers()
        else:
            self._close("KILLED")
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _close(self, status: str, message: str = "") -> None:
        global _ACTIVE
        if self._closed or self._parent is None:
            return
        self._closed = True

        uri, run_id = self._parent
        if self._stopped is not None:
            self._end_stopped(uri, run_id, *self._stopped)
            return
        if self._interrupted is not None:
            status, message = "KILLED", message or f"the launching command was interrupted ({self._interrupted})"
        try:
            if self._interrupted is not None:  # the cells it stopped (a rerun continues them)
                try:
                    for k in membership.member_runs(mlf.client(uri), run_id, self._members)[1].values():
                        if k.info.status == "RUNNING":
                            mlf.end_run(uri, k.info.run_id, "KILLED")
                except Exception as exc:  # noqa: BLE001 - the parent still ends KILLED; the cells' runs stay open for the rerun
                    print(
                        f"apps-bench: could not mark the stopped cells' runs KILLED ({type(exc).__name__}: {exc})",
                        file=sys.stderr,
                    )
            else:  # every cell has ended: the sweep publishes its comparison, once, over every member
                missing = publish_or_say(uri, run_id)
                if missing != []:  # members missing, unfinished or unreadable (or the store failed): not FINISHED
                    status = "FAILED"
                    self._missing = missing or ["the comparison could not be written"]
            if message:  # a launcher's reason comes last: it says why the sweep ended
                mlf.client(uri).set_tag(run_id, "error", message[:5000])
            mlf.end_run(uri, run_id, status)
        except Exception as exc:
            fault = faults.fault_of(exc, uri)
            if fault is None:
                raise
            self._store_failed = True
            faults.say(
                "apps-bench",
                fault,
                f"The sweep's parent run {run_id} stays open until the rerun ends it, and every cell keeps its "
                "records in its folder: the rerun solves only what is not recorded, then logs the rest.",
                exc,
            )
        finally:
            self._forget()

    def _end_stopped(self, uri: str, run_id: str, line: str, store_lost: bool) -> None:
        """The parent of a sweep a failed surrounding stopped: said once already, so a store that fails here too
        says nothing more (the parent stays open, as when the store is lost at the sweep's end)."""
        try:
            if not store_lost:
                mlf.client(uri).set_tag(run_id, "error", line[:5000])
                mlf.end_run(uri, run_id, "FAILED")
        except Exception as exc:
            if faults.fault_of(exc, uri) is None:
                raise
        finally:
            self._forget()

    def _forget(self) -> None:
        """This launch lets go of its sweep: the lock, the cells' environment, the signal handlers."""
        global _ACTIVE
        self._let_go()
        os.environ.pop(mlf.PARENT_RUN_ENV, None)
        os.environ.pop(SHARE_ENV, None)
        _ON_INTERRUPT.clear()
        _ACTIVE = None
        for sig, handler in self._handlers.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(sig, handler)


LAUNCH_TAG = "sweep_launch"  # host:folder of the launch: the place its lock (tracking/sweep_lock.py) guards
STALE_WHY = "its launch ended without closing it: it lost the tracking store, or it was killed"


def _launch_place() -> str:
    import socket

    return f"{socket.gethostname()}:{Path.cwd().resolve()}"


def _end_stale_parents(uri: str, run_id: str, key: str) -> list[str]:
    """End FAILED (tag `error`) every parent run of this sweep that an earlier launch from here left RUNNING
    (it lost the store before its end, or was killed): this launch holds the sweep's lock here, so no launch
    of it from this place is running. -> their run ids. A launch from another host or folder is left alone."""
    c = mlf.client(uri)
    found = c.search_runs(
        [c.get_run(run_id).info.experiment_id], filter_string=f"tags.sweep_key = '{key}' and attributes.status = 'RUNNING'"
    )
    stale = [r.info.run_id for r in found if r.info.run_id != run_id and r.data.tags.get(LAUNCH_TAG) == _launch_place()]
    for stale_id in stale:
        c.set_tag(stale_id, "error", f"{STALE_WHY}; ended by the next launch of the sweep, parent run {run_id}")
        mlf.end_run(uri, stale_id, "FAILED")
    return stale


def _check_store(uri: str, settings: Any) -> None:
    """The sweep's store, checked once here before any cell starts (tracking/mlflow.check_store)."""
    if settings is None:
        return

    try:
        mlf.check_store(uri, settings)
    except mlf.StoreError as exc:
        print(f"apps-bench: {exc}", file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(2) from None


def _stop_idle_launcher_workers() -> None:
    """The joblib launcher (loky) keeps its worker processes for minutes after the sweep,
    holding the command's stdout open: `apps-bench -m ... | tee log` would wait for them."""
    mod = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(mod, "_executor", None) if mod is not None else None
    if executor is not None:
        stop = getattr(executor, "terminate", None)  # joblib's executor also removes its /dev/shm folder
        stop() if stop is not None else executor.shutdown(wait=True)


def _end_launcher_workers() -> None:
    """An interrupted sweep ends the joblib launcher's workers, which run its cells (their solver
    and sandbox processes end with them). Signals only: joblib's own shutdown, called from a
    signal handler, waits on locks the interrupted main thread holds."""
    mod = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(mod, "_executor", None) if mod is not None else None
    for p in list((getattr(executor, "_processes", None) or {}).values()):
        try:
            os.kill(p.pid, signal.SIGTERM)
        except (ProcessLookupError, AttributeError):
            pass
