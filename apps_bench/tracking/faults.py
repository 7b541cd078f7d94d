"""A failure of a command's surroundings, answered like a bad setting.

The tracking store unreachable or lost, a full disk, a read-only folder, an interrupt: each
command (a cell, a sweep's end, `report`, `rescore`, `plan`) ends with one line saying what
failed, what is safe and the fix, and a documented exit code (docs/usage.md, "Outputs,
resume, errors"), never a traceback. The traceback is printed first when asked for
(`--debug`, or `hydra.verbose=apps_bench` for a cell: the `apps_bench` logger at DEBUG).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from apps_bench.tracking.mlflow import store_calls_failed
from apps_bench.tracking.sqlite_store import StoreError

EXIT_FAILED = 2  # the surroundings failed: nothing computed is lost, the same command finishes the rest
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells count it

CELL_RECORDS_SAFE = "Every problem recorded so far is kept, and none is recorded twice."  # a cell's disk fault
SWEEP_STOPS = "The sweep stops here; the cells it finished keep their records too."

_DISK_ERRNOS = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
    errno.EROFS: "read-only",
    errno.EACCES: "denied",
    errno.EPERM: "denied",
}


@dataclass(frozen=True)
class Fault:
    """What failed (with the fix) and the exit code that says so."""

    what: str
    fix: str
    code: int = EXIT_FAILED

    def line(self, safe: str) -> str:
        return " ".join(part.strip() for part in (self.what.rstrip(".") + ".", safe, self.fix) if part.strip())


class SweepStopped(SystemExit):
    """A sweep's cell whose surroundings failed stops the sweep: its line is said, and the launching process
    ends the sweep's parent run by it. A SystemExit, which launchers let through where they report an
    exception as a traceback, and which keeps its line when pickled: a launcher's worker process (joblib)
    hands it to the launching process as the basic launcher's own process does."""

    def __init__(self, line: str, store_lost: bool, code: int = EXIT_FAILED) -> None:
        super().__init__(code)
        self.line, self.store_lost = line, store_lost

    def __reduce__(self) -> tuple[type, tuple[str, bool, int]]:
        return SweepStopped, (self.line, self.store_lost, int(self.code or EXIT_FAILED))  # type: ignore[arg-type]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def disk_fault(exc: BaseException) -> Fault | None:
    """A full disk or a folder this process may not write, anywhere in `exc`'s chain."""
    for e in _chain(exc):
        if not isinstance(e, OSError):
            continue
        kind = _DISK_ERRNOS.get(e.errno or -1)
        if kind is None or (kind == "denied" and not e.filename):
            continue
        path = str(e.filename or "")
        where = f" ({path})" if path else ""
        if kind == "full":
            return Fault(
                f"no space left on the disk{where} ({e.strerror})",
                "Free space there (or give out_dir= another disk) and rerun the same command.",
            )
        why = "it is on a read-only file system" if kind == "read-only" else "permission denied"
        return Fault(
            f"cannot write {path or 'a file'}: {why}",
            "Run from a folder this user can write, or point out_dir= (and MLFLOW_TRACKING_URI) at one, "
            "then rerun the same command.",
        )
    return None


def fault_of(exc: BaseException, uri: str | None = None) -> Fault | None:
    """`exc` as a failure of the surroundings (None: a bug or a bad setting, answered elsewhere)."""
    if isinstance(exc, KeyboardInterrupt):
        return Fault("interrupted", "Rerun the same command.", EXIT_INTERRUPTED)
    if isinstance(exc, StoreError):  # its message says what failed and the fix
        return Fault(str(exc), "")
    found = disk_fault(exc)
    if found is not None:
        return found
    if uri:
        store_side = [e for e in _chain(exc) if not _plain_os_error(e)]  # a file of the command's own is not the store
        lost = next((s for s in map(lambda e: store_calls_failed(uri, e), store_side) if s is not None), None)
        if lost is not None:
            return Fault(str(lost), "Once the store answers again, rerun the same command.")
    return None


def _plain_os_error(exc: BaseException) -> bool:
    """An OSError of Python's own other than a connection's (a missing file, say); the HTTP clients' errors,
    OSErrors too, are not plain."""
    return (
        type(exc).__module__ == "builtins" and isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError))
    )


def debugging(debug: bool = False) -> bool:
    """Whether the traceback is wanted: `--debug`, or the `apps_bench` logger at DEBUG (hydra.verbose=apps_bench)."""
    return debug or logging.getLogger("apps_bench").isEnabledFor(logging.DEBUG)


def say(prog: str, fault: Fault, safe: str, exc: BaseException | None = None, *, debug: bool = False) -> None:
    """Print `fault` as one line on stderr (its traceback first when debugging)."""
    sys.stdout.flush()
    if exc is not None and debugging(debug):
        traceback.print_exception(exc)
    print(f"{prog}: {fault.line(safe)}", file=sys.stderr, flush=True)


@contextmanager
def answered(prog: str, safe: str, *, uri: str | None = None, debug: bool = False) -> Iterator[None]:
    """Run a command's work; a failure of its surroundings ends it as one line and its exit code
    (SystemExit). `safe`: what the failure leaves intact, in the command's own words."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as exc:
        fault = fault_of(exc, uri)
        if fault is None:
            raise
        say(prog, fault, safe, exc, debug=debug)
        raise SystemExit(fault.code) from None


def quiet_log_files() -> None:
    """A log file (Hydra's job log) on a full or read-only disk costs no traceback per line logged ("--- Logging
    error ---"): the command's own writes there fail too, and say so in one line. Other logging errors are
    reported as logging always does."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = _unless_disk.__get__(handler)  # type: ignore[method-assign]


def _unless_disk(self: logging.Handler, record: logging.LogRecord) -> None:
    if disk_fault(sys.exc_info()[1] or Exception()) is None:
        logging.Handler.handleError(self, record)


def full_or_read_only(path: Path) -> Fault | None:
    """The disk holding `path` (its nearest existing folder) full or read-only, by the file system's own
    counts: for a process that failed there and may have been unable to write even why (a launcher's job)."""
    p = _existing(path)
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    err = errno.EROFS if st.f_flag & os.ST_RDONLY else errno.ENOSPC if st.f_bavail == 0 else None
    return None if err is None else disk_fault(OSError(err, os.strerror(err), str(p)))


def _existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def unwritable(path: Path) -> str | None:
    """Why `path` (a folder a command will create files under) cannot be written, or None."""
    p = _existing(path)
    if not p.is_dir():
        return f"{p} is not a folder"
    if os.access(p, os.W_OK | os.X_OK):
        return None
    try:
        ro = bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        ro = False
    return f"{p} is on a read-only file system" if ro else f"this user cannot write {p}"
