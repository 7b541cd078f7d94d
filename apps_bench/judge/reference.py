"""Profile `reference`: the verdict of hendrycks/apps `eval/testing_util.run_test`, as plain-data checks.

The sandbox ran the program the way the original does (apps_bench/sandbox/reference_child.py)
and sent back, per test, the captured stdout or the return value as tagged JSON; here,
in the judge process, the original's comparisons are reproduced on that data, rule by
rule and in the original's order, quirks included:

stdin (the expected value joined with newlines when it is a list):
  1. the captured lines joined, or each line stripped and joined, equal the expected
     text (both stripped);
  2. the lines are exactly `[expected]`;
  3. the lines (then without empty ones) equal the expected text's non-empty lines,
     each stripped;
  4. every line is one number and they are `numpy.allclose` (rtol 1e-5, atol 1e-8) to
     the expected lines;
  5. the set of per-line token sets equals the expected one (token order within a line,
     line order, duplicate lines and blank lines are ignored), or the same with every
     token rounded to 3 decimals.
call: a tuple result becomes a list; passed when `output == expected`, or
  `output == expected[0]` for a non-empty list expected value, or (a list of tuples)
  `[list(x) for x in output] == expected[0]`; Python's `==`, so `True == 1`. An
  expected dict (or a list holding one first) is compared as a one-element list of its
  int-keyed copy. A comparison that raises is `-1`.

Each test yields the original's value (True, False, -1, -2); a program whose process
ended (or an expected output the original cannot even prepare) yields `[-1] * 21`.
"""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any, Callable

from apps_bench.errors import AppsBenchError
from apps_bench.sandbox import RawRun, decode_value
from apps_bench.types import Outcome, Problem, TestResult

GLOBAL_TIMEOUT_RESULTS = (-1,) * 21  # test_one_solution.check_correctness when nothing came back
COMPILE_ERROR = -2
RUNTIME_ERROR = -1


class HarnessCrash(AppsBenchError):
    """The original's run_test would raise here (outside its handlers): the program gets [-1] * 21."""


# ---------------------------------------------------------------- standard input


def _np() -> ModuleType:
    import numpy

    return numpy


def _floats_close(got: list[str], want: list[str]) -> bool:
    try:
        a = [float(e) for e in got]
        b = [float(e) for e in want]
        return len(a) == len(b) and bool(_np().allclose(a, b))
    except Exception:  # noqa: BLE001 - a line that is not one number, or numpy refusing the values
        return False


def _token_sets(lines: list[str]) -> list[set[str]]:
    return [set(tokens) for tokens in (line.split() for line in lines) if tokens]


def _rounded(sets: list[set[str]]) -> set[frozenset[float]]:
    return {frozenset(round(float(t), 3) for t in s) for s in sets}


def compare_stdin(captured: str, expected: object) -> tuple[bool, str]:
    """The original's stdin cascade on a program's captured stdout; (passed, deciding rule)."""
    if isinstance(expected, list):
        try:
            expected = "\n".join(expected)
        except TypeError:
            raise HarnessCrash("expected output is a list of non-strings") from None
    if not isinstance(expected, str):
        raise HarnessCrash(f"expected output is a {type(expected).__name__}, not text")
    out = captured.splitlines()
    want_text = expected.strip()
    if "\n".join(out).strip() == want_text or "\n".join(line.strip() for line in out).strip() == want_text:
        return True, "stripped text"
    if out == [expected]:
        return True, "single line"
    want = [line.strip() for line in expected.split("\n") if line]
    if out == want:
        return True, "lines"
    out = [line for line in out if line]
    if out == want:
        return True, "non-empty lines"
    if _floats_close(out, want):
        return True, "numbers per line (allclose)"
    want_sets = [set(line.split()) for line in want]
    if not out and not want_sets:
        return True, "both empty"
    got_sets = _token_sets(out)
    passed = {frozenset(s) for s in got_sets} == {frozenset(s) for s in want_sets}
    if passed:
        return True, "token sets"
    try:
        if _rounded(got_sets) == _rounded(want_sets):
            return True, "token sets rounded to 3 decimals"
    except (ValueError, OverflowError):
        pass
    return False, "stdout differs"


# ---------------------------------------------------------------- call-based


class Opaque:
    """A return value of a type the sandbox does not send (defined by the program, a generator,
    ...): like an object with the default `__eq__`, it equals nothing and is not subscriptable."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


def from_tagged(x: object) -> object:
    """Rebuild a return value from the sandbox's tagged JSON (sandbox/reference_child.py encode_value)."""
    if isinstance(x, list):
        return [from_tagged(e) for e in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError(f"not a tagged value: {sorted(x)[:3]}")
    ((tag, v),) = x.items()
    if tag == "t":
        return tuple(from_tagged(e) for e in v)
    if tag == "d":
        return {from_tagged(k): from_tagged(e) for k, e in v}
    if tag == "C":
        from collections import Counter

        return Counter({from_tagged(k): from_tagged(e) for k, e in v})
    if tag == "q":
        from collections import deque

        return deque(from_tagged(e) for e in v)
    if tag == "s":
        return {from_tagged(e) for e in v}
    if tag == "f":
        return frozenset(from_tagged(e) for e in v)
    if tag == "j":
        return complex(v[0], v[1])
    if tag == "b":
        return str(v).encode("latin-1")
    if tag == "n":
        np = _np()
        return np.dtype(v[0]).type(v[1])
    if tag == "a":
        np = _np()
        return np.array(v[1], dtype=np.dtype(v[0]))
    if tag == "x":
        return Opaque(str(v))
    raise ValueError(f"unknown tag {tag!r}")


def _int_keyed(expected: Any) -> Any:  # the original indexes whatever it got, inside try
    try:
        if isinstance(expected, dict):
            expected = [{int(k): v for k, v in expected.items()}]
    except Exception:  # noqa: BLE001 - the original APPS judge's bare except: keys that are not ints stay as they are
        pass
    try:
        if isinstance(expected[0], dict):
            expected = [{int(k): v for k, v in expected[0].items()}]
    except Exception:  # noqa: BLE001 - the original APPS judge's bare except: keys that are not ints stay as they are
        pass
    return expected


def compare_call(output: Any, expected: Any) -> tuple[object, str]:  # as _int_keyed: the original indexes what it got
    """The original's call-based check; (its value: a bool-like or -1, deciding rule)."""
    expected = _int_keyed(expected)
    try:
        if isinstance(output, tuple):
            output = list(output)
        result = output == expected
        rule = "equal"
        if isinstance(expected, list) and expected:
            result = result or (output == expected[0])
            rule = "equal" if _truthy(output == expected) else "equal to expected[0]"
        try:
            if isinstance(output[0], tuple):
                result = result or ([list(x) for x in output] == expected[0])
        except Exception:  # noqa: BLE001 - the original APPS judge's bare except: a value that is not a list of tuples
            pass
        return result, rule
    except Exception as e:  # noqa: BLE001 - e.g. numpy refusing the truth value of an array
        return RUNTIME_ERROR, f"comparison raised {type(e).__name__}"


def _truthy(x: object) -> bool:
    try:
        return bool(x)
    except Exception:  # noqa: BLE001 - a program's value whose truth raises counts as false, as in the original
        return False


def passes(value: object) -> bool:
    """The strict check of the APPS eval on one result: numpy values unwrapped, then `> 0`."""
    if type(value) is bool or type(value) is int:  # nearly always: no numpy needed
        return value > 0
    try:
        np = _np()
        if isinstance(value, np.ndarray):
            value = value.item(0)
        if isinstance(value, np.bool_):
            value = bool(value)
        return bool(np.asarray(value) > 0)
    except Exception:  # noqa: BLE001 - a program's value that numpy refuses to compare counts as false, as in the original
        return False


def plain(value: object) -> bool | int:
    """A result value as JSON for records (True/False/-1/-2)."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (-1, -2)):
        return value
    return passes(value)


# ---------------------------------------------------------------- one test


_FAIL_OUTCOME = {
    "timeout": Outcome.TIMEOUT,
    "runtime_error": Outcome.RUNTIME_ERROR,
    "memory_limit": Outcome.MEMORY_LIMIT,
}


def judge_test(problem: Problem, raw: RawRun, clip: Callable[..., str]) -> tuple[TestResult, object]:
    """(TestResult, the original's value) for one test the sandbox ran in reference mode.

    Raises HarnessCrash when the original would have lost the whole program ([-1] * 21).
    """
    seconds = float(raw.seconds or 0.0)
    if raw.fatal:
        raise HarnessCrash(f"the program's process ended during test {raw.index} ({raw.status}: {raw.detail})")
    if raw.status == "compile_error":
        return TestResult(raw.index, Outcome.COMPILE_ERROR, seconds, clip(raw.detail)), COMPILE_ERROR
    if raw.late:  # ran past the alarm (as the worker measured it) and finished: where the original's alarm
        # went off and was swallowed, its output held "alarm went off" and failed; a program that silenced
        # the alarm fails too (no pass bought by tampering with its own process)
        return TestResult(raw.index, Outcome.TIMEOUT, seconds, clip(raw.detail)), False
    if raw.status in _FAIL_OUTCOME:
        detail = "; ".join(x for x in (raw.detail, clip(raw.stderr or "")) if x)
        return TestResult(raw.index, _FAIL_OUTCOME[raw.status], seconds, clip(detail)), RUNTIME_ERROR
    if raw.status == "output_limit":  # larger than any expected output the cap allows
        return TestResult(raw.index, Outcome.OUTPUT_LIMIT, seconds, clip(raw.detail)), False
    if raw.status != "ok":
        return TestResult(raw.index, Outcome.SANDBOX_ERROR, seconds, clip(f"sandbox status {raw.status!r}: {raw.detail}")), None
    outputs = problem.tests.raw_outputs or problem.tests.outputs
    if not 0 <= raw.index < len(outputs):
        return TestResult(raw.index, Outcome.SANDBOX_ERROR, seconds, f"sandbox reported test {raw.index} of {len(outputs)}"), None
    expected = copy.deepcopy(outputs[raw.index])  # the comparison must not touch the problem's copy
    if problem.tests.mode == "stdin":
        got = raw.stdout or ""
        ok, rule = compare_stdin(got, expected)
        detail = rule if ok else f"{rule}; got {clip(got, 120)!r}"
        return TestResult(raw.index, Outcome.PASS if ok else Outcome.WRONG_ANSWER, seconds, detail), ok

    if raw.value_json is None:
        return TestResult(raw.index, Outcome.SANDBOX_ERROR, seconds, "no return value reported"), None
    try:
        output = from_tagged(decode_value(raw.value_json))
    except (ValueError, TypeError, RecursionError) as e:
        return TestResult(raw.index, Outcome.SANDBOX_ERROR, seconds, f"undecodable return value: {e}"), None
    value, rule = compare_call(output, expected)
    if isinstance(value, int) and not isinstance(value, bool) and value == RUNTIME_ERROR:
        return TestResult(raw.index, Outcome.RUNTIME_ERROR, seconds, rule), RUNTIME_ERROR
    ok = passes(value)
    detail = rule if ok else f"differs; got {clip(raw.value_json, 120)}"
    return TestResult(raw.index, Outcome.PASS if ok else Outcome.WRONG_ANSWER, seconds, detail), plain(value)
