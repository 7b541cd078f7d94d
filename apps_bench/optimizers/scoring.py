"""Scoring candidates: the `Evaluator` every method calls, and the protocol wrapper that
puts the gate, the paired seeds, the rollout cache and the budget in front of the
pipeline.

Layering (why two protocols):
- `Runner` is the only thing the pipeline must implement: run the real topology with a
  given PromptSet on (problem key, request seed) jobs, concurrently, judge each program
  on the problem's training tests with the eval cell's settings, and return one
  `Rollout` per job, never raising for one problem (an infrastructure failure is a
  Rollout with `error` set).
- `ProtocolEvaluator` wraps a Runner into an `Evaluator`: it refuses eval keys, derives
  the request seed from (run seed, key), serves repeats from the cache, admits a batch
  only while the budget lasts and charges each distinct rollout once per run.
Methods (MASPO, GEPA) only ever see an `Evaluator`, so tests drive them with synthetic
ones and the real pipeline plugs in later without touching them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence

from apps_bench.errors import AppsBenchError
from apps_bench.optimizers.cache import RolloutCache, rollout_key, stable_hash
from apps_bench.optimizers.protocol import Budget, ProblemKey, ScoringGate, make_key, request_seed
from apps_bench.topologies.base import PromptSet
from apps_bench.types import Attempt, JsonObject, Outcome, Problem, TranscriptEvent, Verdict

CLIP = 2000  # characters kept of one test input/expected output in feedback


@dataclass(frozen=True)
class RoleTrace:
    """One agent's turn in one attempt: what it received, what it replied, its tool calls."""

    agent: str
    role: str
    input: str
    output: str
    tool_calls: tuple[str, ...] = ()
    round: int = 0


@dataclass(frozen=True)
class FailingTest:
    """The first failing *training* test (the only test text an optimizer may see)."""

    index: int
    input: str
    expected: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class Rollout:
    """One pipeline run on one problem, judged: what optimizers read and the cache stores."""

    key: ProblemKey
    seed: int
    program: str | None = None
    passed: bool = False
    pass_fraction: float = 0.0
    tests_passed: int = 0
    n_tests: int = 0
    first_failure: FailingTest | None = None
    traces: tuple[RoleTrace, ...] = ()
    task_tokens: int = 0  # spent: answers replayed from the run's cache are not in it
    model_calls: int = 0
    error: str | None = None  # infrastructure failure (never cached)
    replayed_tokens: int = 0  # tokens of the answers replayed for this rollout (reported apart, not charged)
    cached: bool = False  # served from the rollout cache (set on return, not stored)

    @property
    def score(self) -> float:
        return example_score(self)

    def outputs_of(self, role: str) -> list[str]:
        return [t.output for t in self.traces if t.role == role or t.agent == role]

    def to_json(self) -> JsonObject:
        d = asdict(self)
        d["key"] = list(self.key)
        d.pop("cached")
        return d

    @classmethod
    def from_json(cls, d: JsonObject, *, cached: bool = False) -> Rollout:
        ff = d.get("first_failure")
        return cls(
            key=make_key(*d["key"]),
            seed=int(d["seed"]),
            program=d.get("program"),
            passed=bool(d.get("passed", False)),
            pass_fraction=float(d.get("pass_fraction", 0.0)),
            tests_passed=int(d.get("tests_passed", 0)),
            n_tests=int(d.get("n_tests", 0)),
            first_failure=FailingTest(**ff) if ff else None,
            traces=tuple(RoleTrace(**{**t, "tool_calls": tuple(t.get("tool_calls", ()))}) for t in d.get("traces", ())),
            task_tokens=int(d.get("task_tokens", 0)),
            model_calls=int(d.get("model_calls", 0)),
            error=d.get("error"),
            replayed_tokens=int(d.get("replayed_tokens", 0)),
            cached=cached,
        )


# --------------------------------------------------------------------------- objective

TIE_EPS = 1e-3  # pass fraction's weight in a per-example score: lexicographic for batches < 1000


def example_score(r: Rollout) -> float:
    """Strict pass (0/1) with the pass fraction as a tie-breaker that never outweighs a pass."""
    return (1.0 if r.passed else 0.0) + TIE_EPS * float(r.pass_fraction)


PERFECT_SCORE = 1.0 + TIE_EPS


class Objective(NamedTuple):
    """Mean strict pass, then mean pass fraction: compare with `>` (tuple order)."""

    strict: float
    fraction: float


def objective(rollouts: Sequence[Rollout]) -> Objective:
    """Over the rollouts that ran: an infrastructure failure is left out, never scored as wrong."""
    rollouts = [r for r in rollouts if not r.error]
    if not rollouts:
        return Objective(0.0, 0.0)
    n = len(rollouts)
    return Objective(sum(r.passed for r in rollouts) / n, sum(r.pass_fraction for r in rollouts) / n)


def program_win(a: tuple[bool, float], b: tuple[bool, float]) -> float:
    """1 if a beats b on (strict pass, pass fraction), 0 if it loses, 0.5 on an exact tie."""
    if a == b:
        return 0.5
    return 1.0 if a > b else 0.0


# --------------------------------------------------------------------------- protocols


class Evaluator(Protocol):
    """What every method calls to score a PromptSet on problems (train or val keys)."""

    def evaluate(self, prompt_set: PromptSet, keys: Sequence[ProblemKey], *, capture_traces: bool = True) -> list[Rollout]: ...


class Runner(Protocol):
    """What the pipeline implements: run jobs (key, request seed) with a PromptSet, judged."""

    def run_batch(self, prompt_set: PromptSet, jobs: Sequence[tuple[ProblemKey, int]]) -> list[Rollout]: ...


class ProgramJudge(Protocol):
    """Judge any program on a problem's training tests (MASPO's execution-grounded reward
    for intermediate outputs that hold a program). Returns (strict pass, pass fraction)."""

    def __call__(self, key: ProblemKey, program: str | None) -> tuple[bool, float]: ...


# --------------------------------------------------------------------------- protocol evaluator


@dataclass
class EvalRecord:
    """One evaluate() call, for the logs: which candidate, which keys, what it cost."""

    prompt_hash: str
    keys: list[ProblemKey]
    fresh: int
    cached: int
    charged: int
    strict: float
    fraction: float
    retried: int = 0  # rollouts re-run after an infrastructure error
    infra_errors: int = 0  # rollouts still failed for infrastructure reasons (never scored as wrong)


class InfrastructureDown(RuntimeError, AppsBenchError):
    """Every fresh rollout of a batch failed for an infrastructure reason (model or sandbox down):
    stop instead of spending budget on failures; a rerun resumes through the cache."""


@dataclass
class ProtocolEvaluator:
    """Gate + paired seeds + cache + budget in front of a `Runner` (see module doc).

    A rollout that failed for an infrastructure reason (model calls failing after the
    client's retries, a sandbox failure) is re-run up to `infra_retries` times before it is
    charged (once, like any rollout; a batch where every rollout failed is not retried: the
    endpoint or sandbox is down, and the run stops); what still fails comes back with `error` set for the
    method to exclude (MASPO: a tie; GEPA: stops), never as a wrong answer."""

    runner: Runner
    cache: RolloutCache
    budget: Budget
    gate: ScoringGate
    run_seed: int
    model: JsonObject
    settings: JsonObject
    on_evaluate: Callable[[EvalRecord], None] | None = None
    infra_retries: int = 1
    _charged: set[str] = field(default_factory=set, repr=False)

    def seed_for(self, key: ProblemKey) -> int:
        return request_seed(self.run_seed, key)

    def evaluate(self, prompt_set: PromptSet, keys: Sequence[ProblemKey], *, capture_traces: bool = True) -> list[Rollout]:
        keys = [make_key(*k) for k in keys]
        self.gate.check(keys)
        ckeys = {k: rollout_key(prompt_set.texts, k, self.seed_for(k), self.model, self.settings) for k in keys}
        found: dict[ProblemKey, Rollout] = {}
        for k in dict.fromkeys(keys):
            hit = self.cache.get(ckeys[k])
            if hit is not None:
                found[k] = Rollout.from_json(hit, cached=True)
        uncharged = [k for k in dict.fromkeys(keys) if ckeys[k] not in self._charged]
        self.budget.admit(len(uncharged))  # raises BudgetExhausted before anything runs
        todo = [k for k in dict.fromkeys(keys) if k not in found]
        fresh_keys: set[ProblemKey] = set()
        retried = 0
        if todo:
            run = todo
            for attempt in range(1 + max(0, int(self.infra_retries))):
                if attempt:
                    failed = [k for k in run if found[k].error]
                    if not failed or (attempt >= 2 and len(todo) >= 2 and len(failed) == len(todo)):
                        break  # nothing to retry, or everything failed on a retry too: down, not flaky (stop below)
                    run = failed
                    retried += len(run)
                self._run(prompt_set, run, ckeys, found)
            fresh_keys.update(todo)
            if len(todo) >= 2 and all(found[k].error for k in todo):
                for k in todo:  # what ran is spent
                    if ckeys[k] not in self._charged:
                        self._charged.add(ckeys[k])
                        self.budget.charge_rollout(found[k].task_tokens, fresh=True, replayed=found[k].replayed_tokens)
                raise InfrastructureDown(
                    f"all {len(todo)} rollouts of the batch failed for infrastructure reasons, e.g. "
                    f"{found[todo[0]].error!r}; fix the endpoint/sandbox and rerun: finished rollouts come from the cache"
                )
        for k in uncharged:
            self._charged.add(ckeys[k])
            self.budget.charge_rollout(found[k].task_tokens, fresh=k in fresh_keys, replayed=found[k].replayed_tokens)
        out = [found[k] for k in keys]
        if self.on_evaluate is not None:
            ob = objective(out)
            self.on_evaluate(
                EvalRecord(
                    prompt_hash=prompt_hash(prompt_set),
                    keys=keys,
                    fresh=len(fresh_keys),
                    cached=len(set(keys)) - len(fresh_keys),
                    charged=len(uncharged),
                    strict=ob.strict,
                    fraction=ob.fraction,
                    retried=retried,
                    infra_errors=sum(1 for r in out if r.error),
                )
            )
        return out

    def _run(
        self, prompt_set: PromptSet, keys: list[ProblemKey], ckeys: Mapping[ProblemKey, str], found: dict[ProblemKey, Rollout]
    ) -> None:
        results = self.runner.run_batch(prompt_set, [(k, self.seed_for(k)) for k in keys])
        if len(results) != len(keys):
            raise RuntimeError(f"runner returned {len(results)} rollouts for {len(keys)} jobs")
        for k, r in zip(keys, results):
            if tuple(r.key) != k:
                raise RuntimeError(f"runner returned a rollout for {r.key} where {k} was expected")
            if r.error is None:
                self.cache.put(ckeys[k], r.to_json())
            found[k] = replace(r, cached=False)

    def state(self) -> JsonObject:
        """Charged rollouts and budget, for a method that persists its own state (GEPA run_dir)."""
        return {"charged": sorted(self._charged), "budget": self.budget.to_json()}

    def restore(self, state: JsonObject) -> None:
        self._charged = set(state.get("charged", ()))
        b = state.get("budget", {})
        for k in Budget._FIELDS:
            if k in b and not k.startswith("max_"):
                setattr(self.budget, k, b[k])


def prompt_hash(prompt_set: PromptSet | Mapping[str, str]) -> str:
    texts = prompt_set.texts if isinstance(prompt_set, PromptSet) else prompt_set
    return stable_hash(dict(texts))[:12]


# --------------------------------------------------------------------------- building rollouts


def traces_from_transcript(events: Iterable[TranscriptEvent]) -> tuple[RoleTrace, ...]:
    """Group a transcript into one RoleTrace per (agent, round), in first-appearance order.

    input = the texts the agent received (joined), output = its last reply, tool calls
    and their results in order, so an optimizer sees incoming context and output per role.
    """
    order: list[tuple[str, int]] = []
    acc: dict[tuple[str, int], JsonObject] = {}
    for ev in events:
        k = (ev.agent, ev.round)
        if k not in acc:
            order.append(k)
            acc[k] = {"role": ev.role, "inputs": [], "output": "", "tools": []}
        a = acc[k]
        if ev.kind == "input":
            a["inputs"].append(ev.content)
        elif ev.kind == "reply":
            a["output"] = ev.content
        elif ev.kind in ("tool_call", "tool_result"):
            a["tools"].append(f"{ev.kind}: {ev.content}")
    return tuple(
        RoleTrace(
            agent=k[0],
            role=acc[k]["role"],
            input="\n\n".join(acc[k]["inputs"]),
            output=acc[k]["output"],
            tool_calls=tuple(acc[k]["tools"]),
            round=k[1],
        )
        for k in order
    )


def _clip(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= CLIP else text[:CLIP] + f"... [{len(text) - CLIP} more characters]"


def first_failing_test(problem: Problem, verdict: Verdict) -> FailingTest | None:
    for res in verdict.results:
        if res.outcome != Outcome.PASS:
            i = res.index
            inp = problem.tests.inputs[i] if 0 <= i < len(problem.tests) else ""
            exp = problem.tests.outputs[i] if 0 <= i < len(problem.tests) else ""
            return FailingTest(i, _clip(inp), _clip(exp), res.outcome.value, _clip(res.detail))
    return None


def rollout_from_attempt(problem: Problem, seed: int, attempt: Attempt, verdict: Verdict) -> Rollout:
    """The Runner's last step: an Attempt and its Verdict on the training tests -> Rollout."""
    n = verdict.n_tests or len(problem.tests)
    return Rollout(
        key=problem.key,
        seed=int(seed),
        program=attempt.program,
        passed=bool(verdict.passed),
        pass_fraction=(verdict.tests_passed / n) if n else 0.0,
        tests_passed=verdict.tests_passed,
        n_tests=n,
        first_failure=None if verdict.passed else first_failing_test(problem, verdict),
        traces=traces_from_transcript(attempt.transcript),
        task_tokens=attempt.usage.total_tokens,
        model_calls=attempt.usage.model_calls,
        error=attempt.error,
    )
