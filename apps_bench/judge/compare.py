"""APPS output comparison, profile `seed` (docs/judge.md), as pure functions.

These run in the judge process only, on plain data the sandbox sent back (a
program's stdout, or its return value decoded from JSON), never inside the child
and never on user objects. Each returns (passed, which rule decided) so a record
can say why a test passed or failed.

Deliberate choices, all pinned by tests/judge_cases.json:
- booleans are not numbers: True never equals 1 and never takes part in the
  numeric tolerance (a bool-returning problem is not passed by returning 1);
- a numeric token that overflows a float (a literal over ~1e308) is not compared
  with the tolerance: two different huge numbers would both become inf;
- set comparisons apply to lists only, never to strings (set("ab") == set("ba")).
"""

from __future__ import annotations

import math
import re
from typing import Hashable, TypeGuard

RTOL = 1e-5
ATOL = 1e-6
ROUND_PLACES = 3

_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")


# ---------------------------------------------------------------- standard input


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().split("\n")]


def _numeric_tokens(text: str) -> list[float] | None:
    out: list[float] = []
    for tok in text.split():
        if not _NUMBER.match(tok):
            return None
        v = float(tok)
        if math.isinf(v):  # a finite literal too large for a float: refuse the tolerance
            return None
        out.append(v)
    return out


def _allclose(actual: list[float], expected: list[float]) -> bool:
    # numpy.allclose(actual, expected, rtol, atol): |a - e| <= atol + rtol * |e|, elementwise
    return all(abs(a - e) <= ATOL + RTOL * abs(e) for a, e in zip(actual, expected))


def compare_stdin(output: str, expected: object) -> tuple[bool, str]:
    """A stdin test's cascade: strip-equal, then line by line, then all-numeric tokens within tolerance."""
    if isinstance(expected, list):
        expected = "\n".join(str(e) for e in expected)
    expected = str(expected)
    if output.strip() == expected.strip():
        return True, "exact"
    if _lines(output) == _lines(expected):
        return True, "lines"
    got, want = _numeric_tokens(output), _numeric_tokens(expected)
    if got is not None and want is not None and got and len(got) == len(want) and _allclose(got, want):
        return True, "numeric"
    return False, "stdout differs"


# ---------------------------------------------------------------- call-based


def _is_number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def equal(a: object, b: object) -> bool:
    """Deep equality of JSON-like values where a bool only equals a bool (1 == 1.0 still holds)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, dict)) or isinstance(b, (list, tuple, dict)):
        return False
    try:
        return bool(a == b) and type(a == b) is bool
    except Exception:  # noqa: BLE001 - a program's value whose == raises is simply not equal
        return False


def _close_number(a: int | float, e: int | float) -> bool:
    if isinstance(a, int) and isinstance(e, int):
        if a == e:
            return True
    try:
        fa, fe = float(a), float(e)
    except OverflowError:
        return False
    if math.isnan(fa) or math.isnan(fe):
        return False
    if math.isinf(fa) or math.isinf(fe):
        return fa == fe
    return abs(fa - fe) <= ATOL + RTOL * abs(fe)


def close(actual: object, expected: object) -> bool:
    """Numerically close: two numbers, or equal-shape (nested) lists of numbers. Booleans are not numbers."""
    if _is_number(actual) and _is_number(expected):
        return _close_number(actual, expected)
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(actual) == len(expected) and len(actual) > 0 and all(close(a, e) for a, e in zip(actual, expected))
    return False


def hashable(x: object) -> Hashable:
    """A hashable stand-in with the same equality as `equal` (lists -> tuples, dicts -> frozensets, bools tagged)."""
    if isinstance(x, bool):
        return ("__bool__", x)
    if isinstance(x, (list, tuple)):
        return ("__list__", tuple(hashable(v) for v in x))
    if isinstance(x, dict):
        return ("__dict__", frozenset((k, hashable(v)) for k, v in x.items()))
    if isinstance(x, float) and x.is_integer():
        return int(x)  # 1.0 and 1 are the same element, as in Python sets
    try:
        hash(x)
    except TypeError:
        return ("__repr__", repr(x))
    return x


def _rounded(x: object) -> object:
    if _is_number(x):
        try:
            return round(float(x), ROUND_PLACES)
        except OverflowError:
            return x
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def set_equal(actual: object, expected: object) -> bool:
    """Equal as sets: lists/tuples only (never strings)."""
    if not (isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple))):
        return False
    return {hashable(v) for v in actual} == {hashable(v) for v in expected}


def rounded_set_equal(actual: object, expected: object) -> bool:
    """Equal as sets once every number is rounded to 3 places."""
    if not (isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple))):
        return False
    return set_equal(_rounded(actual), _rounded(expected))


def compare_call(value: object, expected: object) -> tuple[bool, str]:
    """A call-based test's cascade, against the expected value and, when it is a one-element list, its element."""
    targets = [expected]
    if isinstance(expected, (list, tuple)) and len(expected) == 1:
        targets.append(expected[0])
    for rule, check in (("equal", equal), ("numeric", close), ("set", set_equal), ("rounded_set", rounded_set_equal)):
        for t in targets:
            if check(value, t):
                return True, rule
    return False, "return value differs"
