"""independent: N coders solve alone in parallel (a LangGraph Send fan-out); the most common program wins."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from apps_bench.topologies.agents import run_agent, tools_for
from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.team import FlowRunner, Team, agent_names, final_candidates
from apps_bench.topologies.vote import most_common_program
from apps_bench.types import Attempt


class _State(TypedDict, total=False):
    finished: Annotated[list[str], operator.add]


class IndependentTopology(FlowRunner):
    """rounds = 1, turns = agents that ran; no agent sees another's work."""

    framework = "langgraph"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send

        names = agent_names(ctx.roles)
        team.data["agents"] = names

        async def coder(payload: dict) -> dict:
            i = payload["i"]
            role = ctx.roles[i]
            await run_agent(
                ctx,
                team,
                agent=names[i],
                role=role,
                user=ctx.prompt,
                seed=agent_seed(ctx.seed, i),
                tools=tools_for(ctx, role),
            )
            return {"finished": [names[i]]}

        graph = StateGraph(_State)
        graph.add_node("coder", coder)  # type: ignore[arg-type]  # LangGraph's types want a state schema as the node's input type, but it would also read that annotation as an extra input schema: the node takes Send's payload, a plain dict
        graph.add_conditional_edges(START, lambda _s: [Send("coder", {"i": i}) for i in range(len(names))], ["coder"])
        graph.add_edge("coder", END)
        await graph.compile(name=self.name).ainvoke({}, config={"recursion_limit": 4})

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        candidates = final_candidates(team, team.data.get("agents", []))
        vote, program = most_common_program(candidates)
        return team.attempt(program, candidates=candidates, vote=vote, rounds=1)
