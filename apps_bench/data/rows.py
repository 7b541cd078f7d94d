"""One codeparrot/apps row -> one Problem, or a RowError naming why it is unusable.

Parsing is separate from loading so the same rules apply to hub rows, local
JSONL and parquet, and so each skip reason can be tested on a hand-made row.
"""

from __future__ import annotations

import json
import keyword
import sys
from typing import Mapping

from apps_bench.errors import AppsBenchError
from apps_bench.types import JsonObject, Problem, TestSuite

# Skip reasons, counted by the loader and reported with every run.
APPS_SPLITS = ("train", "test")
EVAL_SPLIT = "test"  # APPS reports on its test split; the train split is for fitting (optimizers)

MISSING_ID = "missing_id"
EMPTY_QUESTION = "empty_question"
MISSING_INPUT_OUTPUT = "missing_input_output"
UNPARSABLE_INPUT_OUTPUT = "unparsable_input_output"
MALFORMED_INPUT_OUTPUT = "malformed_input_output"  # not a dict, or inputs/outputs not lists
EMPTY_TESTS = "empty_tests"
UNEQUAL_LENGTHS = "unequal_lengths"
BAD_FN_NAME = "bad_fn_name"  # a call-based row whose fn_name no program could define: the tests cannot be run
SKIP_REASONS = (
    MISSING_ID,
    EMPTY_QUESTION,
    MISSING_INPUT_OUTPUT,
    UNPARSABLE_INPUT_OUTPUT,
    MALFORMED_INPUT_OUTPUT,
    EMPTY_TESTS,
    UNEQUAL_LENGTHS,
    BAD_FN_NAME,
)


class RowError(ValueError, AppsBenchError):
    """A row without usable tests. `reason` is one of SKIP_REASONS (the key skips are counted by)."""

    def __init__(self, reason: str, problem_id: str | None, message: str) -> None:
        super().__init__(f"problem {problem_id}: {message} ({reason})")
        self.reason = reason
        self.problem_id = problem_id


def lift_int_digit_limit() -> None:
    """APPS `input_output` holds integers longer than 4300 digits; json.loads refuses them otherwise."""
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)


def row_id(row: Mapping[str, object]) -> str | None:
    pid = row.get("problem_id")
    if pid is None or (isinstance(pid, str) and not pid.strip()):
        return None
    return str(pid).strip()


def _join(value: object) -> str:
    """stdin mode: a list input or expected output stands for its lines (APPS harness behaviour)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return value if isinstance(value, str) else str(value)


def _parse_json_field(value: object) -> object:
    if isinstance(value, (dict, list)):
        return value  # already decoded (e.g. a parquet file written from decoded rows)
    if not isinstance(value, (str, bytes, bytearray)):  # what json.loads itself says of one
        raise TypeError(f"the JSON object must be str, bytes or bytearray, not {type(value).__name__}")
    return json.loads(value)


def parse_solutions(value: object) -> tuple[str, ...]:
    """Reference solutions: a JSON list of strings, or "" (no solutions). Never a reason to skip."""
    if value is None or value == "":
        return ()
    try:
        sols = _parse_json_field(value)
    except (ValueError, TypeError):
        return ()
    if not isinstance(sols, list):
        return ()
    return tuple(s for s in sols if isinstance(s, str))


def parse_row(row: JsonObject, *, split: str = "test", max_tests_per_row: int = 20) -> Problem:
    """Build a Problem keeping the first `max_tests_per_row` tests (<= 0 keeps all).

    Raises RowError for a row without usable tests; the loader counts the reason.
    """
    lift_int_digit_limit()
    pid = row_id(row)
    if pid is None:
        raise RowError(MISSING_ID, None, "row has no problem_id")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise RowError(EMPTY_QUESTION, pid, "empty question")
    raw_io = row.get("input_output")
    if raw_io is None or (isinstance(raw_io, str) and not raw_io.strip()):
        raise RowError(MISSING_INPUT_OUTPUT, pid, "no input_output")
    try:
        io = _parse_json_field(raw_io)
    except (ValueError, TypeError) as e:
        raise RowError(UNPARSABLE_INPUT_OUTPUT, pid, f"input_output is not valid JSON: {e}") from None
    if not isinstance(io, dict):
        raise RowError(MALFORMED_INPUT_OUTPUT, pid, f"input_output is a {type(io).__name__}, not an object")
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if inputs is None and outputs is None:
        raise RowError(EMPTY_TESTS, pid, "input_output has no inputs/outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise RowError(MALFORMED_INPUT_OUTPUT, pid, "inputs/outputs are not lists")
    if not inputs or not outputs:
        raise RowError(EMPTY_TESTS, pid, "no tests (empty inputs or outputs)")
    if len(inputs) != len(outputs):
        raise RowError(UNEQUAL_LENGTHS, pid, f"{len(inputs)} inputs but {len(outputs)} outputs")
    fn_name = io.get("fn_name") or None
    if fn_name is not None and not isinstance(fn_name, str):
        raise RowError(MALFORMED_INPUT_OUTPUT, pid, "fn_name is not a string")
    if fn_name is not None and (not fn_name.isidentifier() or keyword.iskeyword(fn_name)):
        raise RowError(BAD_FN_NAME, pid, f"fn_name {fn_name!r} is not a Python identifier, so no program can define it")
    n_available = len(inputs)
    if max_tests_per_row > 0:
        inputs, outputs = inputs[:max_tests_per_row], outputs[:max_tests_per_row]
    ins: tuple[object, ...]
    outs: tuple[object, ...]
    if fn_name:
        # Call-based: each input is the positional-argument list; outputs stay as decoded JSON.
        ins = tuple(a if isinstance(a, list) else [a] for a in inputs)
        outs = tuple(outputs)
    else:
        ins = tuple(_join(a) for a in inputs)
        outs = tuple(_join(o) for o in outputs)
    return Problem(
        id=pid,
        question=question,
        tests=TestSuite(
            inputs=ins,
            outputs=outs,
            fn_name=fn_name,
            n_available=n_available,
            raw_inputs=tuple(inputs),
            raw_outputs=tuple(outputs),
        ),
        starter_code=row.get("starter_code") or "",
        difficulty=row.get("difficulty") or "",
        url=row.get("url") or "",
        solutions=parse_solutions(row.get("solutions")),
        split=split,
    )


def split_named_by(path: str) -> str | None:
    """The APPS split a rows file's name says it holds (`train.jsonl`, `train_mini150.jsonl`,
    `test-0-49.jsonl`), or None."""
    import re
    from pathlib import Path

    name = Path(path).name.lower()
    return next((s for s in APPS_SPLITS if re.match(rf"{s}(?![a-z])", name)), None)
