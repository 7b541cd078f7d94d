"""The texts a flow hands to its agents, shared by framework siblings.

Siblings must differ only in their framework, so the glue around the role prompts
(how earlier stages, peers' answers and a manager's instruction are shown) is
built here, once, and every runner of a flow uses the same builders. The role
prompts themselves live in config (`conf/topology/shared/*.yaml`).
"""

from __future__ import annotations

from typing import Sequence

DELEGATE_TOOL = "delegate"


def stage_input(prompt: str, earlier: Sequence[tuple[str, str]]) -> str:
    """Sequential: the framed problem, then each earlier stage's output in order."""
    parts = [prompt]
    for role, output in earlier:
        parts.append(f"### Output of the {role} stage\n\n{output.strip()}")
    return "\n\n".join(parts)


def worker_input(prompt: str, instruction: str) -> str:
    """Centralized: a worker sees only the problem and the manager's instruction."""
    return f"{prompt}\n\n### Instruction from the manager\n\n{instruction.strip()}"


def debate_input(prompt: str, round: int, own_previous: str | None, peers_previous: Sequence[tuple[str, str]]) -> str:
    """Decentralized: round 0 is the problem alone; later rounds add the agent's own and its peers' previous answers."""
    if round == 0:
        return prompt
    parts = [prompt]
    if own_previous is not None:
        parts.append(f"### Your answer from round {round - 1}\n\n{own_previous.strip() or '(no answer)'}")
    for peer, answer in peers_previous:
        parts.append(f"### Answer of {peer} from round {round - 1}\n\n{answer.strip() or '(no answer)'}")
    parts.append(f"This is round {round}. Give your revised answer.")
    return "\n\n".join(parts)


def delegate_description(workers: Sequence[str]) -> str:
    return (
        "Hand a task to one of your workers and get its reply. The worker sees the problem and "
        f"your instruction only. Workers: {', '.join(workers)}."
    )


def delegate_parameters(workers: Sequence[str]) -> dict:
    """JSON schema of the manager's `delegate` tool: which worker, and what to do."""
    return {
        "type": "object",
        "properties": {
            "worker": {"type": "string", "enum": list(workers), "description": "the worker to ask"},
            "instruction": {"type": "string", "description": "what the worker should do"},
        },
        "required": ["worker", "instruction"],
    }


def cap_note(kind: str, limit: int) -> str:
    return f"{kind} reached ({limit}); ending with what exists so far"
