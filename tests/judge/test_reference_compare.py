"""Profile `reference`'s pieces as pure functions: the stdin wrapper, the comparisons, the
tagged return values. (Whether they add up to the original's verdicts is
test_reference_parity.py's job, against recorded verdicts.)"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque

import numpy as np
import pytest

from apps_bench import types as T
from apps_bench.judge.reference import HarnessCrash, Opaque, compare_call, compare_stdin, from_tagged, passes
from apps_bench.sandbox.reference_child import encode_value, wrap_stdin_program


def test_wrapper_keeps_leading_imports_and_indents_the_rest_with_a_tab() -> None:
    src = "import sys\nfrom math import *\nn = int(input())\nimport os\nprint(n)"
    assert wrap_stdin_program(src) == (
        "import sys\nfrom math import *\nstdin = sys.stdin\nstdout = sys.stdout\ndef code():\n"
        "\tn = int(input())\n\timport os\n\tprint(n)\n"
    )
    assert wrap_stdin_program("") == "stdin = sys.stdin\nstdout = sys.stdout\ndef code():\n\t\n"
    assert "def code" not in wrap_stdin_program("import sys\nimport math")
    assert wrap_stdin_program("x = '''a\nb'''").endswith("\tx = '''a\n\tb'''\n")  # inside strings too


@pytest.mark.parametrize(
    "captured,expected,passed",
    [
        ("3\n", "3\n", True),
        ("  3  \n\n", "3", True),
        ("1 2 3\n", "3 2 1\n", True),  # token order within a line
        ("b\na\n", "a\nb\n", True),  # line order
        ("a\na\nb\n", "a\nb\n", True),  # duplicate lines
        ("a\n\n\nb\n", "a\nb\n", True),  # blank lines
        ("1.0000001\n", "1.0\n", True),  # allclose per line
        ("1.001\n", "1.0\n", False),
        ("0.1234 5\n", "0.12341 5\n", True),  # tokens rounded to 3 decimals
        ("1 2\n", "1\n2\n", False),  # tokens of one line are one set
        ("", "", True),
        ("x\n", ["x"], True),  # a list expected output is its lines
        ("a\nb\n", "a\n  \nb\n", False),  # a whitespace-only expected line is an empty token set
    ],
)
def test_stdin_cascade(captured: str, expected, passed: bool) -> None:
    assert compare_stdin(captured, expected)[0] is passed


def test_an_expected_output_the_original_cannot_prepare_loses_the_program() -> None:
    for bad in ([3, 7], 5, None):
        with pytest.raises(HarnessCrash):
            compare_stdin("3\n7\n", bad)


@pytest.mark.parametrize(
    "output,expected,passed",
    [
        (1, True, True),  # Python's ==: True == 1
        (True, [1], True),
        (2.0, [2], True),
        ([1, 2], [[1, 2]], True),  # expected[0] of any non-empty list
        ([1, 2], [1, 2], True),
        ((1, 2), [1, 2], True),  # a tuple result is a list
        ([(1, 2), (3, 4)], [[[1, 2], [3, 4]]], True),  # list of tuples against expected[0]
        ([(1, 2), (3, 4)], [[1, 2], [3, 4]], False),
        ({1: "x"}, {"1": "x"}, True),  # expected dict keys made int
        ({"1": "x"}, {"1": "x"}, False),
        ({1, 2}, [[1, 2]], False),
        (None, [None], True),
        (Opaque("Yes"), [1], False),
    ],
)
def test_call_comparison(output, expected, passed: bool) -> None:
    assert passes(compare_call(output, expected)[0]) is passed


def test_a_comparison_that_raises_is_a_runtime_error() -> None:
    assert compare_call(np.array([1, 2]), [[1, 2]])[0] == -1  # numpy refuses `or` on an array


@pytest.mark.parametrize(
    "value",
    [
        1,
        True,
        2.5,
        "s",
        None,
        [1, (2, 3)],
        (1,),
        {1: "a", (2, 3): [4]},
        {1, 2},
        frozenset({3}),
        deque([1]),
        Counter("aab"),
        OrderedDict(a=1),
        b"\x00\xff",
        1 + 2j,
        np.int64(7),
        np.float32(0.5),
        np.bool_(True),
        np.array([[1, 2], [3, 4]]),
    ],
)
def test_return_values_keep_what_eq_can_tell_apart(value) -> None:
    import json

    back = from_tagged(json.loads(json.dumps(encode_value(value))))
    assert type(back) is (dict if type(value) is OrderedDict else type(value))
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and (back == value).all()
    else:
        assert back == value


def test_objects_of_the_programs_own_types_equal_nothing() -> None:
    class Yes:
        def __eq__(self, other):
            return True

    class I(int):
        pass

    for v in (Yes(), I(1), iter([1]), map(int, "1")):
        back = from_tagged(encode_value(v))
        assert isinstance(back, Opaque) and not passes(compare_call(back, [1])[0])


def test_reference_results_are_recorded_only_by_the_reference_profile() -> None:
    r = (T.TestResult(0, T.Outcome.PASS),)
    assert "reference_results" not in T.Verdict("1", True, 1, 1, 1, r, "seed").to_json()
    assert (
        T.Verdict("1", False, 1, 1, 0, r, "reference", reference_results=(-1,) * 21).to_json()["reference_results"] == [-1] * 21
    )
