"""Asking the optimizer model for a new prompt: messages, tagged answers, cached calls.

Shared by MASPO (Ksub variations per beam node) and GEPA (its reflection step). Answers
come in tagged sections `<analysis>`, `<modification>`, `<prompt>` rather than code
fences, because role prompts themselves contain ```python fences (GEPA's default
proposer, which takes the text between the first and last ```, breaks on them).

What the optimizer model sees: training problem statements, role traces, verdicts and
the first failing training test. Never reference solutions: a `Rollout` does not carry
them, and the problem text comes through `question_of`, which the caller builds from
the pool's question field only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from apps_bench.optimizers.cache import RolloutCache, stable_hash
from apps_bench.optimizers.protocol import Budget, BudgetExhausted, ProblemKey
from apps_bench.optimizers.scoring import Rollout
from apps_bench.types import JsonObject

Message = dict[str, str]
CLIP = 3000


@dataclass(frozen=True)
class ChatReply:
    text: str
    tokens: int = 0  # prompt + completion tokens, charged to the optimizer-model budget


ChatFn = Callable[[list[Message], int], ChatReply]  # (messages, seed) -> reply; the optimizer model


@dataclass(frozen=True)
class TaggedProposal:
    analysis: str
    modification: str
    prompt: str


_TAG = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.S | re.I) for name in ("analysis", "modification")}


def parse_tagged(reply: str) -> TaggedProposal | None:
    """The sections of a reply, or None when there is no complete non-empty `<prompt>`.

    The prompt runs from the first `<prompt>` to the last `</prompt>`, so a prompt that
    itself mentions tags or holds code fences survives intact.
    """
    lo = reply.lower()
    start = lo.find("<prompt>")
    end = lo.rfind("</prompt>")
    if start < 0 or end < start:
        return None
    prompt = reply[start + len("<prompt>") : end].strip()
    if not prompt:
        return None
    head = reply[:start]
    parts = {}
    for name, rx in _TAG.items():
        m = rx.search(head)
        parts[name] = m.group(1).strip() if m else ""
    return TaggedProposal(parts["analysis"], parts["modification"], prompt)


SYSTEM = (
    "You improve the instruction prompt of one agent in a multi-agent system that solves "
    "competitive-programming problems in Python. You see the agent's current prompt and "
    "examples of its work: the problem, what the agent received, what it replied, and how "
    "the system's final program fared on the problem's training tests. Find what in the "
    "prompt led to failures and rewrite the prompt to fix it, keeping what works and any "
    "output-format requirement (e.g. ending with one fenced python block).\n"
    "Answer in exactly three tagged sections:\n"
    "<analysis>what goes wrong and why</analysis>\n"
    "<modification>what you change in the prompt</modification>\n"
    "<prompt>the complete new prompt text</prompt>"
)


def _clip(text: str, n: int = CLIP) -> str:
    return text if len(text) <= n else text[:n] + f"\n... [{len(text) - n} more characters]"


def feedback_text(r: Rollout) -> str:
    """Verdict, tests passed, first failing training test: the feedback both methods show."""
    if r.error:
        return f"The run failed for an infrastructure reason: {r.error}"
    if r.program is None:
        return "No program was extracted from the final answer (verdict: fail)."
    head = f"Verdict: {'PASS' if r.passed else 'FAIL'}; training tests passed: {r.tests_passed}/{r.n_tests}."
    ff = r.first_failure
    if ff is None:
        return head
    return (
        f"{head}\nFirst failing training test (#{ff.index}, {ff.outcome}):\n"
        f"input:\n{_clip(ff.input, 800)}\nexpected output:\n{_clip(ff.expected, 800)}"
        + (f"\ndetail: {_clip(ff.detail, 600)}" if ff.detail else "")
    )


def role_examples(
    role: str, rollouts: Sequence[Rollout], question_of: Callable[[ProblemKey], str] | None = None, limit: int = 5
) -> list[JsonObject]:
    """Up to `limit` examples for one role: failures first, then passes, input order kept."""
    chosen = [r for r in rollouts if not r.passed] + [r for r in rollouts if r.passed]
    out = []
    for r in chosen[:limit]:
        traces = [t for t in r.traces if t.role == role]
        out.append(
            {
                "problem": _clip(question_of(r.key)) if question_of else f"{r.key[0]}/{r.key[1]}",
                "agent_input": _clip("\n\n".join(t.input for t in traces)) if traces else "(this role did not run)",
                "agent_output": _clip("\n\n".join(t.output for t in traces)) if traces else "",
                "tool_calls": [_clip(c, 600) for t in traces for c in t.tool_calls][:6],
                "feedback": feedback_text(r),
            }
        )
    return out


def proposal_messages(role: str, current_prompt: str, examples: Sequence[JsonObject], note: str = "") -> list[Message]:
    parts = [f"Agent role: {role}\n\nCurrent prompt:\n<current_prompt>\n{current_prompt}\n</current_prompt>"]
    if note:
        parts.append(note)
    for i, ex in enumerate(examples, 1):
        block = [f"### Example {i}"]
        for k in ("problem", "agent_input", "agent_output", "feedback"):
            if ex.get(k):
                block.append(f"[{k}]\n{ex[k]}")
        if ex.get("tool_calls"):
            block.append("[tool_calls]\n" + "\n".join(ex["tool_calls"]))
        parts.append("\n".join(block))
    parts.append("Write the improved prompt in the three tagged sections.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


class CachedChat:
    """The optimizer model behind the cache and the budget.

    A call is keyed by (model, messages, seed); a replay after a kill gets the same reply
    without a model call. Tokens are charged once per distinct call per run, like rollouts.
    """

    def __init__(
        self,
        chat: ChatFn,
        cache: RolloutCache,
        model: JsonObject,
        budget: Budget | None = None,
        on_call: Callable[[JsonObject], None] | None = None,
    ) -> None:
        self.chat = chat
        self.cache = cache
        self.model = dict(model)
        self.budget = budget
        self.on_call = on_call
        self._charged: set[str] = set()

    def __call__(self, messages: list[Message], seed: int = 0) -> ChatReply:
        key = stable_hash({"model": self.model, "messages": messages, "seed": int(seed)})
        hit = self.cache.get(key, kind="optimizer_call")
        fresh = hit is None
        if key not in self._charged and self.budget is not None and self.budget.exhausted:
            raise BudgetExhausted(f"budget exhausted ({self.budget.exhausted_by()}); no more optimizer-model calls")
        if hit is None:
            reply = self.chat(messages, int(seed))
            self.cache.put(key, {"text": reply.text, "tokens": int(reply.tokens)}, kind="optimizer_call")
        else:
            reply = ChatReply(hit["text"], int(hit.get("tokens", 0)))
        if key not in self._charged:
            self._charged.add(key)
            if self.budget is not None:
                self.budget.charge_optimizer(reply.tokens, fresh=fresh)
        if self.on_call is not None:
            self.on_call(
                {
                    "key": key[:12],
                    "seed": int(seed),
                    "fresh": fresh,
                    "tokens": reply.tokens,
                    "messages": messages,
                    "reply": reply.text,
                }
            )
        return reply


class ModelProposer:
    """MASPO's `propose(agent, prompt, rollouts) -> [texts]`: Ksub calls, distinct seeds.

    Each call sees about `n_traces` examples of the agent (problem, incoming context,
    output, feedback) and must answer in tags; an unparsable reply or a text equal to the
    current prompt (or to an earlier variation) is dropped, so fewer than Ksub may return.
    """

    def __init__(
        self,
        chat: Callable[[list[Message], int], ChatReply],
        *,
        ksub: int = 2,
        n_traces: int = 5,
        question_of: Callable[[ProblemKey], str] | None = None,
        seed: int = 0,
    ) -> None:
        self.chat = chat
        self.ksub = ksub
        self.n_traces = n_traces
        self.question_of = question_of
        self.seed = seed
        self.parsed: list[TaggedProposal] = []
        self.rejected = 0
        self.calls = 0

    def __call__(self, agent: str, prompt: str, rollouts: Sequence[Rollout], role: str | None = None) -> list[str]:
        examples = role_examples(role or agent, rollouts, self.question_of, self.n_traces)
        messages = proposal_messages(role or agent, prompt, examples)
        # a fresh seed per proposal call (a node revisited gets new variations), reproducible on replay
        # because the search calls in the same order
        self.calls += 1
        base = int(stable_hash({"agent": agent, "prompt": prompt, "seed": self.seed, "call": self.calls})[:7], 16)
        out: list[str] = []
        for i in range(self.ksub):
            reply = self.chat(messages, base + i)
            tp = parse_tagged(reply.text)
            if tp is None or tp.prompt == prompt or tp.prompt in out:
                self.rejected += 1
                continue
            self.parsed.append(tp)
            out.append(tp.prompt)
        return out
