"""The values that flow through the pipeline: data -> task -> topology -> judge -> tracking.

Stages exchange these frozen dataclasses and nothing else, so each stage can be
tested alone and records can be written without ad-hoc dicts.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any, Literal

Mode = Literal["stdin", "call"]

# Data that crosses the project's edge as JSON (a records.jsonl line, an HTTP body, an MLflow payload) and whose
# shape no schema here fixes: the one place such data is typed loosely. Data made inside the project gets a
# dataclass or a TypedDict instead.
JsonObject = dict[str, Any]


def _checked(data: object, shape: tuple[Field[Any], ...], what: str) -> JsonObject:
    """`data`, a JSON object read from a record, checked against the fields of the dataclass that reads it:
    a key this version does not know, or an absent field that has no default, is a ValueError saying which
    (never a record half understood)."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} is {type(data).__name__}, not an object")
    unknown = sorted(set(data) - {f.name for f in shape})
    if unknown:
        raise ValueError(f"{what} has fields this version does not know: {unknown}")
    lacking = [f.name for f in shape if f.default is MISSING and f.default_factory is MISSING and f.name not in data]
    if lacking:
        raise ValueError(f"{what} lacks fields every one has: {lacking}")
    return data


@dataclass(frozen=True)
class TestSuite:
    """A problem's kept tests.

    stdin mode: each input is the program's standard input text (a list input in
    the row is joined with newlines by the loader); each output is the expected
    text (lists joined the same way).
    call mode: each input is the positional-argument list, each output the
    expected return value (APPS usually wraps it in a one-element list).
    """

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    fn_name: str | None = None
    n_available: int = 0  # tests in the row before the max_tests_per_row cap
    # The kept tests as the row has them, before the normalisation above (a call input that
    # is not a list, a stdin list); judge profile `reference` uses these. Empty: same as above.
    raw_inputs: tuple[Any, ...] = ()
    raw_outputs: tuple[Any, ...] = ()

    @property
    def mode(self) -> Mode:
        return "call" if self.fn_name else "stdin"

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class Problem:
    """One APPS problem. `id` is the APPS problem_id as a string; `split` makes keys unique."""

    id: str
    question: str
    tests: TestSuite
    starter_code: str = ""
    difficulty: str = ""
    url: str = ""
    solutions: tuple[str, ...] = ()
    split: str = "test"

    @property
    def key(self) -> tuple[str, str]:
        return (self.split, self.id)

    def without_tests(self) -> Problem:
        """What a runner may see: statement, starter code, mode, fn_name, id; no hidden tests
        or reference solutions (test counts stay: they are no secret)."""
        t = self.tests
        return replace(self, tests=replace(t, inputs=(), outputs=(), raw_inputs=(), raw_outputs=()), solutions=())


class Outcome(str, Enum):
    """Per-test outcome. SANDBOX_ERROR is infrastructure, never a verdict on the program."""

    PASS = "pass"
    WRONG_ANSWER = "wrong_answer"
    TIMEOUT = "timeout"
    RUNTIME_ERROR = "runtime_error"
    COMPILE_ERROR = "compile_error"
    OUTPUT_LIMIT = "output_limit"
    MEMORY_LIMIT = "memory_limit"
    SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class TestResult:
    index: int
    outcome: Outcome
    seconds: float = 0.0
    detail: str = ""  # short, clipped: error tail or which comparison failed

    def to_json(self) -> JsonObject:
        return {"index": self.index, "outcome": self.outcome.value, "seconds": round(self.seconds, 4), "detail": self.detail}

    @classmethod
    def from_json(cls, data: object) -> TestResult:
        d = _checked(data, fields(cls), "a test result")
        return cls(index=d["index"], outcome=Outcome(d["outcome"]), seconds=d.get("seconds", 0.0), detail=d.get("detail", ""))


@dataclass(frozen=True)
class Verdict:
    """Strict-accuracy verdict of one program on one problem's kept tests."""

    problem_id: str
    passed: bool
    n_tests: int
    tests_run: int
    tests_passed: int
    results: tuple[TestResult, ...]
    profile: str
    extracted: bool = True  # False when there was no program to judge
    seconds: float = 0.0
    # profile `reference`: the original harness's result list (True/False per test, -1, [-2],
    # [-1] * 21 when its process was lost); None for other profiles
    reference_results: tuple[Any, ...] | None = None

    def to_json(self) -> JsonObject:
        """Its form in a record: `id` last, outcomes by name, `reference_results` only under that profile."""
        d = asdict(self)
        if d["reference_results"] is None:
            del d["reference_results"]
        else:
            d["reference_results"] = list(d["reference_results"])
        d["id"] = d.pop("problem_id")
        d["results"] = [r.to_json() for r in self.results]
        return d

    @classmethod
    def from_json(cls, data: object) -> Verdict:
        """A verdict as `to_json` wrote it (ValueError, saying why, for anything else)."""
        if isinstance(data, dict) and "id" in data:
            data = {("problem_id" if k == "id" else k): v for k, v in data.items()}
        d = _checked(data, fields(cls), "the verdict")
        ref = d.get("reference_results")
        results = tuple(TestResult.from_json(r) for r in d["results"])
        return cls(**{**d, "results": results, "reference_results": None if ref is None else tuple(ref)})


@dataclass
class Usage:
    """Counted once, at the HTTP client layer, the same way for every framework.

    `model_calls` are answered calls; `failed_calls` calls that still failed after their
    retries. Every attempt that failed (each retried one included) is in `failed_attempts`,
    `retries` counts the re-sends, and `retried_*_tokens` what discarded replies cost (as far
    as the server reported usage in them). `cancelled_calls` were abandoned unanswered (the
    time cap cut them); `in_flight` is live state, the calls sent and not yet answered.
    `calls` holds one entry per answered call: tokens, finish_reason, retries, whether
    `tools` were sent (no timings: a record is the same whichever process solved it).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    failed_calls: int = 0
    tool_s: float = 0.0  # wall time inside python_exec (the sandbox), apart from the model's
    failed_attempts: int = 0
    retries: int = 0
    retried_prompt_tokens: int = 0
    retried_completion_tokens: int = 0
    cancelled_calls: int = 0
    requests_with_tools: int = 0
    in_flight: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    calls: list[JsonObject] = field(default_factory=list)  # per call: tokens, finish_reason, retries, tools, role
    # tracking.traces: the problem's captured calls (tracking/capture.TraceLog), never recorded
    trace: Any = field(default=None, repr=False, compare=False)

    COUNTERS = (
        "prompt_tokens",
        "completion_tokens",
        "model_calls",
        "tool_calls",
        "failed_calls",
        "failed_attempts",
        "retries",
        "retried_prompt_tokens",
        "retried_completion_tokens",
        "cancelled_calls",
        "requests_with_tools",
        "tool_s",
    )

    def add(self, other: Usage) -> None:
        for k in self.COUNTERS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for reason, n in other.finish_reasons.items():
            self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + n
        self.calls.extend(other.calls)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def length_stops(self) -> int:
        """Answered calls the server cut at the token cap (finish_reason "length")."""
        return self.finish_reasons.get("length", 0)


@dataclass(frozen=True)
class UsageRecord:
    """A problem's usage as its record keeps it (`Usage` less its live state: totals spelled out, tool_s
    rounded), its fields in the line's order. A line written before a counter existed reads it as 0."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    failed_calls: int = 0
    failed_attempts: int = 0
    retries: int = 0
    retried_prompt_tokens: int = 0
    retried_completion_tokens: int = 0
    cancelled_calls: int = 0
    requests_with_tools: int = 0
    length_stops: int = 0
    tool_s: float = 0.0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    calls: list[JsonObject] = field(default_factory=list)  # one per answered call (Usage.calls)

    @classmethod
    def of(cls, usage: Usage | None) -> UsageRecord:
        """What a record keeps of `usage` (None: a problem that never reached the model)."""
        if usage is None:
            return cls()
        counts = {f.name: int(getattr(usage, f.name)) for f in fields(cls) if f.type == "int"}
        return cls(
            **counts, tool_s=round(float(usage.tool_s), 4), finish_reasons=dict(usage.finish_reasons), calls=list(usage.calls)
        )

    @property
    def billed_tokens(self) -> tuple[int, int]:
        """(input, output) tokens, retried attempts' discarded replies included: what money counts."""
        return self.prompt_tokens + self.retried_prompt_tokens, self.completion_tokens + self.retried_completion_tokens

    def to_json(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> UsageRecord:
        return cls(**_checked(data, fields(cls), "the usage"))


@dataclass(frozen=True)
class TranscriptEvent:
    """One step of one agent: what it received, replied, or ran. The per-role trace optimizers read."""

    agent: str  # e.g. "solver", "coder_2", "manager"
    role: str  # the role whose prompt drove this agent
    kind: Literal["input", "reply", "tool_call", "tool_result", "note"]
    content: str
    round: int = 0


@dataclass(frozen=True)
class Candidate:
    agent: str
    program: str | None

    def to_json(self) -> JsonObject:
        return {"agent": self.agent, "program": self.program}

    @classmethod
    def from_json(cls, data: object) -> Candidate:
        return cls(**_checked(data, fields(cls), "a candidate"))


@dataclass(frozen=True)
class Vote:
    """Majority vote over candidates: groups of identical normalised programs."""

    group_sizes: tuple[int, ...]
    group_members: tuple[tuple[str, ...], ...]  # agent names per group, groups in first-seen order
    winner: int | None  # index into groups, None when no agent produced code

    def to_json(self) -> JsonObject:
        return {
            "group_sizes": list(self.group_sizes),
            "group_members": [list(m) for m in self.group_members],
            "winner": self.winner,
        }

    @classmethod
    def from_json(cls, data: object) -> Vote:
        d = _checked(data, fields(cls), "the vote")
        return cls(tuple(d["group_sizes"]), tuple(tuple(m) for m in d["group_members"]), d["winner"])


@dataclass
class Attempt:
    """What a topology returns for one problem."""

    program: str | None
    candidates: list[Candidate] = field(default_factory=list)
    vote: Vote | None = None
    transcript: list[TranscriptEvent] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    rounds: int = 0
    turns: int = 0
    stop_reason: str = "done"  # done | step_cap | turn_cap | time_limit | error
    error: str | None = None  # infrastructure error (model unreachable after retries): not a wrong answer


# The version of records.jsonl's lines this code writes (ProblemRecord.schema). A line without one was
# written before records said what they are: the same format, version 1. A new version that changes the
# format bumps this, and ProblemRecord.from_json reads the older ones.
RECORD_SCHEMA = 1


@dataclass(frozen=True)
class RescoreOf:
    """In a re-scoring's record (rescore.py): the cell record it replaces, whose program could not be judged again."""

    cell: str
    passed: bool

    def to_json(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> RescoreOf:
        """Either form, told apart by the fields a re-judged one has."""
        shape = Rejudged if isinstance(data, dict) and "profile" in data else cls
        return shape(**_checked(data, fields(shape), "rescore_of"))


@dataclass(frozen=True)
class Rejudged(RescoreOf):
    """The cell record a re-judged one replaces: its judge profile, test cap and judging time too."""

    profile: str | None
    max_tests_per_row: int | None
    judge_s: float


@dataclass
class ProblemRecord:
    """One line of a cell's records.jsonl: a problem solved and judged (or its infrastructure error).

    `to_json` gives the line's object and `from_json` reads it back, the same bytes again; a line of an
    older version (no `schema`, fields added since absent) reads with those fields' defaults."""

    key: str
    id: str
    split: str
    difficulty: str
    mode: str
    cell: str
    program: str | None
    extracted: bool
    passed: bool
    verdict: Verdict | None
    usage: UsageRecord
    tool_calls_by_role: dict[str, int]
    latency_s: float
    solve_s: float
    judge_s: float
    solver: str
    error: str | None
    stop_reason: str
    rounds: int = 0
    turns: int = 0
    candidates: list[Candidate] = field(default_factory=list)
    vote: Vote | None = None
    completed_at: float = 0.0
    rescore_of: RescoreOf | None = None
    schema: int = RECORD_SCHEMA

    def to_json(self) -> JsonObject:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return {
            **d,
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "usage": self.usage.to_json(),
            "tool_calls_by_role": dict(self.tool_calls_by_role),
            "candidates": [c.to_json() for c in self.candidates],
            "vote": None if self.vote is None else self.vote.to_json(),
            "rescore_of": None if self.rescore_of is None else self.rescore_of.to_json(),
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> ProblemRecord:
        """A record as written (no `schema`: version 1). A newer version, or fields this version
        does not know or lacks, are an error that says which: never a record half understood."""
        version = data.get("schema", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"record {data.get('key')!r} has schema {version!r}: not a records.jsonl version")
        if version > RECORD_SCHEMA:
            raise ValueError(
                f"record {data.get('key')!r} is records schema version {version}; this apps-bench reads "
                f"versions 1 to {RECORD_SCHEMA}: read it with the apps-bench that wrote it, or a newer one"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"record {data.get('key')!r} has fields this version does not know: {unknown}")
        lacking = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING and f.name not in data]
        if lacking:
            raise ValueError(f"record {data.get('key')!r} lacks fields every record has: {lacking}")
        try:
            verdict, vote, rescore_of = data["verdict"], data.get("vote"), data.get("rescore_of")
            typed = {
                "verdict": None if verdict is None else Verdict.from_json(verdict),
                "usage": UsageRecord.from_json(data["usage"]),
                "candidates": [Candidate.from_json(c) for c in data.get("candidates") or ()],
                "vote": None if vote is None else Vote.from_json(vote),
                "rescore_of": None if rescore_of is None else RescoreOf.from_json(rescore_of),
            }
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"record {data.get('key')!r}: {exc}") from None
        return cls(**{**data, **typed, "schema": version})
