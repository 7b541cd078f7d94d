"""The gold server's speaker selection, as AutoGen's SelectorGroupChat asks for it.

Its default selector prompt states the rule twice around the history; gold answers with
the listed name the history mentions last (the worker the manager just addressed), else
the first listed name. (The additive rule that lets centralized_autogen be tested.)
"""

from __future__ import annotations

from apps_bench.models.gold_policy import ProblemIndex, respond

AUTOGEN_PROMPT = """You are in a role play game. The following roles are available:
manager: the manager
analyzer: the analyzer
coder: the coder
edge_case_tester: the edge_case_tester.
Read the following conversation. Then select the next role from ['analyzer', 'coder', 'edge_case_tester'] to play. Only return the role.

user: QUESTION: ...

manager: Instruction for the {worker}: As the {worker}, work on the problem and report back to the manager.

Read the above conversation. Then select the next role from ['analyzer', 'coder', 'edge_case_tester'] to play. Only return the role.
"""


def _select(text: str) -> str:
    reply = respond({"messages": [{"role": "user", "content": text}]}, ProblemIndex([]))
    assert reply.kind == "select"
    return str(reply.content)


def test_selector_picks_the_worker_the_manager_addressed() -> None:
    assert _select(AUTOGEN_PROMPT.format(worker="coder")) == "coder"
    assert _select(AUTOGEN_PROMPT.format(worker="edge_case_tester")) == "edge_case_tester"


def test_selector_without_a_mention_picks_the_first_listed_name() -> None:
    assert _select(AUTOGEN_PROMPT.format(worker="reviewer")) == "analyzer"
    assert _select("Select the next speaker from [b, a].") == "b"


def test_a_name_inside_another_name_is_not_a_mention() -> None:
    # "tester" must not match inside "edge_case_tester"
    text = AUTOGEN_PROMPT.replace("'edge_case_tester'", "'tester'").format(worker="edge_case_tester")
    assert _select(text) == "analyzer"
