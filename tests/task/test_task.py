"""frame(): QUESTION / (starter code in a python fence for call-based) / format directive / ANSWER."""

from __future__ import annotations

from apps_bench import types as T
from apps_bench.data import DEMO_PROBLEMS, load_problems
from apps_bench.task import CALL_DIRECTIVE, STDIN_DIRECTIVE, frame


def _problem(fn_name=None, starter=""):
    return T.Problem(id="1", question="Add two numbers.\n", tests=T.TestSuite(("1 2",), ("3",), fn_name), starter_code=starter)


def test_stdin_frame_exact():
    assert frame(_problem()) == "QUESTION:\nAdd two numbers.\n\nUse Standard Input format.\n\nANSWER:\n"


def test_call_frame_exact():
    p = _problem("add", "\nclass Solution:\n    def add(self, a: int, b: int) -> int:\n        ")
    assert frame(p) == (
        "QUESTION:\nAdd two numbers.\n\n"
        "```python\nclass Solution:\n    def add(self, a: int, b: int) -> int:\n        \n```\n\n"
        "Use Call-Based format.\n\nANSWER:\n"
    )


def test_call_frame_without_starter_code_has_no_empty_fence():
    text = frame(_problem("add", ""))
    assert "```" not in text and CALL_DIRECTIVE in text


def test_directive_follows_fn_name_not_starter_code():
    # a stdin problem with starter code (HackerRank-style) is still standard input
    text = frame(_problem(None, "def helper():\n    pass"))
    assert STDIN_DIRECTIVE in text and CALL_DIRECTIVE not in text


def test_demo_problems_frame_both_modes():
    stdin, call = DEMO_PROBLEMS
    assert frame(stdin).startswith("QUESTION:\n") and STDIN_DIRECTIVE in frame(stdin)
    t = frame(call)
    assert CALL_DIRECTIVE in t and "def topKFrequent" in t
    assert "```python\n" + call.starter_code.strip("\n") + "\n```" in t


def test_real_call_based_row(apps_data_dir):
    from conftest import compose_cell

    res = load_problems(
        compose_cell("dataset=apps_train", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}").dataset, only=["2404"]
    )
    (p,) = res.problems
    t = frame(p)
    assert t.startswith("QUESTION:\n" + p.question.strip("\n"))
    assert "```python\nclass Solution:\n    def findKthPositive(self, arr: List[int], k: int) -> int:" in t
    assert t.endswith("Use Call-Based format.\n\nANSWER:\n")
