"""One writer per cell: a lock file in the cell's folder that names its holder and beats.

Why a file and not `flock`: cells keep their outputs where clusters do, on network
filesystems that may not honour `flock`. The lock is created with O_CREAT|O_EXCL (atomic on
local disks and NFSv3+), names its holder (host, pid, start time) and carries a heartbeat
that a thread refreshes while the cell runs. A second run of the cell refuses at once,
naming the holder. A lock whose holder is gone (its pid is dead on this host) or whose
heartbeat is older than `stale_after_s` (a holder killed on another host) is taken over
with a message, so a `kill -9` never blocks the cell for ever. Heartbeats compare wall
clocks: hosts sharing a cell folder need clocks in sync to well under `stale_after_s`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apps_bench.config.schema import CellLockConfig

from apps_bench.errors import AppsBenchError

LOCK = "cell.lock"


class CellBusy(AppsBenchError):
    """Another process is running this cell now: says who, and what to do."""


class CellLockLost(AppsBenchError):
    """This process's lock was taken over (its heartbeat stalled): it must stop writing."""


@dataclass(frozen=True)
class LockTimes:
    heartbeat_s: float  # how often the holder refreshes its heartbeat
    stale_after_s: float  # a heartbeat older than this is a dead holder's


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    token: str  # tells this lock from a later one of the same process id
    started_at: float
    heartbeat_at: float
    proc_start: str = ""  # the pid's start time on its host (/proc): a reused pid is not the holder

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        try:
            d = json.loads(raw)
            return cls(
                host=str(d["host"]),
                pid=int(d["pid"]),
                token=str(d["token"]),
                started_at=float(d["started_at"]),
                heartbeat_at=float(d["heartbeat_at"]),
                proc_start=str(d.get("proc_start", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def dump(self) -> bytes:
        return (json.dumps(asdict(self), indent=2) + "\n").encode()


def _proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), '' where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    if fields and fields[0] == "Z":
        return "zombie"
    return fields[19] if len(fields) > 19 else ""


def _alive_here(holder: Holder) -> bool:
    """Is the holder's process still running on this host?"""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    now = _proc_start(holder.pid)
    if now == "zombie":
        return False  # killed, not yet reaped by its parent
    return not (holder.proc_start and now and now != holder.proc_start)


class CellLock:
    """The lock file `path`: `acquire` or CellBusy, `start_heartbeat` while working, `release`."""

    def __init__(self, path: Path, times: LockTimes) -> None:
        self.path = path
        self.times = times
        self.host = socket.gethostname()
        self.lost: str | None = None  # why this process's lock was taken from it
        self._me: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lock; -> a message when it was taken over from a dead holder, else None."""
        note = None
        for _ in range(5):
            now = time.time()
            me = Holder(self.host, os.getpid(), uuid.uuid4().hex, now, now, _proc_start(os.getpid()))
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    raw = self.path.read_bytes()
                except FileNotFoundError:
                    continue  # released meanwhile
                why = self._stale(raw)
                if why is None:
                    raise CellBusy(self._busy_message(raw)) from None
                if _remove_if_unchanged(self.path, raw):
                    held = Holder.parse(raw)
                    who = f"pid {held.pid} on {held.host}" if held else "an unreadable lock"
                    note = f"took over the lock of {self.path.parent} from {who} ({why}); its records are kept and resumed"
                continue
            try:
                os.write(fd, me.dump())
                os.fsync(fd)
            finally:
                os.close(fd)
            self._me = me
            return note
        raise CellBusy(
            f"{self.path} keeps changing hands: other runs of this cell are starting at the same time; nothing was run"
        )

    def busy(self) -> str | None:
        """Why a run could not take this lock now (as `acquire` would refuse), None when it could.
        Reads only: a dead holder's lock is left for `acquire` to take over."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return self._busy_message(raw) if self._stale(raw) is None else None

    def _stale(self, raw: bytes) -> str | None:
        """Why the lock in `raw` is a dead holder's (None: it is alive)."""
        held = Holder.parse(raw)
        if held is None:  # a holder writes its lock right after creating it: unreadable for long = dead
            age = time.time() - self.path.stat().st_mtime if self.path.exists() else 0.0
            return f"unreadable for {age:.0f} s" if age > self.times.stale_after_s else None
        if held.host == self.host and held.pid == os.getpid():
            return "left by an earlier process with this process id"
        if held.host == self.host and not _alive_here(held):
            return f"its process {held.pid} is gone"
        age = time.time() - held.heartbeat_at
        if age > self.times.stale_after_s:
            return f"its last heartbeat is {age:.0f} s old, stale after {self.times.stale_after_s:g} s"
        return None

    def _busy_message(self, raw: bytes) -> str:
        held = Holder.parse(raw)
        stale = f"{self.times.stale_after_s:g} s (tracking.cell_lock.stale_after_s)"
        if held is None:
            return (
                f"another run of this cell is taking its lock {self.path} right now; nothing was run. "
                f"Rerun once it is done; an unreadable lock is taken over after {stale}."
            )
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.started_at))
        beat = time.time() - held.heartbeat_at
        return (
            f"this cell is being run right now by pid {held.pid} on host {held.host} (since {started}, last heartbeat "
            f"{beat:.0f} s ago), in {self.path.parent}; a second run would solve its problems twice, so nothing was run. "
            f"Wait for it to finish (rerunning then solves only what it left), or stop it (kill {held.pid} on "
            f"{held.host}). If that process is gone on another host, its lock is taken over once its heartbeat is "
            f"older than {stale}: rerun then, or delete {self.path} if you are sure it is dead."
        )

    def start_heartbeat(self) -> None:
        """Refresh the heartbeat every `heartbeat_s` on a daemon thread until `release`."""
        if self._thread is None and self._me is not None:
            self._thread = threading.Thread(target=self._beat, name="apps-bench-cell-lock", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.times.heartbeat_s):
            assert self._me is not None
            try:
                held = Holder.parse(self.path.read_bytes())
            except FileNotFoundError:
                held = None
                if not self.path.parent.is_dir():
                    self.lost = (
                        f"the cell's folder {self.path.parent} was deleted while this run wrote to it; this run "
                        "stops writing. What it had recorded went with the folder: rerun the same command to "
                        "solve the cell again"
                    )
                    return
            if held is None or held.token != self._me.token:
                self.lost = (
                    f"the lock {self.path} was taken over by "
                    + (f"pid {held.pid} on {held.host}" if held else "another run")
                    + " (this process's heartbeat stalled for longer than the stale age); this run stops "
                    "writing. Its records so far are kept"
                )
                return
            beat = Holder(**{**asdict(self._me), "heartbeat_at": time.time()})
            tmp = self.path.with_name(f"{self.path.name}.{self._me.token}.tmp")
            try:
                tmp.write_bytes(beat.dump())
                os.replace(tmp, self.path)
            except OSError:  # a full disk, say: this beat is missed, never a traceback; the run's own writes say it
                tmp.unlink(missing_ok=True)

    def check(self) -> None:
        """Raise CellLockLost when another run has taken this cell over."""
        if self.lost:
            raise CellLockLost(self.lost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._me is None:
            return
        try:
            held = Holder.parse(self.path.read_bytes())
        except FileNotFoundError:
            held = None
        if held is not None and held.token == self._me.token:
            self.path.unlink(missing_ok=True)
        self._me = None


def _remove_if_unchanged(path: Path, seen: bytes) -> bool:
    """Remove the lock `path` only if it still holds `seen` (another run may have taken it over
    meanwhile): move it to a name of our own, and put it back if it was not the one judged dead."""
    grave = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        return False
    try:
        if grave.read_bytes() == seen:
            return True
        try:
            os.link(grave, path)  # a live holder's lock: back in place (unless a newer one is there)
        except FileExistsError:
            pass
        return False
    finally:
        grave.unlink(missing_ok=True)


def lock_times(settings: CellLockConfig) -> LockTimes:
    """LockTimes from the cell's `tracking.cell_lock` settings (conf/tracking/*.yaml)."""
    return LockTimes(heartbeat_s=float(settings.heartbeat_s), stale_after_s=float(settings.stale_after_s))
