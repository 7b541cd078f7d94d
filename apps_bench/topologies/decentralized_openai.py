"""Decentralized debate on the bare OpenAI Python SDK: the framework-free sibling of
`decentralized_langgraph`.

N debaters x R rounds. Round 0: every debater solves alone. Each later round: every
debater sees its own and the other debaters' previous answers (messages.debate_input,
the same text the LangGraph sibling sends) and may revise. Debaters of a round run
concurrently (asyncio.gather), each with its own seed (agent_seed). The team submits
the most common program among the debaters' latest programs (team.final_candidates, vote.py).

Each turn is a hand-written chat-completions tool loop with `python_exec` as a function
tool (for the roles in `tool_roles`), with the LangGraph loop's rules: at most
`max_steps` model calls, the turn ends at the first reply without a tool call, and a
turn cut by the cap keeps its last non-empty reply.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Awaitable, Sequence, TypeVar

from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import cap_note, debate_input
from apps_bench.topologies.team import FlowRunner, StopFlow, Team, Turn, agent_names, final_candidates
from apps_bench.topologies.vote import most_common_program
from apps_bench.types import Attempt, JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.sandbox.tool import PythonExecTool

T = TypeVar("T")


class DecentralizedOpenAI(FlowRunner):
    """Debate with a hand-written chat-completions tool loop (no agent framework)."""

    framework = "openai"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        names = agent_names(ctx.roles)
        agents = [(name, role, agent_seed(ctx.seed, i)) for i, (name, role) in enumerate(zip(names, ctx.roles))]
        team.data["agents"] = names
        team.data["rounds"] = 0
        # a client per debater: each call is recorded as its debater's role
        clients = {name: ctx.models.async_openai(role=role) for name, role, _ in agents}
        try:
            previous: dict[str, str] = {}
            for rnd in range(max(1, int(ctx.config.rounds))):
                turns = [
                    self._turn(
                        ctx,
                        team,
                        clients[name],
                        name,
                        role,
                        seed,
                        rnd,
                        debate_input(
                            ctx.prompt,
                            rnd,
                            previous.get(name, "") if rnd else None,
                            [(peer, previous.get(peer, "")) for peer in names if peer != name] if rnd else [],
                        ),
                    )
                    for name, role, seed in agents
                ]
                previous = {turn.agent: turn.reply for turn in await _all_or_none(turns)}
                team.data["rounds"] = rnd + 1
        finally:
            for client in clients.values():
                await client.close()

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        # Each agent's candidate: its latest program, from any round (a round cut by the clock keeps what exists).
        candidates = final_candidates(team, team.data.get("agents", agent_names(ctx.roles)))
        vote, program = most_common_program(candidates)
        return team.attempt(program, candidates=candidates, vote=vote, rounds=team.data.get("rounds", 0))

    async def _turn(
        self, ctx: SolveContext, team: Team, client: Any, agent: str, role: str, seed: int, rnd: int, user: str
    ) -> Turn:
        """One agent turn: system = the role's prompt, user = `user`; loops while it calls tools."""
        tool = ctx.tool
        use_tool = role in (ctx.config.tool_roles or ())
        spec = [
            {
                "type": "function",
                "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
            }
        ]
        turn = team.start(agent, role, rnd)
        cap = int(ctx.config.max_steps)
        params = ctx.models.request_params(seed)
        messages: list[JsonObject] = [
            {"role": "system", "content": ctx.prompts[role]},
            {"role": "user", "content": user},
        ]
        ctx.log(agent, role, "input", user, rnd)
        while True:
            if ctx.time_left() <= 0:
                raise StopFlow("time_limit")
            turn.steps += 1
            extra = {"tools": spec} if use_tool else {}
            resp = await client.chat.completions.create(model=ctx.models.model_id, messages=messages, **extra, **params)
            msg = resp.choices[0].message
            text = msg.content or ""
            calls = list(msg.tool_calls or []) if use_tool else []
            if text.strip():
                ctx.log(agent, role, "reply", text, rnd)
            turn.add_reply(text)
            for call in calls:
                ctx.log(
                    agent,
                    role,
                    "tool_call",
                    json.dumps({"name": call.function.name, "args": _args(call.function.arguments)}),
                    rnd,
                )
            if not calls:
                turn.stop_reason = "done"
                return turn
            if turn.steps >= cap:
                turn.stop_reason = "step_cap"
                ctx.log(agent, role, "note", cap_note("step cap", cap), rnd)
                return turn
            messages.append(
                {
                    "role": "assistant",
                    "content": text,
                    "tool_calls": [
                        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                        for c in calls
                    ],
                }
            )
            for call in calls:
                result = await _run_tool(tool, call.function.name, call.function.arguments)
                turn.tool_calls += 1
                ctx.log(agent, role, "tool_result", result, rnd)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def _all_or_none(coros: Sequence[Awaitable[T]]) -> list[T]:
    """The peers of a round, concurrently. If one fails (e.g. the endpoint is down) the others
    are cancelled before the error propagates, so no peer keeps calling a closed client."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _args(arguments: str) -> JsonObject | str:
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


async def _run_tool(tool: PythonExecTool, name: str, arguments: str) -> str:
    """Run python_exec; a malformed call becomes a message to the model, not a crash."""
    if name != tool.name:
        return f"error: no tool named {name!r}; available: {[tool.name]}"
    args = _args(arguments)
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return f"error: bad arguments for {tool.name}: expected a JSON object with a string 'code' (and optional 'stdin'), got {arguments!r}"
    return await tool.acall(args["code"], str(args.get("stdin") or ""))
