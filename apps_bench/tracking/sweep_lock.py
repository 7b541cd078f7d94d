"""One launch of a sweep at a time, and none over a cell that another run is running.

A second launch of the same cells while the first runs would open a parent run of its own and
fail each cell on the cell's lock (exit 1); started at the same moment as the first, it raced it
to create the experiment. So the launching process holds a lock file for its sweep,
`outputs/sweeps/<sweep key>.lock` under the launching directory (a `CellLock`: the same holder,
heartbeat and takeover of a dead holder as a cell's lock), from before it creates anything in
the tracking store until the sweep's parent run has ended. A launch that finds that lock held,
or a member cell's folder locked by a live run, is refused before it creates anything.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterable

from apps_bench.errors import AppsBenchError
from apps_bench.tracking.cell_lock import LOCK, CellBusy, CellLock, Holder, LockTimes

SWEEPS = "sweeps"  # under the launching directory's outputs/


class SweepBusy(AppsBenchError):
    """Another launch runs this sweep, or another run holds one of its cells: says who, and what to do."""


def lock_path(root: Path, sweep_key: str) -> Path:
    return root / "outputs" / SWEEPS / f"{sweep_key}.lock"


def take(root: Path, sweep_key: str, what: str, times: LockTimes) -> tuple[CellLock, str | None]:
    """Hold this launch's lock on the sweep `sweep_key` (`what` names it in a refusal), beating
    until released. -> (the lock, a note when a dead launch's lock was taken over)."""
    path = lock_path(root, sweep_key)
    made = [p for p in (path.parent.parent, path.parent) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = CellLock(path, times)
    try:
        note = lock.acquire()
    except CellBusy:
        _forget(made)
        raise SweepBusy(_held(path, what, times)) from None
    lock.start_heartbeat()
    return lock, note


def release(lock: CellLock) -> None:
    """Release the sweep's lock, and the folders it alone made."""
    lock.release()
    _forget([lock.path.parent, lock.path.parent.parent])


def busy_cells(cells: Iterable[tuple[str, Path]], times: LockTimes) -> list[str]:
    """'<cell>: who runs it' for each (name, folder) of a member cell a live run holds (reads only)."""
    return [f"{name}: {why}" for name, folder in cells if (why := CellLock(folder / LOCK, times).busy())]


def _held(path: Path, what: str, times: LockTimes) -> str:
    try:
        holder = Holder.parse(path.read_bytes())
    except FileNotFoundError:
        holder = None
    stale = f"{times.stale_after_s:g} s (tracking.cell_lock.stale_after_s)"
    if holder is None:
        return f"{what} is being launched right now by another command (lock {path}); nothing was run. Rerun once it has ended."
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.started_at))
    return (
        f"{what} is being launched right now by pid {holder.pid} on host {holder.host} (since {since}; lock {path}); "
        f"a second launch would run its cells twice, so nothing was run and its runs are untouched. Wait for it to end "
        f"(rerunning then runs only what it left), or stop it (kill {holder.pid} on {holder.host}). A launch that died on "
        f"another host gives up its lock once its heartbeat is older than {stale}."
    )


def _forget(folders: list[Path]) -> None:
    """Remove these folders if they are empty (the lock's own, when nothing else is in them)."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
