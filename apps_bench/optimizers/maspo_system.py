"""MASPO's `system` over the protocol's `Evaluator`: runs and execution-grounded comparisons.

Comparing a child prompt with its parent on the same minibatch (same paired seeds):
- global: the final programs' verdicts on the training tests (strict pass, then pass
  fraction; an exact tie = 0.5);
- local / lookahead: the compared agent's (or its immediate successors') outputs. Where
  either output holds a program, execution on the training tests decides (same rule);
  otherwise a text judge is asked in both orders and a disagreement counts as a tie
  (no judge configured: a tie). An agent without successors (or whose successor is the
  vote) takes the global result as lookahead.
- a problem where either run failed for an infrastructure reason (Rollout.error) is a
  tie on every term: a model outage is not evidence against a prompt.
Child runs go through `evaluator.evaluate`. In an optimizer cell the task model sits
behind `replay.ReplayProxy`, so in a chain the stages before the changed agent send
byte-identical requests and are answered from the parent's recorded replies: only the
agent and what follows it reach the model (a partial re-run, counted as one rollout);
in cyclic or hub flows whatever diverges is re-run. An evaluator may instead offer
`evaluate_from(prompt_set, keys, agent, upstream)`; it is used where the graph allows.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

from apps_bench.optimizers.maspo import AgentGraph, Comparison, ProblemComparison
from apps_bench.optimizers.proposals import ChatReply, Message
from apps_bench.optimizers.protocol import ProblemKey
from apps_bench.optimizers.scoring import Evaluator, ProgramJudge, Rollout, program_win
from apps_bench.topologies.base import PromptSet

TextJudge = Callable[[str, str, str], str]  # (question, first, second) -> "first" | "second" | "tie"


def symmetric_win(judge: TextJudge, question: str, parent_out: str, child_out: str) -> float:
    """Child's win against the parent, asked in both orders; disagreement = tie."""
    a = judge(question, parent_out, child_out)  # child is "second"
    b = judge(question, child_out, parent_out)  # child is "first"
    if a == "second" and b == "first":
        return 1.0
    if a == "first" and b == "second":
        return 0.0
    return 0.5


class ModelTextJudge:
    """A text judge on the optimizer model: answers `<winner>first|second|tie</winner>`."""

    SYSTEM = (
        "You compare two intermediate outputs of agents that help solve a programming problem. "
        "Judge which output better helps produce a correct, efficient Python solution. "
        "Answer with <winner>first</winner>, <winner>second</winner> or <winner>tie</winner>."
    )

    def __init__(self, chat: Callable[[list[Message], int], ChatReply], seed: int = 0) -> None:
        self.chat = chat
        self.seed = seed

    def __call__(self, question: str, first: str, second: str) -> str:
        msgs = [
            {"role": "system", "content": self.SYSTEM},
            {"role": "user", "content": f"Problem:\n{question}\n\n<first>\n{first}\n</first>\n\n<second>\n{second}\n</second>"},
        ]
        m = re.search(r"<winner>\s*(first|second|tie)\s*</winner>", self.chat(msgs, self.seed).text, re.I)
        return m.group(1).lower() if m else "tie"


class EvaluatorSystem:
    def __init__(
        self,
        evaluator: Evaluator,
        graph: AgentGraph,
        *,
        judge_program: ProgramJudge,
        extract_program: Callable[[str], str | None],
        text_judge: TextJudge | None = None,
        question_of: Callable[[ProblemKey], str] | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.graph = graph
        self.judge_program = judge_program
        self.extract_program = extract_program
        self.text_judge = text_judge
        self.question_of = question_of
        self._judged: dict[tuple[ProblemKey, str], tuple[bool, float]] = {}

    def run(self, prompts: Mapping[str, str], keys: Sequence[ProblemKey]) -> list[Rollout]:
        return list(self.evaluator.evaluate(PromptSet(dict(prompts)), list(keys), capture_traces=True))

    def _run_child(
        self, agent: str, child: Mapping[str, str], keys: Sequence[ProblemKey], parent_rollouts: Sequence[Rollout]
    ) -> list[Rollout]:
        partial = getattr(self.evaluator, "evaluate_from", None)
        if self.graph.partial_rerun and callable(partial):
            return list(partial(PromptSet(dict(child)), list(keys), agent, list(parent_rollouts)))
        return self.run(child, keys)

    def _verdict(self, key: ProblemKey, program: str | None) -> tuple[bool, float]:
        if program is None:
            return (False, 0.0)
        k = (key, program)
        if k not in self._judged:
            passed, frac = self.judge_program(key, program)
            self._judged[k] = (bool(passed), float(frac))
        return self._judged[k]

    def output_win(self, key: ProblemKey, role: str, parent: Rollout, child: Rollout) -> float:
        po = [t.output for t in parent.traces if t.role == role]
        co = [t.output for t in child.traces if t.role == role]
        n = max(len(po), len(co))
        if n == 0:
            return 0.5
        po += [""] * (n - len(po))
        co += [""] * (n - len(co))
        wins = []
        for p_out, c_out in zip(po, co):
            pp, cp = self.extract_program(p_out), self.extract_program(c_out)
            if pp is not None or cp is not None:
                wins.append(program_win(self._verdict(key, cp), self._verdict(key, pp)))
            elif self.text_judge is not None and p_out != c_out:
                q = self.question_of(key) if self.question_of else ""
                wins.append(symmetric_win(self.text_judge, q, p_out, c_out))
            else:
                wins.append(0.5)
        return sum(wins) / len(wins)

    def compare(
        self,
        agent: str,
        parent: Mapping[str, str],
        child: Mapping[str, str],
        keys: Sequence[ProblemKey],
        parent_rollouts: Sequence[Rollout],
    ) -> Comparison:
        child_rollouts = self._run_child(agent, child, keys, parent_rollouts)
        succ = [s for s in self.graph.successors(agent) if s in self.graph.agents]
        per = []
        for k, p, c in zip(keys, parent_rollouts, child_rollouts):
            if p.error or c.error:  # infrastructure failed on one side: no evidence either way
                per.append(ProblemComparison((k[0], k[1]), 0.5, 0.5, 0.5))
                continue
            glob = program_win((c.passed, c.pass_fraction), (p.passed, p.pass_fraction))
            local = self.output_win(k, agent, p, c)
            look = sum(self.output_win(k, s, p, c) for s in succ) / len(succ) if succ else glob
            per.append(ProblemComparison((k[0], k[1]), local, look, glob))
        return Comparison(tuple(per))
