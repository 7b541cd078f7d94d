"""The seed profile's comparison cascades against a golden file of (mode, output, expected, verdict) cases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from apps_bench.judge.compare import compare_call, compare_stdin, equal, hashable, set_equal

sys.set_int_max_str_digits(0)
CASES = json.loads((Path(__file__).parents[1] / "judge_cases.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['mode']}-{i}-{c['why'][:40]}" for i, c in enumerate(CASES)])
def test_golden_case(case):
    fn = compare_stdin if case["mode"] == "stdin" else compare_call
    ok, rule = fn(case["output"], case["expected"])
    assert ok is case["verdict"], f"{case['why']}: decided by {rule!r}"


def test_golden_file_covers_both_modes_and_both_verdicts():
    kinds = {(c["mode"], c["verdict"]) for c in CASES}
    assert kinds == {("stdin", True), ("stdin", False), ("call", True), ("call", False)}


def test_stdin_rules_are_tried_in_order():
    assert compare_stdin("x\n", "x") == (True, "exact")
    assert compare_stdin("x  \ny", "x\ny") == (True, "lines")
    assert compare_stdin("1.0000001", "1") == (True, "numeric")
    assert compare_stdin("2", "1")[0] is False


def test_call_rules_are_tried_in_order():
    assert compare_call([1, 2], [[1, 2]]) == (True, "equal")
    assert compare_call(1.0000001, [1]) == (True, "numeric")
    assert compare_call([2, 1], [[1, 2]]) == (True, "set")
    assert compare_call([0.3331, 2], [[2, 0.333]]) == (True, "rounded_set")


def test_bool_equality_is_typed_but_numbers_are_not():
    assert equal(1, 1.0) and not equal(True, 1) and not equal([0], [False])
    assert hashable(True) != hashable(1) and hashable(1.0) == hashable(1)


def test_set_equality_never_applies_to_strings():
    assert not set_equal("ab", "ba")
    assert set_equal(["a", "b"], ("b", "a"))
