"""How `hydra/launcher=slurm` watches its jobs (hydra_plugins/apps_bench_launchers/slurm_launcher.py).

submitit learns a job's state from `sacct`. Without SLURM accounting that call fails at every
poll (a warning each time) and a job cancelled or killed is never seen to end: the sweep
waits forever. With accounting it is seen late. Ctrl-C leaves the job array queued, and a job
that can never be scheduled pends silently. `watched_launch` keeps submitit's submission
and result handling and changes only the watching:

- job states come from `squeue` (the controller's own view, accounting or not); a job that
  left the queue without writing its result has ended (`sacct` names how, where it exists);
- when every job has ended, cells that failed or ended without a result are listed with
  their logs and the sweep exits 1 (their records are kept: a rerun resumes them);
- a cell whose surroundings failed (a full disk, a lost store: `faults.SweepStopped`) stops the
  sweep as under every launcher (`stopping_launch`, also `hydra/launcher=slurm_local`'s);
- Ctrl-C and SIGTERM cancel every job of the sweep before the launching command ends;
- jobs pending for a reason that needs an administrator (partition limits, bad constraints)
  end the sweep at once; other long waits are reported with their reason.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from hydra.core.utils import JobReturn, filter_overrides
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from apps_bench.errors import AppsBenchError
from apps_bench.tracking import faults
from apps_bench.tracking.callbacks import on_sweep_interrupt

# squeue states of a job that has not ended yet
ACTIVE = frozenset(
    "PENDING RUNNING CONFIGURING COMPLETING SUSPENDED REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING "
    "SIGNALING STAGE_OUT STOPPED PREEMPTED RESV_DEL_HOLD SPECIAL_EXIT".split()
)
# pending reasons that do not clear without changing the request or the cluster
HOPELESS = frozenset(
    "PartitionConfig PartitionNodeLimit PartitionTimeLimit BadConstraints InvalidAccount InvalidQOS "
    "QOSMaxCpuPerJobLimit QOSMaxMemoryPerJob AssocMaxCpuPerJobLimit AssocMaxMemPerJob "
    "AccountNotAllowed QOSNotAllowed DependencyNeverSatisfied".split()
)
REQUEST_HINT = (
    "Change the request: hydra.launcher.partition / cpus_per_task / mem_gb / timeout_min on the command line,"
    " or the APPS_BENCH_SLURM_* variables conf/hydra/launcher/slurm.yaml reads (sinfo shows what nodes offer)."
)
ENDED = "ENDED"  # not in the queue any more, state unknown (no accounting)


class JobsNotSchedulable(RuntimeError, AppsBenchError):
    pass


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's watcher, fed by `squeue` instead of `sacct`."""

    report_after_s = 60.0  # a job pending longer is reported, with its reason
    gone_grace_s = 10.0  # a job never seen in the queue this long after submission has ended

    def __init__(self, poll_s: float) -> None:
        # submitit asks at most this often (every 2 s at the start); it annotates delay_s as int but only
        # compares it with float seconds (poll_s is a float setting)
        super().__init__(delay_s=poll_s)  # type: ignore[arg-type]
        self._registered_at: dict[str, float] = {}
        self._order: list[str] = []
        self._pending_since: dict[str, float] = {}
        self._reported: dict[str, float] = {}
        self.hopeless: dict[str, str] = {}

    def register_job(self, job_id: str) -> None:
        if job_id not in self._registered_at:
            self._registered_at[job_id] = time.time()
            self._order.append(job_id)
        super().register_job(job_id)

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        # this user's jobs only (a big cluster's whole queue every poll would be wasteful), all states:
        # a job that just ended stays listed, with how it ended, for the controller's MinJobAge
        return ["squeue", "--me", "--noheader", "--array", "--states=all", "--format=%i|%T|%r"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        info: dict[str, dict[str, str]] = {}
        for line in text.splitlines():
            parts = line.strip().split("|", 2)
            if len(parts) == 3:
                info[parts[0]] = {"JobID": parts[0], "State": parts[1].split()[0], "Reason": parts[2]}
        now = time.time()
        for jid in self._registered - self._finished - info.keys():
            if jid in self._info_dict or now - self._registered_at.get(jid, now) > self.gone_grace_s:
                info[jid] = {"JobID": jid, "State": ENDED, "Reason": "left the queue"}
        self._watch_pending(info, now)
        return info

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        state = self.get_state(job_id, mode=mode).upper()
        return state not in ACTIVE and state != "UNKNOWN"

    def cells(self) -> list[str]:
        """Job ids of the sweep's cells (an array's own id is not a cell)."""
        return [j for j in self._order if not any(o.startswith(j + "_") for o in self._order)]

    def cancel_all(self) -> None:
        ids = sorted({j.split("_")[0] for j in self._order})
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=30)

    def _watch_pending(self, info: dict[str, dict[str, str]], now: float) -> None:
        for jid, row in info.items():
            if jid not in self._registered_at or row["State"] != "PENDING":
                self._pending_since.pop(jid, None)
                continue
            since = self._pending_since.setdefault(jid, now)
            reason = row["Reason"]
            if reason in HOPELESS:
                self.hopeless[jid] = reason
            elif now - since > self.report_after_s and now - self._reported.get(reason, 0) > 300:
                self._reported[reason] = now
                waiting = sum(1 for j, r in info.items() if j in self._pending_since and r["Reason"] == reason)
                print(
                    f"apps-bench: {waiting} SLURM job(s) pending for {now - since:.0f} s, reason: {reason}"
                    f" (squeue -j {jid.split('_')[0]}; sinfo shows what the partition offers)",
                    file=sys.stderr,
                    flush=True,
                )
        if self.hopeless:
            raise JobsNotSchedulable(
                "these SLURM jobs cannot be scheduled as requested: "
                + ", ".join(f"{j} ({r})" for j, r in sorted(self.hopeless.items()))
                + ". "
                + REQUEST_HINT
            )


Launch = Callable[[Sequence[Sequence[str]], int], Sequence[JobReturn]]


def watched_launch(
    launch: Launch,
    submitit_folder: str,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    *,
    poll_s: float,
    disks: Sequence[str],
) -> Sequence[JobReturn]:
    """Run submitit's `launch` with the squeue watcher (squeue every `poll_s` seconds); end the sweep
    with a message (exit 1) when a job failed or ended without a result, cancel its jobs on Ctrl-C/SIGTERM;
    a cell whose surroundings failed stops it as `stopping_launch` says."""
    watcher = SqueueWatcher(poll_s)
    previous, SlurmJob.watcher = SlurmJob.watcher, watcher
    on_sweep_interrupt(watcher.cancel_all)  # Ctrl-C/SIGTERM: scancel at once, before the parent run ends KILLED
    try:
        return _unless_stopped(launch(job_overrides, initial_job_idx))
    except JobsNotSchedulable as exc:
        watcher.cancel_all()
        _fail(f"apps-bench: {exc} The sweep's jobs were cancelled.")
    except Exception as exc:
        if not watcher.cells():  # sbatch refused the array (e.g. more CPUs or memory than any node has)
            _fail(f"apps-bench: SLURM did not accept the sweep's jobs: {str(exc).strip()}\n{REQUEST_HINT}")
        # a cell failed or ended without a result: let the others finish, then say which
        _wait_all(watcher)
        _raise_if_stopped(submitit_folder, disks)
        message = _ended_badly(watcher, submitit_folder, job_overrides)
        if message is None:  # every cell finished: the error is not a job's
            raise
        _fail(message)
    except BaseException:  # Ctrl-C, SIGTERM, SystemExit: nothing of this sweep stays queued
        watcher.cancel_all()
        raise
    finally:
        SlurmJob.watcher = previous


def stopping_launch(
    launch: Launch,
    submitit_folder: str,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    *,
    disks: Sequence[str],
) -> Sequence[JobReturn]:
    """Run submitit's `launch`; a cell whose surroundings failed stops the sweep: the launching process says
    its line and raises its `faults.SweepStopped` (`__main__._run` ends the parent run by it). The job hands
    it back as its result (the launcher's `__call__`); a job on a full disk may have written neither its
    result nor its log, so the disks the sweep writes (`disks`: the job files', the cells') are asked too."""
    try:
        return _unless_stopped(launch(job_overrides, initial_job_idx))
    except Exception:
        _raise_if_stopped(submitit_folder, disks)
        raise


def _unless_stopped(results: Sequence[JobReturn | faults.SweepStopped]) -> Sequence[JobReturn]:
    done: list[JobReturn] = []
    for result in results:
        if isinstance(result, faults.SweepStopped):
            _stop(result)
        done.append(result)
    return done


def _raise_if_stopped(submitit_folder: str, disks: Sequence[str]) -> None:
    for path in sorted(Path(submitit_folder.split("%j")[0]).glob("**/*_result.pkl")):  # this sweep's jobs' folders
        try:
            _, result = pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - a result being written as the job was killed
            continue
        if isinstance(result, faults.SweepStopped):
            _stop(result)
    for disk in disks:
        fault = faults.full_or_read_only(Path(disk))
        if fault is not None:
            _stop(faults.SweepStopped(fault.line(f"{faults.CELL_RECORDS_SAFE} {faults.SWEEP_STOPS}"), False, fault.code))


def _stop(stop: faults.SweepStopped) -> NoReturn:
    """Said here: the cell said it into its job's log, if it could."""
    print(f"apps-bench: {stop.line}", file=sys.stderr, flush=True)
    raise stop from None


def _ended_badly(watcher: SqueueWatcher, folder: str, job_overrides: Sequence[Sequence[str]]) -> str | None:
    """The cells that failed or ended without a result, with their logs (None: there are none)."""
    from submitit.core.utils import JobPaths

    states = _sacct_states(watcher.cells())
    lines = []
    for jid, overrides in zip(watcher.cells(), job_overrides):
        paths = JobPaths(folder, job_id=jid, task_id=0)
        outcome = _outcome(paths.result_pickle)
        if outcome == "success":
            continue
        state = outcome or states.get(jid) or watcher.get_state(jid, mode="cache")
        if state == ENDED:
            state = "ended without a result (cancelled, killed or out of time; no accounting to say which)"
        cell = " ".join(filter_overrides(list(overrides)))
        lines.append(f"  job {jid} [{cell}]: {state}; log {paths.stderr}")
    if not lines:
        return None
    return (
        f"apps-bench: {len(lines)} of {len(job_overrides)} SLURM jobs of this sweep did not finish:\n"
        + "\n".join(lines)
        + "\nTheir records are kept: rerun the same command to finish them"
        " (finished cells are skipped, interrupted ones resume)."
    )


def _wait_all(watcher: SqueueWatcher) -> None:
    while any(not watcher.is_done(j) for j in watcher.cells()):
        time.sleep(1)


def _outcome(result_pickle: Path) -> str | None:
    """'success', 'failed (see its log)', or None when the job wrote no result."""
    if not result_pickle.exists():
        return None
    try:
        outcome, _ = pickle.loads(result_pickle.read_bytes())
    except Exception:  # noqa: BLE001 - a result being written as the job was killed
        return None
    return "success" if outcome == "success" else "failed (the cell raised; see its log)"


def _sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Final states from accounting, where the cluster has it ({} otherwise)."""
    if not job_ids:
        return {}
    cmd = ["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State"]
    for j in sorted({j.split("_")[0] for j in job_ids}):
        cmd += ["-j", j]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    return {r.split("|")[0]: r.split("|")[1] for r in out.stdout.splitlines() if r.count("|") == 1}


def _fail(message: str) -> NoReturn:
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(1)
