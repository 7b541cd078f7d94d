"""Parsing, voting and extraction from many solver threads at once (CPython 3.11's AST race).

Eight threads extract programs from replies, vote over candidates and format tracebacks
(3.11's `traceback` parses a line to place its carets), while a ninth makes cyclic garbage
whose finalizers run Python code: a collection inside one thread's parse then lets another
thread in, which is how `SystemError: AST constructor recursion depth mismatch` happened in
a `concurrency=8` cell. With the process's one AST lock (apps_bench/task/syntax.py) no call
fails; the control shows the same workload does raise the SystemError without the lock.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import traceback

from apps_bench.task.extract import extract_program
from apps_bench.topologies.vote import most_common_program
from apps_bench.types import Candidate

THREADS = 8
ROUNDS = 6  # per thread and batch
GARBAGE = 200_000  # most garbage objects made per batch


class _Cycle:
    """Cyclic garbage whose finalizer runs bytecode: the collector runs it inside whatever allocates."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        total = 0
        for i in range(30):
            total += i


def _program(tag: str) -> str:
    body = "\n".join(f"    if n > {k}:\n        out.append([(n * {k} + j) for j in range(3) if j or n])" for k in range(12))
    return f'"""{tag}"""\nimport sys\n\ndef solve(n):\n    out = []\n{body}\n    return out\n\nprint(solve(int(input())))\n'


def _failing_traceback() -> str:
    data: dict[str, list[int]] = {"a": [1]}
    try:
        return str(data["a"][0] + data["a"][5] * 2)  # carets under a sub-expression: 3.11 parses the line
    except IndexError:
        return traceback.format_exc()


def _batch(thread: int, batch: int, errors: list[str]) -> None:
    for r in range(ROUNDS):
        tag = f"t{thread} b{batch} r{r}"  # every text new: extraction's parse cache never answers
        try:
            program = extract_program(f"Here it is:\n```python\n{_program(tag)}```\nDone.")
            if program is None:
                errors.append(f"{tag}: no program extracted")
                continue
            vote, winner = most_common_program(
                [
                    Candidate("a", program),
                    Candidate("b", program + "# same\n"),
                    Candidate("c", _program(tag + " other") + "x = 1\n"),
                ]
            )
            if vote.group_sizes != (2, 1) or winner != program:
                errors.append(f"{tag}: vote {vote.group_sizes}")
            if "IndexError" not in _failing_traceback():
                errors.append(f"{tag}: traceback lost its exception")
        except Exception as e:  # noqa: BLE001 - every failure is the finding
            errors.append(f"{tag}: {type(e).__name__}: {e}")
        _Cycle()


def _garbage(stop: threading.Event) -> None:
    for _ in range(GARBAGE):  # bounded: an interpreter left broken by the race must not eat the memory
        if stop.is_set():
            return
        _Cycle()


def _stress(batches: int) -> list[str]:
    """Run up to `batches` batches of THREADS threads (plus a garbage maker); the errors they hit, up to
    the first batch with any (after the SystemError the interpreter's AST state is not sound)."""
    errors: list[str] = []
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    gc.freeze()  # the test process's own heap out of the collections: only the stress's objects are scanned
    gc.set_threshold(50, 5, 5)  # collect often, so finalizers run inside parses
    try:
        for b in range(batches):
            stop = threading.Event()

            maker = threading.Thread(target=_garbage, args=(stop,))
            workers = [threading.Thread(target=_batch, args=(t, b, errors)) for t in range(THREADS)]
            maker.start()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            stop.set()
            maker.join()
            if errors:
                break
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    return errors


def test_parsing_voting_and_extraction_from_many_threads_record_no_error():
    errors = _stress(batches=3)
    assert errors == []


def test_the_same_workload_without_the_lock_raises_the_ast_systemerror(monkeypatch):
    """The control: the stress above is strong enough to find the race when nothing serializes parsing."""
    from apps_bench.task import syntax

    monkeypatch.setattr(syntax, "_LOCK", contextlib.nullcontext())
    errors = _stress(batches=20)
    assert any("SystemError" in e and "recursion depth mismatch" in e for e in errors), errors[:3]
