"""single: one solver in a LangGraph ReAct loop with python_exec; its last reply is the submission."""

from __future__ import annotations

from apps_bench.topologies.agents import run_agent, tools_for
from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.team import FlowRunner, Team
from apps_bench.types import Attempt


class SingleTopology(FlowRunner):
    """turns = the solver's model steps (what max_steps caps)."""

    framework = "langgraph"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        role = ctx.roles[0]
        await run_agent(
            ctx, team, agent=role, role=role, user=ctx.prompt, seed=agent_seed(ctx.seed, 0), tools=tools_for(ctx, role)
        )

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        turn = team.turns[0] if team.turns else None
        return team.attempt(turn.program if turn else None, rounds=1, turns=turn.steps if turn else 0)
