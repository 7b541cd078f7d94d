"""The rollout cache and per-step checkpoints: what makes a killed optimizer run resume
to the same result without paying twice.

A rollout is keyed by everything that can change its outcome: the texts of the roles
that influence the run, the problem key, the request seed, the model and the pipeline
settings. The value is the attempt and its verdict (a `Rollout` as JSON). Optimizer-model
calls are cached the same way (key = model, messages, seed), so a replay proposes the
same prompts.

Storage is SQLite in WAL mode: each put is one committed transaction, so a `kill -9`
loses at most the put in flight and never corrupts earlier ones; several processes
(e.g. a sweep) may share one file.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Iterator, Mapping

from apps_bench.optimizers.protocol import ProblemKey, atomic_write_json
from apps_bench.types import JsonObject

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL DEFAULT (julianday('now')),
    PRIMARY KEY (kind, key)
)
"""


def stable_hash(obj: object) -> str:
    """SHA-256 of canonical JSON (sorted keys, no whitespace): equal values, equal hashes."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _default(obj: object) -> object:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "items"):
        return dict(obj.items())
    raise TypeError(f"cannot hash a {type(obj).__name__} into a cache key; pass plain data")


def rollout_key(
    role_texts: Mapping[str, str],
    key: ProblemKey,
    seed: int,
    model: JsonObject | str,
    settings: JsonObject,
) -> str:
    """Cache key of one pipeline run on one problem.

    `role_texts`: only the roles that influence this run (all roles for a whole run).
    `model`: the settings that change replies (id, temperature, top_p, max_tokens, ...).
    `settings`: the eval cell's pipeline settings (topology, team size, rounds, limits,
    judge profile, test cap). A partial re-run passes its upstream outputs in `settings`.
    """
    return stable_hash(
        {
            "roles": dict(role_texts),
            "problem": [key[0], key[1]],
            "seed": int(seed),
            "model": model,
            "settings": settings,
        }
    )


class RolloutCache:
    """Append-only key -> JSON store on SQLite. Thread-safe; first write of a key wins."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=60.0, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL+NORMAL: durable across process kills
        self._db.execute(_SCHEMA)
        self.hits = 0
        self.misses = 0

    def get(self, key: str, kind: str = "rollout") -> JsonObject | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM entries WHERE kind=? AND key=?", (kind, key)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: JsonObject, kind: str = "rollout") -> bool:
        """Store `value` unless the key is already there (then the first value stays). True if stored."""
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO entries(kind, key, value) VALUES (?, ?, ?)", (kind, key, text))
            return cur.rowcount == 1

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM entries WHERE kind='rollout' AND key=?", (key,)).fetchone() is not None

    def count(self, kind: str | None = None) -> int:
        with self._lock:
            if kind is None:
                return self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM entries WHERE kind=?", (kind,)).fetchone()[0]

    def items(self, kind: str = "rollout") -> Iterator[tuple[str, JsonObject]]:
        with self._lock:
            rows = self._db.execute("SELECT key, value FROM entries WHERE kind=? ORDER BY rowid", (kind,)).fetchall()
        for k, v in rows:
            yield k, json.loads(v)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RolloutCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Checkpoints:
    """One JSON file per optimizer step (`step_00007.json`), written atomically.

    A checkpoint is the method's whole state after a step (prompts, beams, scores,
    charged budget, RNG state), so a resumed run continues from the last complete step;
    steps whose checkpoint was lost to a kill are replayed through the rollout cache.
    """

    def __init__(self, directory: Path | str) -> None:
        self.dir = Path(directory)

    def save(self, step: int, state: JsonObject) -> Path:
        path = self.dir / f"step_{int(step):05d}.json"
        atomic_write_json(path, {"step": int(step), **state})
        return path

    def steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        out = []
        for p in self.dir.glob("step_*.json"):
            try:
                out.append(int(p.stem.split("_", 1)[1]))
            except ValueError:
                continue
        return sorted(out)

    def load(self, step: int) -> JsonObject:
        return json.loads((self.dir / f"step_{int(step):05d}.json").read_text(encoding="utf-8"))

    def latest(self) -> JsonObject | None:
        steps = self.steps()
        return self.load(steps[-1]) if steps else None
