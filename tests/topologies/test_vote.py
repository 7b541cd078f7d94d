"""The most-common-program rule (docs/topologies.md): normalisation, ties, agents without code."""

from __future__ import annotations

from apps_bench.topologies.vote import most_common_program, normalize_program
from apps_bench.types import Candidate

A = "n = int(input())\nprint(n * 2)\n"
A_REFORMATTED = '''"""Doubles n."""
# read the number
n=int( input() )   # n
print(n*2)
'''
B = "n = int(input())\nprint(n + n)\n"
C = "print(int(input()) ** 2)\n"


def test_formatting_comments_and_docstrings_are_ignored():
    assert normalize_program(A) == normalize_program(A_REFORMATTED)
    fn_doc = 'def f(x):\n    """doc"""\n    return x\nprint(f(1))\n'
    fn_plain = "def f(x):\n    return x  # same\n\n\nprint(f(1))\n"
    assert normalize_program(fn_doc) == normalize_program(fn_plain)


def test_different_programs_stay_apart():
    assert normalize_program(A) != normalize_program(B)
    # a string that is not a docstring is code, not a comment
    assert normalize_program("x = 1\n'a'\n") != normalize_program("x = 1\n")


def test_docstring_only_body_still_parses():
    src = 'class S:\n    """only a docstring"""\n'
    assert normalize_program(src) == normalize_program("class S:\n    pass\n")


def test_largest_group_wins_and_first_members_text_is_returned():
    cands = [Candidate("a0", C), Candidate("a1", A_REFORMATTED), Candidate("a2", A), Candidate("a3", B)]
    vote, program = most_common_program(cands)
    assert vote.group_sizes == (1, 2, 1)
    assert vote.group_members == (("a0",), ("a1", "a2"), ("a3",))
    assert vote.winner == 1
    assert program == A_REFORMATTED  # the first member's own text is what gets judged


def test_tie_goes_to_group_whose_first_member_came_first():
    cands = [Candidate("a0", B), Candidate("a1", A), Candidate("a2", A), Candidate("a3", B)]
    vote, program = most_common_program(cands)
    assert vote.group_sizes == (2, 2)
    assert vote.winner == 0 and program == B
    # reversed agent order flips the winner: the rule is deterministic, not lucky
    reordered = [cands[1], cands[0], cands[3], cands[2]]
    vote2, program2 = most_common_program(reordered)
    assert vote2.group_sizes == (2, 2) and vote2.group_members == (("a1", "a2"), ("a0", "a3"))
    assert vote2.winner == 0 and program2 == A


def test_agents_without_code_do_not_vote():
    cands = [Candidate("a0", None), Candidate("a1", "  \n"), Candidate("a2", B), Candidate("a3", None)]
    vote, program = most_common_program(cands)
    assert vote.group_sizes == (1,)
    assert vote.group_members == (("a2",),)
    assert program == B


def test_nobody_has_code():
    vote, program = most_common_program([Candidate("a0", None), Candidate("a1", None)])
    assert program is None and vote.winner is None and vote.group_sizes == ()


def test_unparsable_programs_group_only_with_identical_text():
    bad = "def f(:\n    return 1\n"
    cands = [Candidate("a0", bad), Candidate("a1", bad + "\n\n"), Candidate("a2", A)]
    vote, program = most_common_program(cands)
    assert vote.group_sizes == (2, 1) and program == bad
    assert normalize_program(bad) != normalize_program(A)
