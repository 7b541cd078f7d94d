"""Parsing Python source from many solver threads at once, safely.

CPython 3.11 keeps the recursion counter of its AST constructor in interpreter-wide
state, not per thread: two threads turning source into `ast` objects at the same time
(a garbage collection inside one of them runs Python code and lets the other in) make it
raise `SystemError: AST constructor recursion depth mismatch`. A cell with
`concurrency=8` recorded one such error as an infrastructure failure. Every `ast.parse`
of this process therefore runs under one lock: ours (extraction, voting) through
`parse`, and everybody else's (the 3.11 `traceback` module parses a line to place its
carets; frameworks parse too) because importing this module routes `ast.parse` itself
through the same lock. Parsing is fast (microseconds to a millisecond), so the lock costs
nothing a cell can measure.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_LOCK = threading.RLock()  # re-entrant: a finalizer run by the collector may parse on the same thread
_UNLOCKED_PARSE = getattr(ast.parse, "__wrapped__", ast.parse)


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec", **kwargs: Any) -> ast.AST:
    """`ast.parse`, one thread at a time."""
    with _LOCK:
        return _UNLOCKED_PARSE(source, filename, mode, **kwargs)


parse.__wrapped__ = _UNLOCKED_PARSE  # type: ignore[attr-defined]


def serialize_ast_parse() -> None:
    """Make `ast.parse` (as every module looks it up: `ast.parse(...)`) the locked `parse`. Idempotent."""
    if ast.parse is not parse:
        ast.parse = parse  # type: ignore[assignment]


serialize_ast_parse()
