"""The optimizer protocol every method shares: pool, splits, manifest, scoring gate,
budgets and paired seeds.

Why one module: an optimizer's answer ("did prompt optimization help?") is only as good
as the fairness of this protocol, so the rules live in one place that every method
(MASPO, GEPA, ...) goes through and that tests can check alone:

- the pool never holds an eval problem (by key, nor by question text);
- train and val are disjoint and reproducible from `split_seed`;
- the manifest is written before any model call, and a rerun must agree with it;
- scoring refuses eval keys unless the final evaluation is explicitly opened;
- budgets are counted in rollouts and tokens with hard caps (a batch that starts
  under the cap may finish: overshoot is at most one batch, and it is reported);
- a problem gets the same request seed for every candidate, so comparisons are paired.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from apps_bench.config.schema import POOL_SOURCES, BudgetParams
from apps_bench.data import eval_ids, eval_manifest
from apps_bench.errors import AppsBenchError
from apps_bench.types import JsonObject, Problem

ProblemKey = tuple[str, str]  # (split, problem_id): APPS train and test both number from 0
# an optimizer run's event (kind, payload): a line of its events.jsonl, and step metrics for MLflow
EventHook = Callable[[str, JsonObject], None]

MANIFEST_VERSION = 1


# --------------------------------------------------------------------------- keys


def make_key(split: str, problem_id: str | int) -> ProblemKey:
    """A problem key; ids are strings everywhere (APPS ids come as ints in rows)."""
    return (str(split), str(problem_id))


def key_str(key: ProblemKey) -> str:
    """`split/id`: a key as one string (JSON object keys, logs, GEPA data instances)."""
    return f"{key[0]}/{key[1]}"


def parse_key(text: str) -> ProblemKey:
    split, sep, pid = text.partition("/")
    if not sep or not split or not pid:
        raise ValueError(f"bad problem key {text!r}: expected 'split/problem_id', e.g. 'train/123'")
    return (split, pid)


def question_hash(text: str) -> str:
    """SHA-256 of the question with whitespace runs collapsed (so re-wrapped copies match)."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- eval set


@dataclass(frozen=True)
class EvalSet:
    """The problems optimizers must never train or select on."""

    keys: frozenset[ProblemKey]
    question_hashes: frozenset[str] = frozenset()

    def with_questions(self, problems: Iterable[Problem]) -> EvalSet:
        """Add the question hashes of the eval problems among `problems` (e.g. the loaded eval rows)."""
        extra = {question_hash(p.question) for p in problems if p.key in self.keys}
        return EvalSet(self.keys, self.question_hashes | frozenset(extra))


def load_eval_set() -> EvalSet:
    """The eval keys of the data module's manifest (`data.eval_ids`): what the gate keeps out of training."""
    split = str(eval_manifest().get("split", "test"))
    return EvalSet(frozenset(make_key(split, i) for i in eval_ids()))


# --------------------------------------------------------------------------- pool and splits


@dataclass(frozen=True)
class Pool:
    """Problems eligible for optimization, by key, and what was dropped and why."""

    problems: Mapping[ProblemKey, Problem]
    dropped: Mapping[str, int]
    source: str

    def keys(self) -> list[ProblemKey]:
        return sorted(self.problems, key=_sort_key)


def _sort_key(key: ProblemKey) -> tuple[str, int, str]:
    split, pid = key
    return (split, int(pid) if pid.isdigit() else -1, pid)


def build_pool(
    problems: Iterable[Problem],
    *,
    eval_set: EvalSet,
    source: str = "train",
    difficulty: str | None = "interview",
) -> Pool:
    """Keep the rows an optimizer may use.

    source="train": APPS train-split rows; "test_minus_eval": test-split rows minus the
    eval keys (for comparison with earlier work). Always dropped: rows without tests,
    other difficulties, eval keys, rows whose question equals an eval question,
    duplicate keys. Rows the loader could not parse never arrive here (it counts them).
    """
    if source not in POOL_SOURCES:
        raise ValueError(f"unknown pool source {source!r}; choose one of {POOL_SOURCES}")
    want_split = "train" if source == "train" else "test"
    kept: dict[ProblemKey, Problem] = {}
    dropped: Counter[str] = Counter()
    for p in problems:
        key = p.key
        if p.split != want_split:
            dropped["other_split"] += 1
        elif difficulty and p.difficulty != difficulty:
            dropped["other_difficulty"] += 1
        elif len(p.tests) == 0:
            dropped["no_tests"] += 1
        elif key in eval_set.keys:
            dropped["eval_key"] += 1
        elif question_hash(p.question) in eval_set.question_hashes:
            dropped["eval_question"] += 1
        elif key in kept:
            dropped["duplicate_key"] += 1
        else:
            kept[key] = p
    return Pool(kept, dict(dropped), source)


@dataclass(frozen=True)
class Splits:
    train: tuple[ProblemKey, ...]
    val: tuple[ProblemKey, ...]
    split_seed: int

    def __post_init__(self) -> None:
        overlap = set(self.train) & set(self.val)
        if overlap:
            raise ValueError(f"train and val overlap on {sorted(overlap)[:5]}")


def make_splits(pool: Pool, *, train_size: int, val_size: int, split_seed: int) -> Splits:
    """Disjoint train and val, drawn from the sorted pool with `random.Random(split_seed)`."""
    if train_size < 1 or val_size < 1:
        raise ValueError(f"train_size and val_size must be >= 1 (got {train_size}, {val_size})")
    keys = pool.keys()
    need = train_size + val_size
    if len(keys) < need:
        raise ValueError(
            f"the pool holds {len(keys)} usable problems (dropped: {dict(pool.dropped)}) but "
            f"train_size + val_size = {need}; lower the split sizes in conf/optimizer or widen the pool"
        )
    rng = random.Random(split_seed)
    drawn = rng.sample(keys, need)
    return Splits(tuple(drawn[:train_size]), tuple(drawn[train_size:]), split_seed)


# --------------------------------------------------------------------------- manifest


def manifest_dict(splits: Splits, pool: Pool, *, dataset_revision: str, eval_set: EvalSet) -> JsonObject:
    def rows(keys: Sequence[ProblemKey]) -> list[dict[str, str]]:
        return [{"split": k[0], "problem_id": k[1], "question_sha256": question_hash(pool.problems[k].question)} for k in keys]

    return {
        "version": MANIFEST_VERSION,
        "dataset_revision": dataset_revision,
        "pool_source": pool.source,
        "pool_size": len(pool.problems),
        "dropped": dict(sorted(pool.dropped.items())),
        "split_seed": splits.split_seed,
        "eval_keys_excluded": len(eval_set.keys),
        "train": rows(splits.train),
        "val": rows(splits.val),
    }


def write_manifest(path: Path | str, manifest: JsonObject) -> Path:
    """Write the manifest atomically; on a rerun, refuse a manifest that differs.

    Called before any model call, so a killed run's splits are on disk; a resumed run
    must draw the same splits or the cached rollouts and budget would not belong to it.
    """
    path = Path(path)
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old != json.loads(json.dumps(manifest)):
            raise ValueError(
                f"{path} already holds a different split manifest (other pool, sizes, seed or revision); "
                "use a fresh output directory or restore the original settings to resume"
            )
        return path
    atomic_write_json(path, manifest)
    return path


def read_manifest_splits(path: Path | str) -> Splits:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return Splits(
        tuple(make_key(r["split"], r["problem_id"]) for r in data["train"]),
        tuple(make_key(r["split"], r["problem_id"]) for r in data["val"]),
        int(data["split_seed"]),
    )


def atomic_write_json(path: Path, data: object) -> None:
    """tmp file + fsync + rename: a kill leaves either the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- scoring gate


class EvalKeyError(PermissionError, AppsBenchError):
    """An eval problem reached the optimizer's scoring function outside the final evaluation."""


class ScoringGate:
    """Refuses eval keys (and, when splits are given, keys outside train/val) until the
    final evaluation is explicitly opened with `final_evaluation()`."""

    def __init__(self, eval_set: EvalSet, splits: Splits | None = None) -> None:
        self.eval_set = eval_set
        self._allowed = None if splits is None else frozenset(splits.train) | frozenset(splits.val)
        self._final = False

    @contextmanager
    def final_evaluation(self) -> Iterator[None]:
        self._final = True
        try:
            yield
        finally:
            self._final = False

    def check(self, keys: Iterable[ProblemKey]) -> None:
        keys = [(k[0], k[1]) for k in keys]
        if self._final:
            return
        bad = sorted({k for k in keys if k in self.eval_set.keys}, key=_sort_key)
        if bad:
            raise EvalKeyError(
                f"refusing to score eval problems {[key_str(k) for k in bad[:10]]} during optimization: "
                "eval IDs are only scored in the final evaluation cell; check the pool source and split manifest"
            )
        if self._allowed is not None:
            stray = sorted({k for k in keys if k not in self._allowed}, key=_sort_key)
            if stray:
                raise EvalKeyError(f"refusing to score {[key_str(k) for k in stray[:10]]}: not in this run's train/val manifest")


# --------------------------------------------------------------------------- budgets


class BudgetExhausted(RuntimeError, AppsBenchError):
    """A new batch was asked for after a hard cap was reached."""


@dataclass
class Budget:
    """Hard caps in rollouts and tokens; task and optimizer tokens are counted apart.

    `admit(n)` is called before a batch of n rollouts that are not yet charged: it raises
    BudgetExhausted when any cap is already reached; otherwise the whole batch may run,
    so the overshoot is at most one batch (reported by `overshoot()`). None = no cap.
    Charged amounts are what the algorithm consumed (a rollout replayed from the cache
    after a resume is charged as it was the first time); `fresh_*` is what was actually
    spent in this process.
    """

    max_rollouts: int | None = None
    max_task_tokens: int | None = None
    max_optimizer_tokens: int | None = None
    rollouts: int = 0
    task_tokens: int = 0
    optimizer_tokens: int = 0
    optimizer_calls: int = 0
    replayed_task_tokens: int = 0  # answers replayed from the run's cache (partial re-runs): not charged
    fresh_rollouts: int = 0
    fresh_task_tokens: int = 0
    fresh_optimizer_tokens: int = 0
    batches: int = 0
    largest_batch: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def of(cls, caps: BudgetParams) -> Budget:
        """The caps of `optimizer.params.budget` (config/validate.py has checked them: >= 1 or null)."""
        return cls(caps.rollouts, caps.tokens, caps.optimizer_tokens)

    def exhausted_by(self) -> str | None:
        if self.max_rollouts is not None and self.rollouts >= self.max_rollouts:
            return f"rollouts {self.rollouts}/{self.max_rollouts}"
        if self.max_task_tokens is not None and self.task_tokens >= self.max_task_tokens:
            return f"task tokens {self.task_tokens}/{self.max_task_tokens}"
        if self.max_optimizer_tokens is not None and self.optimizer_tokens >= self.max_optimizer_tokens:
            return f"optimizer tokens {self.optimizer_tokens}/{self.max_optimizer_tokens}"
        return None

    @property
    def exhausted(self) -> bool:
        return self.exhausted_by() is not None

    def admit(self, n_rollouts: int) -> None:
        with self._lock:
            why = self.exhausted_by()
            if why is not None and n_rollouts > 0:
                raise BudgetExhausted(f"budget exhausted ({why}); refusing a batch of {n_rollouts} rollouts")
            if n_rollouts > 0:
                self.batches += 1
                self.largest_batch = max(self.largest_batch, n_rollouts)

    def charge_rollout(self, task_tokens: int, *, fresh: bool, replayed: int = 0) -> None:
        """`task_tokens`: what the rollout spent; `replayed`: what its replayed answers would have cost (apart)."""
        with self._lock:
            self.rollouts += 1
            self.task_tokens += int(task_tokens)
            self.replayed_task_tokens += int(replayed)
            if fresh:
                self.fresh_rollouts += 1
                self.fresh_task_tokens += int(task_tokens)

    def charge_optimizer(self, tokens: int, *, fresh: bool) -> None:
        with self._lock:
            self.optimizer_calls += 1
            self.optimizer_tokens += int(tokens)
            if fresh:
                self.fresh_optimizer_tokens += int(tokens)

    def remaining_rollouts(self) -> int | None:
        return None if self.max_rollouts is None else max(0, self.max_rollouts - self.rollouts)

    def overshoot(self) -> dict[str, int]:
        """How far past each cap the run went (0 when within it)."""

        def over(used: int, cap: int | None) -> int:
            return 0 if cap is None else max(0, used - cap)

        return {
            "rollouts": over(self.rollouts, self.max_rollouts),
            "task_tokens": over(self.task_tokens, self.max_task_tokens),
            "optimizer_tokens": over(self.optimizer_tokens, self.max_optimizer_tokens),
        }

    _FIELDS = (
        "max_rollouts",
        "max_task_tokens",
        "max_optimizer_tokens",
        "rollouts",
        "task_tokens",
        "optimizer_tokens",
        "optimizer_calls",
        "replayed_task_tokens",
        "fresh_rollouts",
        "fresh_task_tokens",
        "fresh_optimizer_tokens",
        "batches",
        "largest_batch",
    )

    def to_json(self) -> JsonObject:
        d = {k: getattr(self, k) for k in self._FIELDS}
        d["overshoot"] = self.overshoot()
        return d


# --------------------------------------------------------------------------- paired seeds


def request_seed(run_seed: int, key: ProblemKey) -> int:
    """The request seed of one problem in one run: the same for every candidate (paired
    comparisons), different across problems, reproducible across processes."""
    digest = hashlib.sha256(f"{int(run_seed)}|{key[0]}|{key[1]}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**31 - 1)
