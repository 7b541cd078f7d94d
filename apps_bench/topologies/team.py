"""Framework-neutral bookkeeping every runner shares: turns, limits, errors, the Attempt.

A runner's flow records each agent turn in a `Team` as it happens (so a flow cut
short by the wall clock still leaves what exists), runs under `run_guarded`, and
ends with `Team.attempt(...)`. Nothing here imports a framework.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Sequence

from apps_bench.config.schema import TopologyConfig
from apps_bench.errors import AppsBenchError
from apps_bench.task import extract_program
from apps_bench.topologies.base import SolveContext
from apps_bench.types import Attempt, Candidate, Usage, Vote


def extract(text: str | None) -> str | None:
    """The program in a reply, by the one extraction rule the judge uses (apps_bench.task)."""
    if not text:
        return None

    return extract_program(text)


@dataclass
class Turn:
    """One agent's turn: from its input to its last reply (or the cap that ended it)."""

    agent: str
    role: str
    round: int = 0
    reply: str = ""  # the last non-empty reply text
    program: str | None = None  # from the last reply that held one
    steps: int = 0  # model calls in this turn
    tool_calls: int = 0
    stop_reason: str = "running"  # running | done | step_cap | time_limit | turn_cap | ...

    def add_reply(self, text: str) -> None:
        if text and text.strip():
            self.reply = text
            program = extract(text)
            if program:
                self.program = program


class StopFlow(AppsBenchError):
    """Raised inside a flow to end the whole attempt early (e.g. a wall-clock check)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Team:
    ctx: SolveContext
    turns: list[Turn] = field(default_factory=list)
    stop_reason: str = "done"
    error: str | None = None
    data: dict = field(default_factory=dict)  # flow-specific per-problem state (agent order, rounds done, ...)

    def start(self, agent: str, role: str, round: int = 0) -> Turn:
        turn = Turn(agent, role, round)
        self.turns.append(turn)
        return turn

    def latest_program(self, roles: Sequence[str] | None = None) -> str | None:
        """The most recent program any turn produced (optionally only turns of `roles`)."""
        for turn in reversed(self.turns):
            if turn.program and (roles is None or turn.role in roles):
                return turn.program
        return None

    def stop(self, reason: str, note: str = "") -> None:
        """Record the first reason the attempt ended early (later ones do not overwrite it)."""
        if self.stop_reason == "done":
            self.stop_reason = reason
            self.ctx.log("team", "team", "note", note or f"attempt stopped: {reason}")

    def attempt(
        self,
        program: str | None,
        *,
        candidates: list[Candidate] | None = None,
        vote: Vote | None = None,
        rounds: int = 0,
        turns: int | None = None,
    ) -> Attempt:
        stop = self.stop_reason
        if stop == "done":
            capped = [t.stop_reason for t in self.turns if t.stop_reason not in ("done", "running")]
            stop = capped[0] if capped else "done"
        if candidates is None:
            candidates = [Candidate(t.agent, t.program) for t in self.turns]
        return Attempt(
            program=program,
            candidates=candidates,
            vote=vote,
            transcript=self.ctx.transcript,
            usage=self.ctx.usage,
            rounds=rounds,
            turns=len(self.turns) if turns is None else turns,
            stop_reason=stop,
            error=self.error,
        )


CONTEXT_HINTS = ("context length", "context window", "maximum context", "too long", "too many tokens")


async def run_guarded(ctx: SolveContext, team: Team, flow: Awaitable[object]) -> None:
    """Run a flow under the per-problem wall clock; turn its expected endings into record fields.

    - wall clock -> stop_reason "time_limit" (the turns recorded so far stay);
    - a request the endpoint rejects for its length -> "context_limit" (the model's
      conversation outgrew it: a result, not an outage);
    - any other API failure left after the client's retries -> `error` (infrastructure,
      never scored as a wrong answer).
    """
    import openai

    left = ctx.time_left()
    try:
        if left <= 0:
            raise StopFlow("time_limit")
        await asyncio.wait_for(flow, timeout=left)
    except TimeoutError:
        team.stop("time_limit", f"wall-clock limit reached ({ctx.config.time_limit_s}s)")
    except StopFlow as stop:
        team.stop(stop.reason)
    except openai.BadRequestError as exc:
        msg = str(exc)
        if any(h in msg.lower() for h in CONTEXT_HINTS):
            team.stop("context_limit", f"model rejected the conversation: {msg[:300]}")
        else:
            team.error = f"model request rejected: {msg[:500]}"
            team.stop("error", team.error)
    except openai.APIError as exc:
        team.error = f"model endpoint failed: {type(exc).__name__}: {str(exc)[:500]}"
        team.stop("error", team.error)
    finally:
        if asyncio.iscoroutine(flow):
            flow.close()  # never-started coroutine (time already up): no "never awaited" warning
    if team.stop_reason == "time_limit" and team.error is None:
        team.error = unanswered_error(ctx.usage, float(ctx.config.time_limit_s))
        if team.error:
            ctx.log("team", "team", "note", team.error)
    for turn in team.turns:
        if turn.stop_reason == "running":
            turn.stop_reason = team.stop_reason if team.stop_reason != "done" else "done"


def unanswered_error(usage: Usage, limit_s: float) -> str | None:
    """Why a problem that hit its time cap is infrastructure, not a wrong answer (None if it is not).

    The model endpoint, not the team, ran out the clock when, at the cap, a model call the
    problem made was still unanswered (in flight, or cancelled by the cap itself), or when
    no call had been answered at all. A cap that falls between answered calls (the team
    talked or ran tools too long) is the team's result and is scored.
    """
    unanswered = int(getattr(usage, "in_flight", 0)) + int(getattr(usage, "cancelled_calls", 0))
    if unanswered:
        return (
            f"model endpoint did not answer: the {limit_s:g}s time cap was reached with {unanswered} model "
            f"call(s) unanswered ({usage.model_calls} answered) - infrastructure, retried on the next run"
        )
    if not usage.model_calls:
        return f"model endpoint did not answer: the {limit_s:g}s time cap was reached before any model call was answered"
    return None


class FlowRunner:
    """Base of every runner: `solve` = run `flow` under the limits, then `finish` -> Attempt.

    A runner object is shared by all problems of a cell (they run concurrently), so
    per-problem state lives in the Team (`team.data`), never on `self`.
    """

    framework = ""

    def __init__(self, cfg: TopologyConfig):
        self.cfg = cfg
        self.name = cfg.name

    async def solve(self, ctx: SolveContext) -> Attempt:
        team = Team(ctx)
        await run_guarded(ctx, team, self.flow(ctx, team))
        return self.finish(ctx, team)

    async def flow(self, ctx: SolveContext, team: Team) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:  # pragma: no cover - abstract
        raise NotImplementedError


def agent_names(roles: Sequence[str]) -> list[str]:
    """Unique agent names for a role list: a repeated role gets an index (coder_0, coder_1, ...)."""
    repeated = {r for r in roles if list(roles).count(r) > 1}
    return [f"{r}_{i}" if r in repeated else r for i, r in enumerate(roles)]


def final_candidates(team: Team, agents: Sequence[str]) -> list[Candidate]:
    """Each agent's candidate, in agent order: the program of its latest turn that held one.

    The vote counts one program per agent, its most recent: a debater whose last-round reply
    has no code ("I keep my answer") still stands by the program it wrote in an earlier round,
    so that program votes, not nothing. An agent that never wrote code does not vote.
    """
    out = []
    for name in agents:
        programs = [t.program for t in team.turns if t.agent == name and t.program]
        out.append(Candidate(name, programs[-1] if programs else None))
    return out
