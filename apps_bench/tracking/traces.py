"""A trace per problem in the cell's MLflow run, built after judging from what was captured.

Every runner gives the same tree, whatever its framework, because it is built from what the
project itself captures for every framework (tracking/capture.py: the metering transport's
model calls, the tool's runs, the transcript's events), not from a framework's own hooks:

    problem <split/id>            AGENT      tags: problem_key, difficulty, passed, error, stop_reason
      <agent> [round r]           AGENT      one per agent turn (input -> last reply)
        chat <role>               CHAT_MODEL messages in / reply out (finish reason), token usage, retries
        python_exec               TOOL       code, stdin, stdout/stderr (clipped), exit code
      judge                       EVALUATOR  the verdict with each test's outcome

The trace is linked to the run (`mlflow.sourceRun`), so the run's Traces tab lists it. It is
written on one thread of its own in the cell's process, after the problem's record: tracing
never changes a record or a verdict, and a resumed cell traces only the problems it solves.

A trace is a view, kept small (conf/tracking/mlflow.yaml): each text in a span (a message, an
input, a reply, a program, a tool's output) is kept up to `tracking.trace_text_chars` characters,
the whole text being in the run's transcripts.jsonl and prompts.json, and is stored once per trace
(shown again, alone or inside a longer text, it is a reference to its span); a request's tool definitions
are named, not repeated; `tracking.trace_problems` and `tracking.trace_sample` choose which
problems get a trace, by outcome and by a sample drawn from the problem keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from apps_bench.models.wire import is_stream, stream_events
from apps_bench.tracking.capture import ExecCall, ModelCall, TraceLog, log_of
from apps_bench.tracking.mlflow_internals import load_mlflow as import_mlflow
from apps_bench.types import JsonObject, Problem, ProblemRecord

if TYPE_CHECKING:
    from mlflow.entities import LiveSpan

    from apps_bench.config.schema import Config

TRACE_PROBLEMS = ("all", "failed", "errors")  # tracking.trace_problems


def traces_enabled(config: Config) -> bool:
    """`tracking.traces`: true/false as set; null (the default) = on for real models, off for
    `model=gold` (a self-check answering with reference solutions; docs/tracking.md, Traces)."""
    if config.tracking.backend == "none":
        return False
    setting = config.tracking.traces
    if setting is None:
        return config.model.provider != "gold"
    return bool(setting)


# ----------------------------------------------------------------------------- which problems, how much


@dataclass(frozen=True)
class TraceChoice:
    """Which of a cell's problems get a trace, and how much text a span keeps (docs/tracking.md, Traces)."""

    text_chars: int  # tracking.trace_text_chars
    problems: str = "all"  # tracking.trace_problems: all | failed (not passed, errors included) | errors
    sample: float | None = None  # a fraction of the problem keys (None: every one)
    keys: frozenset[str] | None = None  # the problems a sample of N chose (None: no such sample)

    @classmethod
    def of(cls, config: Config, keys: list[str]) -> TraceChoice:
        """The cell's choice; `keys`: every problem of the cell, so a sample of N is the same N on resume."""
        t = config.tracking
        sample = t.trace_sample
        if sample is None or isinstance(sample, bool) or not isinstance(sample, int):
            return cls(int(t.trace_text_chars), str(t.trace_problems), None if sample is None else float(sample))
        return cls(int(t.trace_text_chars), str(t.trace_problems), None, frozenset(sorted(keys, key=draw)[:sample]))

    def wants(self, record: ProblemRecord) -> bool:
        if self.keys is not None and record.key not in self.keys:
            return False
        if self.sample is not None and draw(record.key) >= self.sample:
            return False
        if self.problems == "failed":
            return not record.passed
        if self.problems == "errors":
            return bool(record.error)
        return True


def draw(key: str) -> float:
    """A problem's place in [0, 1) from its key alone: the same problems are sampled in every run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


# ----------------------------------------------------------------------------- the writer


class TraceWriter:
    """Writes each judged problem's trace into the cell's run, one at a time on its own thread
    (the run may still be opening: the first trace waits for it). A failed trace is a warning,
    never the cell's failure."""

    def __init__(self, tracker_future: _Opening, choice: TraceChoice) -> None:
        self._run = tracker_future
        self.choice = choice
        self._tx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apps-bench-traces")
        self._pending: list[Future[None]] = []
        self._warned = False

    def submit(self, outcome: _Outcome, record: ProblemRecord) -> None:
        log = log_of(getattr(outcome.solved, "usage", None))
        if log is None or not self.choice.wants(record):
            return
        end_ns = time.time_ns()
        self._pending.append(self._tx.submit(self._write, outcome, record, log, end_ns))

    def _write(self, outcome: _Outcome, record: ProblemRecord, log: TraceLog, end_ns: int) -> None:
        try:
            run = self._run.result()
            if isinstance(run, TraceRun) and run.run_id:  # NoRun (tracking=none) has no run to trace into
                write_trace(run, outcome, record, log, end_ns, self.choice.text_chars)
        except Exception as exc:  # noqa: BLE001 - a trace is a view; the record is what counts
            if not self._warned:
                self._warned = True
                print(f"warning: could not write the trace of {record.key}: {type(exc).__name__}: {exc}", file=sys.stderr)

    def close(self) -> None:
        """Wait for every trace submitted to be in the store (the cell's run is finished after them)."""
        self._tx.shutdown(wait=True)
        if self._pending:
            import_mlflow().flush_trace_async_logging()


# How MLflow exports a cell's traces (a user's own values win): asynchronously, with the batch span
# processor, in batches of 256 spans (not MLflow's 5), so many spans go in one store transaction.
TRACE_EXPORT = {
    "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "true",
    "MLFLOW_USE_BATCH_SPAN_PROCESSOR": "true",
    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_SPAN_BATCH_SIZE": "256",
}
# One export worker, whatever the environment says: MLflow queues a batch's spans (`log_spans`) before
# the traces the batch ends (`start_trace`), and with several workers a trace could be created before
# its spans were stored; the store's answer then lacked the tag saying the spans are in the store, and
# MLflow uploaded the whole trace as a traces.json artifact too (half of a 5,000-problem cell's traces
# were stored twice). One worker runs the queue in order: the spans first, every time.
TRACE_EXPORT_WORKERS = {"MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS": "1"}


def _mlflow(uri: str) -> ModuleType:
    for name, value in TRACE_EXPORT.items():
        os.environ.setdefault(name, value)
    os.environ.update(TRACE_EXPORT_WORKERS)
    mlflow = import_mlflow()
    if mlflow.get_tracking_uri() != uri:
        mlflow.set_tracking_uri(uri)  # the trace exporter writes to the global store: the cell's
    return mlflow


# ----------------------------------------------------------------------------- the tree


@dataclass
class TurnSpan:
    index: int  # the transcript index of its input event
    agent: str
    role: str
    round: int
    start_ns: int
    end_ns: int
    events: list[tuple[int, JsonObject]] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)
    execs: list[ExecCall] = field(default_factory=list)


def turns_of(
    transcript: list[JsonObject], event_ns: list[int], start_ns: int
) -> tuple[list[TurnSpan], list[tuple[int, JsonObject]]]:
    """The agent turns of a transcript (a turn starts at an agent's input event and holds its
    events up to its next input), and the team's own notes."""
    turns: list[TurnSpan] = []
    current: dict[str, TurnSpan] = {}
    notes: list[tuple[int, JsonObject]] = []
    for i, e in enumerate(transcript):
        t = event_ns[i] if i < len(event_ns) else start_ns
        agent = str(e.get("agent", ""))
        if agent == "team":
            notes.append((t, e))
            continue
        turn = current.get(agent)
        if turn is None or e.get("kind") == "input":
            turn = TurnSpan(i, agent, str(e.get("role", "")), int(e.get("round", 0) or 0), t, t)
            turns.append(turn)
            current[agent] = turn
        turn.events.append((t, e))
        turn.end_ns = max(turn.end_ns, t)
    return turns, notes


def reply_text(call: ModelCall) -> str:
    """The reply's message text (JSON or a reassembled SSE stream)."""
    msg = reply_message(call)
    return str(msg.get("content") or "")


def reply_message(call: ModelCall) -> JsonObject:
    obj = reply_object(call)
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if choices and isinstance(choices[0], dict):
        return dict(choices[0].get("message") or {})
    return {}


def reply_object(call: ModelCall) -> object:
    """The reply body as an object; an SSE stream is folded into one chat completion."""
    text = call.reply.decode("utf-8", errors="replace")
    if not text.strip():
        return {}
    if not is_stream(text, call.content_type):
        try:
            return json.loads(text)
        except ValueError:
            return {"unparsed": text}
    content: list[str] = []
    tool_calls: dict[int, JsonObject] = {}
    usage, reason, model = None, None, None
    for event in stream_events(text):
        if not isinstance(event, dict):
            continue
        usage = event.get("usage") or usage
        model = event.get("model") or model
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            reason = choice.get("finish_reason") or reason
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = tool_calls.setdefault(
                    int(tc.get("index", 0)), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    message: JsonObject = {"role": "assistant", "content": "".join(content)}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    return {"model": model, "choices": [{"index": 0, "message": message, "finish_reason": reason}], "usage": usage}


def _place_call(call: ModelCall, turns: list[TurnSpan]) -> TurnSpan | None:
    """The turn a model call belongs to: the one it ran in (capture's context) when that turn is
    its role's; else its role's turn whose next event after the reply quotes it, else the one
    whose next event follows soonest; a call before its role's first turn logged goes to it."""
    for t in turns:
        if t.index == call.turn and t.role == call.role:
            return t
    own = [t for t in turns if t.role == call.role]
    same = [t for t in own if t.start_ns <= call.start_ns] or [t for t in turns if t.start_ns <= call.start_ns]
    if not same:
        return own[0] if own else None
    head = reply_text(call).strip()[:200]

    def score(t: TurnSpan) -> tuple[int, int]:
        after = [(ts, e) for ts, e in t.events if ts >= call.end_ns]
        if not after:
            return (2, -t.start_ns)
        quoted = bool(head) and any(head in str(e.get("content", "")) for _, e in after)
        return (0 if quoted else 1, after[0][0] - call.end_ns)

    return min(same, key=score)


def _place_exec(run: ExecCall, turns: list[TurnSpan]) -> TurnSpan | None:
    """The turn it ran in (capture's context), else the turn whose tool_call event carries this
    code (nearest in time), else the last turn started before it."""
    for t in turns:
        if t.index == run.turn:
            return t
    best: tuple[int, TurnSpan] | None = None
    for t in turns:
        for ts, e in t.events:
            if e.get("kind") != "tool_call" or run.code[:200] not in _tool_code(str(e.get("content", ""))):
                continue
            gap = abs(ts - run.start_ns)
            if best is None or gap < best[0]:
                best = (gap, t)
    if best is not None:
        return best[1]
    started = [t for t in turns if t.start_ns <= run.start_ns]
    return max(started, key=lambda t: t.start_ns) if started else None


def _tool_code(content: str) -> str:
    try:
        args = json.loads(content).get("args") or {}
        return str(args.get("code", "")) if isinstance(args, dict) else str(args)
    except (ValueError, AttributeError):
        return content


def clip(text: object, n: int) -> str:
    """`text` up to `n` characters; a longer one says how much is left out and where it is whole."""
    s = "" if text is None else str(text)
    if len(s) <= n:
        return s
    return s[:n] + f"... [+{len(s) - n} characters: the run's transcripts.jsonl]"


REPEAT_MIN = 200  # characters from which a text shown again in a trace is a reference to its first span


class Texts:
    """A trace's texts as its spans show them: each up to `n` characters, and one already shown in
    another span (a system prompt in every call of a turn, the program in the root's outputs) as a
    reference to that span; so is such a text inside a longer one (a turn's input holds the question
    and the earlier turns' replies, each shown before)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._first: dict[str, tuple[int, str]] = {}
        self._spans = 0

    def claim(self, value: str, label: str) -> None:
        """`value` is shown whole in the span `label`, written later: the spans before it refer to it."""
        if len(value) >= REPEAT_MIN:
            self._spans += 1
            self._first.setdefault(value, (self._spans, label))

    def span(self, label: str) -> Callable[..., str]:
        """The texts of one more span, named `label` in the references to it; `keep=True`: shown
        as it is even when shown before (the code a python_exec ran, in its first span)."""
        self._spans += 1
        me = self._spans

        def text(value: object, keep: bool = False) -> str:
            s = "" if value is None else str(value)
            if len(s) < REPEAT_MIN:
                return clip(s, self.n)
            first, where = self._first.setdefault(s, (me, label))
            if keep:
                return clip(s, self.n)
            if first != me:
                return _same(s, where)
            for known, (span, at) in sorted(self._first.items(), key=lambda k: -len(k[0])):
                if span != me and len(known) < len(s) and known in s:
                    s = s.replace(known, _same(known, at))
            return clip(s, self.n)

        return text


def _same(text: str, where: str) -> str:
    return f"[the same {len(text)} characters as in the span '{where}']"


def _request(call: ModelCall, text: Callable[..., str]) -> JsonObject:
    """The request's messages, each clipped, and its tools named, not defined (the same definitions
    and sampling settings go with every call of the cell: they are the run's params)."""
    try:
        body = json.loads(call.request.decode("utf-8", errors="replace")) if call.request else {}
    except ValueError:
        return {"unparsed": text(call.request.decode("utf-8", errors="replace"))}
    if not isinstance(body, dict):
        return {"body": text(json.dumps(body))}
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "system" and call.role:  # the same in every call of the role
            m["content"] = f"[the system prompt of {call.role}: the run's prompts.json]"
        elif isinstance(m, dict):
            _clip_message(m, text)
    out: JsonObject = {"messages": body.get("messages") or []}
    if isinstance(body.get("tools"), list):
        out["tools"] = [_tool_name(t) for t in body["tools"]]
    return out


def _reply(call: ModelCall, text: Callable[..., str]) -> object:
    """The reply's model and choices, each message clipped (its token usage is the span's attributes)."""
    obj = reply_object(call)
    if not isinstance(obj, dict):
        return obj
    if "unparsed" in obj:
        return {"unparsed": text(obj["unparsed"])}
    choices = []
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
            _clip_message(choice["message"], text)
            choices.append({k: choice.get(k) for k in ("index", "message", "finish_reason")})
    return {"model": obj.get("model"), "choices": choices}


def _clip_message(m: JsonObject, text: Callable[..., str]) -> None:
    if isinstance(m.get("content"), str):
        m["content"] = text(m["content"])
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            fn["arguments"] = _arguments(fn["arguments"], text)


def _arguments(raw: str, text: Callable[..., str]) -> str:
    """A tool call's JSON arguments with each text value shown as `text` shows it (a python_exec's
    code is the program shown before), still JSON; arguments that are not a JSON object, as one text."""
    try:
        args = json.loads(raw)
    except ValueError:
        return text(raw)
    if not isinstance(args, dict):
        return text(raw)
    return json.dumps({k: text(v) if isinstance(v, str) else v for k, v in args.items()}, ensure_ascii=False)


def _tool_name(tool: object) -> object:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name", tool) if isinstance(fn, dict) else tool


def trace_tags(record: ProblemRecord) -> dict[str, str]:
    return {
        "problem_key": record.key,
        "difficulty": record.difficulty or "",
        "passed": str(record.passed).lower(),
        "error": record.error or "",
        "stop_reason": record.stop_reason,
    }


@runtime_checkable
class TraceRun(Protocol):
    """The MLflow run a trace goes into (tracking.mlflow.CellRun)."""

    uri: str
    run_id: str
    experiment_id: str


class _Opening(Protocol):
    """The cell's run, still opening on a thread (a Future of tracking.run.Tracker)."""

    def result(self, timeout: float | None = None) -> object: ...


class _Outcome(Protocol):
    """What a trace reads of a judged problem (step.Judged): the problem, and what solving it left."""

    @property
    def problem(self) -> Problem: ...

    @property
    def solved(self) -> _Solved: ...


class _Solved(Protocol):
    @property
    def transcript(self) -> list[JsonObject]: ...

    @property
    def error(self) -> str | None: ...


def place(log: TraceLog, turns: list[TurnSpan]) -> tuple[list[ModelCall], list[ExecCall]]:
    """Give each captured model call and python_exec run its turn, in start order; -> those of none."""
    loose_calls: list[ModelCall] = []
    loose_execs: list[ExecCall] = []
    for call in sorted(log.calls, key=lambda c: c.start_ns):
        turn = _place_call(call, turns)
        (turn.calls if turn is not None else loose_calls).append(call)
    for ex in sorted(log.execs, key=lambda c: c.start_ns):
        turn = _place_exec(ex, turns)
        (turn.execs if turn is not None else loose_execs).append(ex)
    return loose_calls, loose_execs


def _add_event(span: LiveSpan, name: str, ts: int, content: str) -> None:
    from mlflow.entities import SpanEvent

    # mlflow declares SpanEvent.from_proto abstract, yet the class is the one its spans take
    span.add_event(SpanEvent(name=name, timestamp=ts, attributes={"content": content}))  # type: ignore[abstract]


@dataclass
class _Spans:
    """The spans of one trace, written in the order their texts are numbered (Texts: a text shown
    again refers to the span that showed it first). `mlflow` and the spans are MLflow's objects."""

    mlflow: ModuleType
    texts: Texts
    shown_code: set[str] = field(default_factory=set)  # code a python_exec ran: shown in the first span that ran it

    def root(
        self, run: TraceRun, problem: Problem, record: ProblemRecord, start_ns: int, notes: list[tuple[int, JsonObject]]
    ) -> tuple[LiveSpan, Callable[..., str]]:
        """The problem's span (ended last, by the caller) and its texts."""
        from mlflow.entities import SpanType
        from mlflow.tracing.constant import TraceMetadataKey

        text = self.texts.span(f"problem {record.key}")
        root = self.mlflow.start_span_no_context(
            name=f"problem {record.key}",
            span_type=SpanType.AGENT,
            inputs={
                "problem": record.key,
                "starter_code": text(problem.starter_code),
                "mode": record.mode,
                "fn_name": problem.tests.fn_name,
            },
            attributes={"topology_turns": record.turns, "rounds": record.rounds},
            tags=trace_tags(record),
            metadata={TraceMetadataKey.SOURCE_RUN: run.run_id},
            experiment_id=run.experiment_id,
            start_time_ns=start_ns,
        )
        for ts, e in notes:
            _add_event(root, "note", ts, text(e.get("content")))
        return root, text

    def model(self, parent: LiveSpan, call: ModelCall) -> None:
        from mlflow.entities import SpanStatusCode, SpanType
        from mlflow.tracing.constant import SpanAttributeKey

        text = self.texts.span(f"chat {call.role or 'model'}")
        usage = {
            "input_tokens": call.prompt_tokens,
            "output_tokens": call.completion_tokens,
            "total_tokens": call.prompt_tokens + call.completion_tokens,
        }
        span = self.mlflow.start_span_no_context(
            name=f"chat {call.role or 'model'}",
            span_type=SpanType.CHAT_MODEL,
            parent_span=parent,
            inputs=_request(call, text),
            start_time_ns=call.start_ns,
            attributes={"retries": call.retries, "http_status": call.status, SpanAttributeKey.CHAT_USAGE: usage},
        )
        span.end(
            outputs=_reply(call, text), end_time_ns=call.end_ns, status=SpanStatusCode.OK if call.ok else SpanStatusCode.ERROR
        )

    def exec(self, parent: LiveSpan, ex: ExecCall) -> None:
        from mlflow.entities import SpanStatusCode, SpanType

        text = self.texts.span("python_exec")
        code = text(ex.code, keep=ex.code not in self.shown_code)
        self.shown_code.add(ex.code)
        span = self.mlflow.start_span_no_context(
            name="python_exec",
            span_type=SpanType.TOOL,
            parent_span=parent,
            start_time_ns=ex.start_ns,
            inputs={"code": code, "stdin": text(ex.stdin)},
        )
        out = {
            "exit_code": ex.exit_code,
            "stdout": text(ex.stdout),
            "stderr": text(ex.stderr),
            "timed_out": ex.timed_out,
            "status": ex.status,
        }
        if ex.error:
            out = {"error": ex.error, "exit_code": ex.exit_code, "timed_out": ex.timed_out, "status": ex.status}
        span.end(
            outputs=out, end_time_ns=ex.end_ns, status=SpanStatusCode.ERROR if ex.error or ex.timed_out else SpanStatusCode.OK
        )

    def turn(self, root: LiveSpan, turn: TurnSpan) -> None:
        """An agent's turn: its input, the notes (and tool results no python_exec span shows), its
        model calls and tool runs in start order, its last reply."""
        from mlflow.entities import SpanType

        children: list[ModelCall | ExecCall] = sorted([*turn.calls, *turn.execs], key=lambda c: c.start_ns)
        start = min([turn.start_ns] + [c.start_ns for c in children])
        end = max([turn.end_ns] + [c.end_ns for c in children])
        first = next((e for _, e in turn.events if e.get("kind") == "input"), None)
        replies = [e for _, e in turn.events if e.get("kind") == "reply"]
        name = turn.agent + (f" · round {turn.round}" if turn.round else "")
        text = self.texts.span(name)
        span = self.mlflow.start_span_no_context(
            name=name,
            span_type=SpanType.AGENT,
            parent_span=root,
            start_time_ns=start,
            inputs={"input": text(first.get("content")) if first else ""},
            attributes={"agent": turn.agent, "round": turn.round, **({"role": turn.role} if turn.role != turn.agent else {})},
        )
        results = sum(e.get("kind") == "tool_result" for _, e in turn.events)
        shown = ("note",) if results <= len(turn.execs) else ("note", "tool_result")  # a python_exec's result: its span
        for ts, e in turn.events:
            if e.get("kind") in shown:
                _add_event(span, str(e["kind"]), ts, text(e.get("content")))
        for child in children:
            self.model(span, child) if isinstance(child, ModelCall) else self.exec(span, child)
        span.end(outputs={"reply": text(replies[-1].get("content")) if replies else ""}, end_time_ns=end)

    def judge(self, root: LiveSpan, record: ProblemRecord, start_ns: int, end_ns: int) -> None:
        from mlflow.entities import SpanStatusCode, SpanType

        verdict = record.verdict
        text = self.texts.span("judge")
        span = self.mlflow.start_span_no_context(
            name="judge",
            span_type=SpanType.EVALUATOR,
            parent_span=root,
            start_time_ns=start_ns,
            inputs={"program": text(record.program)},
            attributes={"profile": verdict.profile if verdict is not None else ""},
        )
        out = (
            {"error": record.error}
            if verdict is None
            else {
                "passed": verdict.passed,
                "tests_passed": verdict.tests_passed,
                "tests_run": verdict.tests_run,
                "n_tests": verdict.n_tests,
                "extracted": verdict.extracted,
                "results": [{**r.to_json(), "detail": text(r.detail)} for r in verdict.results],
            }
        )
        span.end(outputs=out, end_time_ns=end_ns, status=SpanStatusCode.ERROR if record.error else SpanStatusCode.OK)


def write_trace(run: TraceRun, outcome: _Outcome, record: ProblemRecord, log: TraceLog, end_ns: int, n: int) -> str:
    """One problem's trace in `run` (a tracking.mlflow.CellRun), each text up to `n` characters; returns its trace id."""
    from mlflow.entities import SpanStatusCode

    turns, notes = turns_of(list(outcome.solved.transcript or []), log.event_ns, log.start_ns)
    loose_calls, loose_execs = place(log, turns)
    texts = Texts(n)
    for ex in log.execs:  # the code a python_exec ran is shown in its span (the tool call before it refers to it)
        texts.claim(ex.code, "python_exec")
    spans = _Spans(_mlflow(run.uri), texts)
    root, root_text = spans.root(run, outcome.problem, record, log.start_ns, notes)
    for turn in turns:
        spans.turn(root, turn)
    for call in loose_calls:
        spans.model(root, call)
    for ex in loose_execs:
        spans.exec(root, ex)
    # a verdict, or judging's own failure (a problem that failed to solve was never judged)
    if record.verdict is not None or (outcome.solved.error is None and record.error):
        spans.judge(root, record, end_ns - int(record.judge_s * 1e9), end_ns)
    root.end(
        outputs={
            "program": root_text(record.program),
            "passed": record.passed,
            "stop_reason": record.stop_reason,
            "error": record.error,
        },
        end_time_ns=end_ns,
        status=SpanStatusCode.ERROR if record.error else SpanStatusCode.OK,
    )
    return str(root.trace_id)
