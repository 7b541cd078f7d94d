"""The most common program: how independent and decentralized teams pick their submission.

Only the agents' own programs are compared; hidden tests never choose. Programs are
grouped after a normalisation that ignores formatting, comments and docstrings (the
AST re-printed), the largest group wins, and a tie goes to the group whose first member
came first in agent order, so the choice is deterministic and explainable from the record.
"""

from __future__ import annotations

import ast
from typing import Sequence

from apps_bench.task.syntax import parse
from apps_bench.types import Candidate, Vote

_DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


class _DropDocstrings(ast.NodeTransformer):
    """Remove the leading string-literal statement of modules, classes and functions."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if isinstance(node, _DOC_OWNERS):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or ([] if isinstance(node, ast.Module) else [ast.Pass()])
        return node


def normalize_program(program: str) -> str:
    """Canonical text of a program for vote grouping.

    Valid Python is parsed, stripped of docstrings and re-printed (comments and
    formatting vanish with the round trip). Text that does not parse is compared by
    its non-blank lines with trailing spaces removed, so it can still group with an
    identical broken program but never with a valid one.
    """
    try:
        tree = parse(program)  # under the process's one AST lock (task/syntax.py)
    except (SyntaxError, ValueError):
        lines = [ln.rstrip() for ln in program.strip("\n").splitlines() if ln.strip()]
        return "# unparsable\n" + "\n".join(lines)
    tree = _DropDocstrings().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def most_common_program(candidates: Sequence[Candidate]) -> tuple[Vote, str | None]:
    """Vote over candidates (in agent order); returns the record and the winning program.

    Agents without a program do not vote. The winning program is the first member's
    own text (not the normalised one), so what is judged is what an agent wrote.
    """
    keys: list[str] = []
    members: list[list[str]] = []
    first_program: list[str] = []
    normalized: dict[str, str] = {}  # agents often write the very same text: parse it once
    for cand in candidates:
        if cand.program is None or not cand.program.strip():
            continue
        key = normalized.get(cand.program)
        if key is None:
            key = normalized[cand.program] = normalize_program(cand.program)
        if key in keys:
            members[keys.index(key)].append(cand.agent)
        else:
            keys.append(key)
            members.append([cand.agent])
            first_program.append(cand.program)
    sizes = tuple(len(m) for m in members)
    if not sizes:
        return Vote(group_sizes=(), group_members=(), winner=None), None
    # max() returns the first maximal element: ties go to the group seen first.
    winner = max(range(len(sizes)), key=lambda i: sizes[i])
    vote = Vote(group_sizes=sizes, group_members=tuple(tuple(m) for m in members), winner=winner)
    return vote, first_program[winner]
