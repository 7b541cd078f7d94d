"""centralized_langgraph: a manager delegates to workers through a `delegate` tool (hub and spoke).

The manager is a LangGraph ReAct agent whose only tool is `delegate(worker, instruction)`;
each delegation runs the named worker as its own agent on the problem plus the
instruction, and its reply is the tool result, seen by the manager only. max_turns
caps the delegations. The submission is the manager's final program, else the last
program a worker produced.
"""

from __future__ import annotations

from typing import Any

from apps_bench.topologies.agents import run_agent, tools_for
from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import (
    DELEGATE_TOOL,
    cap_note,
    delegate_description,
    delegate_parameters,
    worker_input,
)
from apps_bench.topologies.team import FlowRunner, Team, extract
from apps_bench.types import Attempt


class CentralizedLangGraph(FlowRunner):
    """turns = delegations made (what max_turns caps); roles[0] is the manager."""

    framework = "langgraph"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        from langchain_core.tools import StructuredTool

        manager, workers = ctx.roles[0], list(ctx.roles[1:])
        if len(set(workers)) != len(workers) or manager in workers:
            raise ValueError(f"centralized roles must be distinct, got {ctx.roles}")
        cap = int(ctx.config.max_turns)
        state: dict[str, int] = {"delegations": 0, "refused": False}
        team.data.update(manager=manager, workers=workers, state=state)

        async def delegate(worker: str, instruction: str, **_ignored: Any) -> str:
            if worker not in workers:
                return f"error: no worker named {worker!r}; your workers are {workers}"
            if state["delegations"] >= cap:
                state["refused"] = True
                return "not delegated: " + cap_note("delegation cap", cap)
            state["delegations"] += 1
            turn = await run_agent(
                ctx,
                team,
                agent=worker,
                role=worker,
                user=worker_input(ctx.prompt, str(instruction)),
                seed=agent_seed(ctx.seed, ctx.roles.index(worker)),
                tools=tools_for(ctx, worker),
                round=state["delegations"],
            )
            return turn.reply or "(the worker gave no answer)"

        tool = StructuredTool.from_function(
            coroutine=delegate,
            name=DELEGATE_TOOL,
            description=delegate_description(workers),
            args_schema=delegate_parameters(workers),
        )

        def over_cap() -> str | None:
            return "turn_cap" if state["refused"] else None

        turn = await run_agent(
            ctx,
            team,
            agent=manager,
            role=manager,
            user=ctx.prompt,
            seed=agent_seed(ctx.seed, 0),
            # cap delegating steps, one step whose delegation is refused (-> turn_cap), one final answer
            tools=[tool],
            max_steps=cap + 2,
            stop_check=over_cap,
        )
        if turn.stop_reason == "turn_cap":
            team.stop("turn_cap", cap_note("delegation cap", cap))

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        manager = team.data.get("manager")
        mturn = next((t for t in team.turns if t.agent == manager), None)
        # the manager's final answer (a reply without a delegation), else the last worker program;
        # a program the manager only quoted in an instruction is the last resort
        final = extract(mturn.reply) if mturn and mturn.stop_reason == "done" else None
        program = final or team.latest_program(team.data.get("workers", [])) or (mturn.program if mturn else None)
        state = team.data.get("state", {})
        return team.attempt(program, rounds=1, turns=state.get("delegations", 0))
