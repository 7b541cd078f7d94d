"""What the gold model says: deterministic conversation rules, no HTTP.

The gold model is a harness self-check, not an LLM. It answers each APPS problem
with its reference solution so that every runner, tool loop and judge path can be
exercised offline and must reach the reference pass rate. Rules, first match wins:

1. Optimizer rewrite: a system/user message contains the literal `</prompt>` (the
   optimizer asks for a rewritten prompt in `<prompt>...</prompt>` tags). The prompt to
   rewrite is the text of `<current_prompt>...</current_prompt>` if present, else of the
   first non-empty `<prompt>...</prompt>` block that is not a placeholder. The reply has
   `<analysis>`, `<modification>` and `<prompt>` sections; the new prompt is the old one
   plus one extra sentence chosen by hash(request seed, old prompt) — vary the seed to
   get different variations.
2. Speaker selection (AutoGen `SelectorGroupChat`, or any "select the next
   role/speaker/agent from [a, b]" prompt): reply with the listed name the conversation
   before that phrase mentions last (the worker a manager just addressed), else the
   first listed name.
3. Problem lookup: the conversation (all message texts, tool arguments included) must
   contain a known problem's question text (whitespace-insensitive). Otherwise a plain
   reply saying the request cannot be placed (no program).
4. CrewAI ReAct text prompts (system/user text with the `Thought:` / `Final Answer:`
   format): if `python_exec` is among the listed tools and no `Observation:` is in the
   conversation yet, reply `Thought:` / `Action: python_exec` / `Action Input: {json}`;
   else `Thought:` / `Final Answer:` with the program.
5. Native tools (as allowed by `tool_choice`: "none" allows none, a named function only
   that one): `python_exec` offered and no tool result yet -> call it (code = the
   solution, stdin = first test input for stdin problems). Then, if `delegate` is
   offered (params `worker` enum, `instruction`), one delegate call per reply for each
   worker of the enum in order, skipping workers already delegated to. Then the final
   answer.
6. Final answer: the first reference solution in a ```python fence, or (with
   probability `wrong_fraction`, decided by hash(problem key, request seed)) a
   deliberately wrong program that is the same for every seed.

Every reply carries the line `gold: harness self-check, not an LLM` outside any fence.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from apps_bench.types import JsonObject

if TYPE_CHECKING:
    from apps_bench.config.schema import ModelConfig
    from apps_bench.types import Problem

SELF_CHECK = "gold: harness self-check, not an LLM"

EXTRA_SENTENCES = (
    "Before answering, restate the input format and the output format in one line each.",
    "Check the smallest and the largest inputs the constraints allow before you submit.",
    "Prefer a simple algorithm whose complexity fits the constraints over a clever one.",
    "Read all of standard input at once and print exactly what the problem asks for.",
    "Trace your program by hand on the first sample before you submit it.",
    "If a step is unclear, choose the interpretation that matches the samples.",
    "Keep the submitted program self-contained: one fenced python block, no prose inside.",
    "Name the edge cases (empty input, one element, equal values) and handle each.",
)


def unit_hash(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (same parts, same number, any process)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def estimate_tokens(text: str) -> int:
    """Deterministic token estimate (~4 characters a token). Never tiktoken: it downloads."""
    return (len(text) + 3) // 4 if text else 0


def _norm(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class GoldProblem:
    """What the gold model needs to know about one problem."""

    key: str  # e.g. "test/8"
    question: str
    solution: str | None
    stdin: str | None = None  # first test input (stdin problems)
    fn_name: str | None = None
    starter_code: str = ""

    @classmethod
    def from_problem(cls, problem: Problem) -> GoldProblem:
        tests = problem.tests
        stdin = None
        if not tests.fn_name and len(tests.inputs):
            first = tests.inputs[0]
            stdin = first if isinstance(first, str) else "\n".join(map(str, first))
        return cls(
            key=f"{problem.split}/{problem.id}",
            question=problem.question,
            solution=problem.solutions[0] if problem.solutions else None,
            stdin=stdin,
            fn_name=tests.fn_name,
            starter_code=problem.starter_code or "",
        )

    @classmethod
    def from_row(cls, row: JsonObject, split: str = "test") -> GoldProblem:
        """From a raw codeparrot/apps row (JSON-encoded `solutions` and `input_output`)."""
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(0)  # APPS holds integers longer than 4300 digits
        sols = json.loads(row["solutions"]) if row.get("solutions") else []
        io = json.loads(row["input_output"]) if row.get("input_output") else {}
        fn_name = io.get("fn_name")
        stdin = None
        inputs = io.get("inputs") or []
        if not fn_name and inputs:
            first = inputs[0]
            stdin = first if isinstance(first, str) else "\n".join(map(str, first))
        return cls(
            key=f"{split}/{row['problem_id']}",
            question=row["question"],
            solution=sols[0] if sols else None,
            stdin=stdin,
            fn_name=fn_name,
            starter_code=row.get("starter_code") or "",
        )

    def wrong_program(self) -> str:
        """A deliberately wrong program: the same text for every seed, so wrong agents agree."""
        marker = "gold-deliberately-wrong-answer"
        if self.fn_name:
            if "class Solution" in self.starter_code:
                return f"class Solution:\n    def {self.fn_name}(self, *args):\n        return {marker!r}\n"
            return f"def {self.fn_name}(*args):\n    return {marker!r}\n"
        return f"print({marker!r})\n"


class ProblemIndex:
    """Finds a problem by its question text anywhere in a conversation."""

    def __init__(self, problems: Iterable[GoldProblem]) -> None:
        self.problems: list[GoldProblem] = []
        self._norm: list[tuple[str, GoldProblem]] = []
        seen: set[str] = set()
        for p in problems:
            q = _norm(p.question)
            if not q or q in seen:
                continue
            seen.add(q)
            self.problems.append(p)
            self._norm.append((q, p))
        # longest question first: a question contained in another must not win
        self._norm.sort(key=lambda qp: -len(qp[0]))

    def __len__(self) -> int:
        return len(self.problems)

    def find(self, text: str) -> GoldProblem | None:
        t = _norm(text)
        for q, p in self._norm:
            if q in t:
                return p
        return None


@dataclass
class ToolCall:
    name: str
    arguments: JsonObject


@dataclass
class Reply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    kind: str = "final"  # final | wrong | python_exec | delegate | select | crewai_action | crewai_final | optimizer | unplaced | no_solution
    problem: str | None = None


# ---------------------------------------------------------------- request helpers


def message_text(message: JsonObject) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def _tool_call_args(call: JsonObject) -> tuple[str, JsonObject, str]:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        args = json.loads(raw) if isinstance(raw, str) and raw else (raw if isinstance(raw, dict) else {})
    except ValueError:
        args = {}
    return str(fn.get("name") or ""), args if isinstance(args, dict) else {}, raw if isinstance(raw, str) else ""


def conversation_text(messages: Sequence[JsonObject]) -> str:
    chunks = []
    for m in messages:
        chunks.append(message_text(m))
        for call in m.get("tool_calls") or []:
            _, args, raw = _tool_call_args(call)
            chunks.append(raw)
            chunks.extend(str(v) for v in args.values())
    return "\n".join(chunks)


def offered_tools(request: JsonObject) -> dict[str, JsonObject]:
    tools: dict[str, JsonObject] = {}
    for t in request.get("tools") or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            tools[str(fn["name"])] = fn
    for fn in request.get("functions") or []:  # legacy function calling
        if isinstance(fn, dict) and fn.get("name"):
            tools[str(fn["name"])] = fn
    return tools


def usable_tools(request: JsonObject) -> dict[str, JsonObject]:
    """Offered tools the request lets the model call: `tool_choice: "none"` allows none (AutoGen's
    reflection call), a named function allows only that one."""
    tools = offered_tools(request)
    choice = request.get("tool_choice")
    if choice == "none":
        return {}
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        if name:
            return {k: v for k, v in tools.items() if k == name}
    return tools


def request_seed(request: JsonObject) -> int:
    try:
        return int(request.get("seed") or 0)
    except (TypeError, ValueError):
        return 0


# ---------------------------------------------------------------- the rules


_SELECT = re.compile(
    r"(?:select|choose|pick)\s+the\s+next\s+(?:role|speaker|agent)\s+from\s*:?\s*(\[[^\]\n]*\]|[^\n]+?)(?:\s+to\s+play|\.|\n|$)",
    re.IGNORECASE,
)
_CREW_TOOLS = re.compile(r"(?:only one name of|should be one of)\s*\[([^\]]*)\]")
_CREW_OBS = re.compile(r"Observation:(?! the result of the action)")


def _optimizer_reply(messages: Sequence[JsonObject], seed: int) -> Reply | None:
    asks = [message_text(m) for m in messages if m.get("role") in ("system", "user", "developer")]
    if not any("</prompt>" in t for t in asks):
        return None
    text = "\n".join(message_text(m) for m in messages)
    given = None
    m = re.search(r"<current_prompt>(.*?)</current_prompt>", text, re.DOTALL)
    if m:
        given = m.group(1).strip()
    else:
        for block in re.findall(r"<prompt>(.*?)</prompt>", text, re.DOTALL):
            b = block.strip()
            if b and b.strip(".… ") and not (b.startswith("{") and b.endswith("}")):
                given = b
                break
    given = given or ""
    sentence = EXTRA_SENTENCES[int(unit_hash("optimizer", seed, given) * len(EXTRA_SENTENCES))]
    new = f"{given}\n\n{sentence}" if given else sentence
    content = (
        f"<analysis>{SELF_CHECK}. Deterministic rewrite for seed {seed}; no analysis was done.</analysis>\n"
        f"<modification>Appended one sentence: {sentence}</modification>\n"
        f"<prompt>{new}</prompt>"
    )
    return Reply(content, kind="optimizer")


def _selector_reply(messages: Sequence[JsonObject]) -> Reply | None:
    for m in reversed(messages):
        if m.get("role") not in ("system", "user", "developer"):
            continue
        hits = list(_SELECT.finditer(message_text(m)))
        hit = hits[-1] if hits else None
        if hit is None:
            continue
        listed = hit.group(1).strip()
        names = [a or b for a, b in re.findall(r"'([^']+)'|\"([^\"]+)\"", listed)]
        if not names:
            names = [n.strip(" []`*") for n in re.split(r",|\bor\b", listed) if n.strip(" []`*")]
        if names:
            return Reply(_named_last(message_text(m), hit, names), kind="select")
    return None


def _named_last(text: str, hit: re.Match[str], names: list[str]) -> str:
    """The listed name the conversation mentions last (a manager addressing a worker), else the first.

    The history is the text before the last "select the next ..." phrase, after an earlier one if
    the prompt repeats it (AutoGen's default selector prompt does, around `{history}`).
    """
    starts = [h for h in _SELECT.finditer(text) if h.start() < hit.start()]
    history = text[starts[-1].end() if starts else 0 : hit.start()]
    best, where = names[0], -1
    for name in names:
        for found in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", history):
            if found.start() > where:
                best, where = name, found.start()
    return best


def _fence(program: str) -> str:
    return f"```python\n{program.rstrip()}\n```"


def _final(problem: GoldProblem, seed: int, wrong_fraction: float) -> Reply:
    if problem.solution is None:
        return Reply(
            f"{SELF_CHECK}. Problem {problem.key} has no reference solution, so there is no program to give.",
            kind="no_solution",
            problem=problem.key,
        )
    if wrong_fraction > 0 and unit_hash("wrong", problem.key, seed) < wrong_fraction:
        return Reply(
            f"{SELF_CHECK}. Deliberately wrong answer for problem {problem.key} (wrong_fraction).\n\n"
            + _fence(problem.wrong_program()),
            kind="wrong",
            problem=problem.key,
        )
    return Reply(
        f"{SELF_CHECK}. Reference solution for problem {problem.key}.\n\n" + _fence(problem.solution),
        kind="final",
        problem=problem.key,
    )


def _program(problem: GoldProblem, seed: int, wrong_fraction: float) -> str:
    final = _final(problem, seed, wrong_fraction)
    if final.kind == "wrong":
        return problem.wrong_program()
    return problem.solution or ""


def _exec_args(problem: GoldProblem, seed: int, wrong_fraction: float, schema: JsonObject | None) -> JsonObject:
    args: JsonObject = {"code": _program(problem, seed, wrong_fraction)}
    props = ((schema or {}).get("parameters") or {}).get("properties") or {"stdin": {}}
    if "stdin" in props:
        args["stdin"] = problem.stdin or ""
    return args


def _crewai_reply(messages: Sequence[JsonObject], problem: GoldProblem, seed: int, wrong_fraction: float) -> Reply | None:
    prompts = "\n".join(message_text(m) for m in messages if m.get("role") in ("system", "user"))
    if not (re.search(r"^Final Answer:", prompts, re.MULTILINE) and "Thought:" in prompts):
        return None
    tools = _CREW_TOOLS.search(prompts)
    names = [n.strip() for n in tools.group(1).split(",")] if tools else []
    observed = any(_CREW_OBS.search(message_text(m)) for m in messages if m.get("role") != "system")
    if "python_exec" in names and not observed and problem.solution is not None:
        args = _exec_args(problem, seed, wrong_fraction, None)
        return Reply(
            f"Thought: {SELF_CHECK}. I run the reference program first.\nAction: python_exec\nAction Input: {json.dumps(args)}",
            kind="crewai_action",
            problem=problem.key,
        )
    final = _final(problem, seed, wrong_fraction)
    return Reply(
        f"Thought: I now can give a great answer\nFinal Answer: {final.content}", kind="crewai_final", problem=problem.key
    )


def respond(request: JsonObject, index: ProblemIndex, *, wrong_fraction: float = 0.0) -> Reply:
    """The gold model's reply to one chat-completions request body."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    seed = request_seed(request)

    reply = _optimizer_reply(messages, seed) or _selector_reply(messages)
    if reply:
        return reply

    problem = index.find(conversation_text(messages))
    if problem is None:
        return Reply(
            f"{SELF_CHECK}. I cannot place this request: no known problem's question text appears in the "
            f"conversation ({len(index)} problems loaded), so I have no program to give.",
            kind="unplaced",
        )

    crew = _crewai_reply(messages, problem, seed, wrong_fraction)
    if crew:
        return crew

    tools = usable_tools(request)
    has_tool_result = any(m.get("role") in ("tool", "function") for m in messages)
    if problem.solution is not None:
        if "python_exec" in tools and not has_tool_result:
            return Reply(
                f"{SELF_CHECK}. Running the reference program on the first test input.",
                [ToolCall("python_exec", _exec_args(problem, seed, wrong_fraction, tools["python_exec"]))],
                kind="python_exec",
                problem=problem.key,
            )
        if "delegate" in tools:
            props = (tools["delegate"].get("parameters") or {}).get("properties") or {}
            workers = list((props.get("worker") or {}).get("enum") or [])
            done = set()
            for m in messages:
                for call in m.get("tool_calls") or []:
                    name, args, _ = _tool_call_args(call)
                    if name == "delegate":
                        done.add(str(args.get("worker")))
            todo = [w for w in workers if w not in done]
            if todo:
                worker = todo[0]
                return Reply(
                    f"{SELF_CHECK}. Delegating to {worker}.",
                    [
                        ToolCall(
                            "delegate",
                            {
                                "worker": worker,
                                "instruction": f"As the {worker}, work on the problem and report back to the manager.",
                            },
                        )
                    ],
                    kind="delegate",
                    problem=problem.key,
                )
    return _final(problem, seed, wrong_fraction)


def without_solution(problems: Sequence[Problem]) -> list[Problem]:
    """The problems gold cannot answer: their rows have no reference solution."""
    return [p for p in problems if not p.solutions]


def print_start_notes(model_cfg: ModelConfig, problems: Sequence[Problem]) -> None:
    """At the start of a gold cell: what gold is, and how many selected rows it cannot answer and
    what that does to the score (a cell on rows without solutions scores 0 by construction)."""
    if model_cfg.provider != "gold":
        return
    print(
        "apps-bench: model=gold is the built-in harness self-check server: it answers with reference "
        "solutions; it is not an LLM and its scores measure the harness, not a model.",
        file=sys.stderr,
    )
    missing, n = len(without_solution(problems)), len(problems)
    if missing:
        print(
            f"apps-bench: model=gold: {missing} of {n} selected problems have no reference solution in their rows; "
            f"gold gives no program for them, so they score 0 and this cell's pass@1 is at most {n - missing}/{n} = "
            f"{(n - missing) / n:.4f} (and its agents call no tools on them). To check the harness, select rows with "
            "solutions (e.g. the shared train_mini150.jsonl).",
            file=sys.stderr,
        )
