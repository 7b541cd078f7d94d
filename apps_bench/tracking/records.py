"""The per-cell records store: one JSON line per problem, appended as each problem completes.

Why a plain append-only file: a cell can be killed at any moment (Ctrl-C, `kill -9`, a
SLURM pre-emption) and must resume without losing or duplicating work. Each record is
written with one `write` on an O_APPEND descriptor and fsynced; on open, a torn last line
(a write cut by a kill) is cut off, and records of problems that hit an infrastructure
error are dropped (the file is rewritten atomically), so a rerun retries exactly those
and the file never holds two lines for one problem. A cell run takes the folder's lock
first (cell_lock.py): two runs of one cell never append to one file.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from apps_bench.errors import AppsBenchError
from apps_bench.tracking.cell_lock import LOCK, CellLock, LockTimes
from apps_bench.types import JsonObject, ProblemRecord

RECORDS = "records.jsonl"
TRANSCRIPTS = "transcripts.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
CELL = "cell.json"
PROMPTS = "prompts.json"


class CellDirConflict(AppsBenchError):
    """The output folder already holds a different cell's records."""


class RecordsUnreadable(ValueError, AppsBenchError):
    """A complete line of records.jsonl that this version cannot read as a record (a newer schema, a
    field it does not know): an error, never dropped, so no record is lost or half understood."""


def json_line(obj: JsonObject) -> bytes:
    """One line of records.jsonl or transcripts.jsonl, as the store appends it."""
    return (json.dumps(obj, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def record_key(split: str, problem_id: str) -> str:
    return f"{split}/{problem_id}"


@dataclass
class ResumeState:
    done: dict[str, ProblemRecord] = field(default_factory=dict)  # key -> record (no error)
    retried: list[str] = field(default_factory=list)  # keys whose error records were dropped
    torn_bytes: int = 0  # bytes of a torn last line cut off
    corrupt_lines: int = 0  # unparsable complete lines dropped


def _read_lines(path: Path) -> tuple[list[JsonObject], int, int, int]:
    """-> (records, good_length, torn_bytes, corrupt_lines). Tolerates a torn last line."""
    if not path.exists():
        return [], 0, 0, 0
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1  # everything after the last newline is a torn write
    torn = len(data) - cut
    out: list[JsonObject] = []
    corrupt = 0
    for raw in data[:cut].splitlines():
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            corrupt += 1
            continue
        if isinstance(rec, dict) and "key" in rec:
            out.append(rec)
        else:
            corrupt += 1
    return out, cut, torn, corrupt


def _read_records(path: Path) -> tuple[list[ProblemRecord], int, int, int]:
    """`_read_lines` of records.jsonl, each line read as a ProblemRecord (RecordsUnreadable if one cannot be)."""
    lines, good_len, torn, corrupt = _read_lines(path)
    try:
        return [ProblemRecord.from_json(r) for r in lines], good_len, torn, corrupt
    except ValueError as exc:
        raise RecordsUnreadable(f"{path}: {exc}") from None


def iter_lines(path: Path) -> Iterator[JsonObject]:
    """`_read_lines`' objects one at a time, for a reader that must not hold the file (a cell's
    transcripts are tens of MB): complete lines only, unparsable ones and a torn last line skipped."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n") or not raw.strip():
                continue  # a torn last line (a write cut by a kill), or a blank one
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and "key" in obj:
                yield obj


def iter_records(path: Path) -> Iterator[ProblemRecord]:
    """records.jsonl read as `RecordStore.records` reads it, one record at a time and in file order (the
    caller keeps a key's last one); a line this version cannot read is RecordsUnreadable."""
    for obj in iter_lines(path):
        try:
            yield ProblemRecord.from_json(obj)
        except ValueError as exc:
            raise RecordsUnreadable(f"{path}: {exc}") from None


def _atomic_write_lines(path: Path, lines: Iterable[JsonObject]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in lines:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _latest(recs: Iterable[ProblemRecord]) -> dict[str, ProblemRecord]:
    """key -> its last record (a file written by this store has one per key)."""
    return {r.key: r for r in recs}


class RecordStore:
    """Records of one cell in `cell_dir`. Thread-safe appends; one line per problem."""

    def __init__(self, cell_dir: Path | str):
        self.dir = Path(cell_dir)
        self.records_path = self.dir / RECORDS
        self.transcripts_path = self.dir / TRANSCRIPTS
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._tfd: int | None = None
        self.lock: CellLock | None = None

    # -- setup -----------------------------------------------------------------
    def claim(self, cell_key: str, cell_info: JsonObject, lock: LockTimes | None = None) -> str | None:
        """Create the folder, or check it belongs to this cell: never mix two cells' records.

        With `lock`, take the folder's lock first (CellBusy when another run holds it; nothing is
        written then); -> the take-over message when a dead holder's lock was taken over."""
        marker = self.dir / CELL
        existing = None
        if marker.exists():
            try:
                existing = json.loads(marker.read_text(encoding="utf-8")).get("key")
            except ValueError:
                existing = None
        if existing and existing != cell_key:
            raise CellDirConflict(
                f"{self.dir} holds records of cell {existing}, not of this cell ({cell_key}): "
                "a setting that changes results differs. Use another out_dir (or leave out_dir "
                "unset: each cell then gets its own folder under outputs/cells/)."
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        note = None
        if lock is not None:
            self.lock = CellLock(self.dir / LOCK, lock)
            try:
                note = self.lock.acquire()
            except BaseException:
                self.lock = None
                raise
        atomic_write_text(marker, json.dumps({"key": cell_key, **cell_info}, indent=2, default=str) + "\n")
        return note

    def release(self) -> None:
        """Close the files and give the folder's lock back (a no-op when none was taken)."""
        self.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def resume(self) -> ResumeState:
        """Read what is recorded; cut a torn tail; drop error records so they are retried."""
        recs, good_len, torn, corrupt = _read_records(self.records_path)
        state = ResumeState(torn_bytes=torn, corrupt_lines=corrupt)
        latest = _latest(recs)
        for key, rec in latest.items():
            if rec.error:
                state.retried.append(key)
            else:
                state.done[key] = rec
        if state.retried or corrupt or len(latest) != len(recs):
            _atomic_write_lines(self.records_path, (r.to_json() for r in state.done.values()))
        elif torn:
            with open(self.records_path, "r+b") as f:
                f.truncate(good_len)
        self._compact_transcripts(set(state.done))
        return state

    def _compact_transcripts(self, keep: set[str]) -> None:
        recs, good_len, torn, corrupt = _read_lines(self.transcripts_path)
        latest = {r["key"]: r for r in recs if r["key"] in keep}
        if len(latest) != len(recs) or corrupt:
            _atomic_write_lines(self.transcripts_path, latest.values())
        elif torn:
            with open(self.transcripts_path, "r+b") as f:
                f.truncate(good_len)

    # -- appends ----------------------------------------------------------------
    def _open(self) -> None:
        if self._fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            self._fd = os.open(self.records_path, flags, 0o644)
            self._tfd = os.open(self.transcripts_path, flags, 0o644)

    @staticmethod
    def _write_line(fd: int, obj: JsonObject, sync: bool = True) -> None:
        view = memoryview(json_line(obj))
        while view:  # one write in practice; loop only on a short write
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fsync(fd)

    def append(self, record: ProblemRecord, transcript: list[JsonObject] | None = None) -> None:
        """Append one problem's record (and its transcript), flushed to disk before returning.
        The transcript goes first: a record on disk always has its transcript."""
        with self._lock:
            if self.lock is not None:
                self.lock.check()  # taken over by another run: never two writers
            try:
                self._open()
                assert self._fd is not None and self._tfd is not None
                if transcript is not None:
                    # no fsync: a transcript lost in a power cut leaves its record without one, nothing worse
                    self._write_line(self._tfd, {"key": record.key, "id": record.id, "events": transcript}, sync=False)
                self._write_line(self._fd, record.to_json())
            except OSError as exc:  # a full disk: say where (a write to a descriptor names no file)
                exc.filename = exc.filename or str(self.dir)
                raise

    def close(self) -> None:
        with self._lock:
            for fd in (self._fd, self._tfd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._tfd = None

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------
    def records(self) -> list[ProblemRecord]:
        """The records as a rerun would find them (the last line of a key wins), read without touching the file."""
        return list(_latest(_read_records(self.records_path)[0]).values())

    def write_summary(self, summary: JsonObject) -> Path:
        path = self.dir / SUMMARY
        atomic_write_text(path, json.dumps(summary, indent=2, default=str) + "\n")
        return path

    def write_config(self, yaml_text: str) -> Path:
        path = self.dir / CONFIG
        atomic_write_text(path, yaml_text)
        return path

    def write_json(self, name: str, obj: object) -> Path:
        path = self.dir / name
        atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
        return path
