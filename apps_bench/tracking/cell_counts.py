"""A cell's counts (counts.json): its problems' totals and what each agent role did, small enough
to read for every cell of a study.

Per-role figures need the transcripts (turns, replies, tool calls; the characters each role was
given and produced, for records from before calls named their role), and a sequential cell's
transcripts are about 20 KB a problem: the report and `plan` read these counts instead. The cell
writes them when it finishes; for a cell that has none (an older one) they are computed in one
streaming pass over its records and transcripts, holding one line at a time.

The file names the size and modification time of the records and transcripts it was counted from:
a cell resumed, compacted or re-run since then has other files, and its counts are counted again,
never served stale.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from apps_bench.tracking.records import RECORDS, TRANSCRIPTS, iter_lines, iter_records
from apps_bench.types import JsonObject, UsageRecord

COUNTS = "counts.json"
VERSION = 1


@dataclass
class RoleUse:
    """One role's share of a problem, from its transcript events."""

    turns: int = 0  # agent turns started (input events)
    replies: int = 0
    tool_calls: int = 0
    steps: int = 0  # model calls inferred from the events: a reply, or a tool call not after one, starts one
    chars_in: int = 0  # what the role was given: inputs and tool results
    chars_out: int = 0  # what the role produced: replies and tool-call arguments


def role_uses(events: Iterable[JsonObject]) -> dict[str, RoleUse]:
    out: dict[str, RoleUse] = {}
    last: dict[str, str] = {}  # agent -> kind of its previous event
    for e in events:
        role = str(e.get("role") or e.get("agent") or "?")
        if role == "team":  # the flow's own notes, no agent behind them
            continue
        u = out.setdefault(role, RoleUse())
        kind, n = e.get("kind"), len(str(e.get("content") or ""))
        agent = str(e.get("agent") or role)
        if kind == "reply" or (kind == "tool_call" and last.get(agent) not in ("reply", "tool_call")):
            u.steps += 1
        last[agent] = str(kind)
        if kind == "input":
            u.turns += 1
            u.chars_in += n
        elif kind == "tool_result":
            u.chars_in += n
        elif kind == "reply":
            u.replies += 1
            u.chars_out += n
        elif kind == "tool_call":
            u.tool_calls += 1
            u.chars_out += n
    return out


def role_calls(calls: list[JsonObject]) -> dict[str, tuple[int, int, int]] | None:
    """Role -> (calls, prompt tokens, completion tokens) from a record's per-call entries, each
    naming the agent role whose client made it; None when the record cannot say (no entries,
    as in problems.json rows, or entries from before calls carried roles)."""
    if any(not c.get("role") for c in calls):
        return None
    out: dict[str, tuple[int, int, int]] = {}
    for c in calls:
        n, p, q = out.get(str(c["role"]), (0, 0, 0))
        out[str(c["role"])] = (n + 1, p + int(c.get("prompt_tokens", 0) or 0), q + int(c.get("completion_tokens", 0) or 0))
    return out


def usage_role_calls(u: UsageRecord) -> dict[str, tuple[int, int, int]] | None:
    """`role_calls` of a problem's usage, when its per-call entries are all there (one per model call)."""
    return role_calls(u.calls) if len(u.calls) == u.model_calls else None


@dataclass
class RoleTally:
    """One role over a cell's problems."""

    transcripts: int = 0  # problems whose transcript shows the role
    turns: int = 0
    replies: int = 0
    tool_calls: int = 0
    called_in: int = 0  # problems whose records name the role in a call
    calls: int = 0  # model calls counted from the records' per-call roles
    tokens: int = 0
    est_tokens: float = 0.0  # problems' tokens apportioned by the characters the transcript shows
    est_calls: float = 0.0  # problems' calls apportioned by the model steps the transcript shows


@dataclass
class CellCounts:
    """A cell's counts, from every record of its folder (a key's last line) and their transcripts."""

    problems: int = 0  # records, errors included
    model_calls: int = 0
    total_tokens: int = 0
    measured: bool = True  # every record names the role of each of its calls
    covered: int = 0  # problems with a transcript that shows a role
    covered_tokens: int = 0  # their total tokens
    roles: dict[str, RoleTally] = field(default_factory=dict)  # transcript roles first, in order of appearance
    of: dict[str, list[int] | None] = field(default_factory=dict)  # file -> [size, mtime_ns] it was counted from

    def to_json(self) -> JsonObject:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: JsonObject) -> CellCounts | None:
        """The counts a counts.json holds, or None when it is another version or not counts."""
        if not isinstance(data, Mapping) or data.get("version") != VERSION:
            return None
        try:
            roles = {str(k): RoleTally(**v) for k, v in (data.get("roles") or {}).items()}
            kept = {k: v for k, v in data.items() if k not in ("version", "roles")}
            return cls(**kept, roles=roles)
        except TypeError:
            return None


def file_stamp(path: Path) -> list[int] | None:
    """[size, mtime_ns] of a file, None when there is none: what a stale count is told by."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def stamps(cell_dir: Path) -> dict[str, list[int] | None]:
    return {name: file_stamp(cell_dir / name) for name in (RECORDS, TRANSCRIPTS)}


class Tally:
    """Counts a cell's problems one at a time (`add`), then their transcripts (`add_transcript`):
    what it holds per problem is a few numbers, never a transcript."""

    def __init__(self) -> None:
        self._usage: dict[str, tuple[int, int, int, int]] = {}  # key -> prompt, completion, total tokens, calls
        self._called: dict[str, dict[str, tuple[int, int, int]] | None] = {}
        self._uses: dict[str, dict[str, RoleUse]] = {}

    def add(self, key: str, usage: UsageRecord, *, per_call: bool = True) -> None:
        """A problem's usage; a key's last one counts. `per_call=False`: a problems.json row's, which
        holds no per-call entries (its roles cannot be counted)."""
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        self._usage[key] = (prompt, completion, prompt + completion, usage.model_calls)
        self._called[key] = usage_role_calls(usage) if per_call else None

    def add_transcripts(self, lines: Iterable[JsonObject]) -> None:
        """Transcript lines of problems added: a key's last line counts; lines of other keys are left out."""
        for t in lines:
            key = str(t.get("key"))
            if key in self._usage:
                self._uses[key] = role_uses(t.get("events") or [])

    def counts(self, of: dict[str, list[int] | None]) -> CellCounts:
        out = CellCounts(problems=len(self._usage), of=of)
        out.measured = all(c is not None for c in self._called.values())
        for key, (prompt, completion, total, calls) in self._usage.items():
            out.model_calls += calls
            out.total_tokens += total
            uses = self._uses.get(key)
            if uses:
                out.covered += 1
                out.covered_tokens += total
                cin = sum(u.chars_in for u in uses.values()) or 1
                cout = sum(u.chars_out for u in uses.values()) or 1
                steps = sum(u.steps for u in uses.values()) or 1
                for role, u in uses.items():
                    r = out.roles.setdefault(role, RoleTally())
                    r.transcripts += 1
                    r.turns += u.turns
                    r.replies += u.replies
                    r.tool_calls += u.tool_calls
                    r.est_tokens += prompt * u.chars_in / cin + completion * u.chars_out / cout
                    r.est_calls += calls * u.steps / steps
        for called in self._called.values():  # after the transcripts' roles: the report's order
            for role, (n, prompt, completion) in (called or {}).items():
                r = out.roles.setdefault(role, RoleTally())
                r.called_in += 1
                r.calls += n
                r.tokens += prompt + completion
        return out


def count(cell_dir: Path, *, transcripts: bool = True) -> CellCounts:
    """A cell folder's counts in one streaming pass over its records (and transcripts)."""
    of = stamps(cell_dir)
    tally = Tally()
    for rec in iter_records(cell_dir / RECORDS):
        tally.add(rec.key, rec.usage)
    if transcripts:
        tally.add_transcripts(iter_lines(cell_dir / TRANSCRIPTS))
    else:
        of[TRANSCRIPTS] = None
    return tally.counts(of)


def saved(cell_dir: Path) -> CellCounts | None:
    """The folder's counts.json when it was counted from the folder's files as they are now, else None."""
    try:
        data = json.loads((cell_dir / COUNTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    got = CellCounts.from_json(data)
    return got if got is not None and got.of == stamps(cell_dir) else None


def _save(cell_dir: Path, counts: CellCounts) -> Path:
    """counts.json, replaced whole: a temporary file of this process's own (two reports may count one
    cell at once), removed when the write fails or is interrupted."""
    path = cell_dir / COUNTS
    tmp = cell_dir / f".{COUNTS}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(counts.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write(cell_dir: Path) -> Path:
    """Count the cell and save its counts.json (the cell does this when it finishes)."""
    return _save(cell_dir, count(cell_dir))


def of_folder(cell_dir: Path) -> CellCounts:
    """The folder's counts: saved ones when current, else counted now and saved when the folder is
    writable (a read-only folder is counted again next time, in the same bounded pass)."""
    got = saved(cell_dir)
    if got is not None:
        return got
    got = count(cell_dir)
    if got.of[RECORDS] is None:
        return got  # nothing recorded (a cell that never got going): nothing to save
    try:
        _save(cell_dir, got)
    except OSError:
        pass  # not ours to write (a shared, read-only study): counted, not saved
    return got
