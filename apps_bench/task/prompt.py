"""Frame a problem the way the APPS paper and common harnesses do.

QUESTION:, the problem text, the starter code (call-based problems) in a python
fence, the format directive, then ANSWER:. The directive follows the tests'
mode (fn_name present -> call-based), not the presence of starter code.
"""

from __future__ import annotations

from apps_bench.types import Problem

STDIN_DIRECTIVE = "Use Standard Input format."
CALL_DIRECTIVE = "Use Call-Based format."


def frame(problem: Problem) -> str:
    """The prompt text for one problem (identical for every topology and model)."""
    parts = ["QUESTION:", problem.question.strip("\n"), ""]
    starter = problem.starter_code.strip("\n")
    if problem.tests.mode == "call":
        if starter.strip():
            parts += ["```python", starter, "```", ""]
        parts.append(CALL_DIRECTIVE)
    else:
        parts.append(STDIN_DIRECTIVE)
    parts += ["", "ANSWER:", ""]
    return "\n".join(parts)
