"""sequential_langgraph: a pipeline of stages (a LangGraph chain built from the role list).

Each stage sees the framed problem and every earlier stage's output; the last stage's
program is the submission, else the latest program an earlier stage produced.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from apps_bench.topologies.agents import run_agent, tools_for
from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import stage_input
from apps_bench.topologies.team import FlowRunner, Team, agent_names
from apps_bench.types import Attempt


class _State(TypedDict, total=False):
    outputs: Annotated[list[tuple[str, str]], operator.add]  # (role, reply) per finished stage


class SequentialLangGraph(FlowRunner):
    """turns = stages that ran, in order (the transcript's input events show the order)."""

    framework = "langgraph"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        from langgraph.graph import END, START, StateGraph

        names = agent_names(ctx.roles)
        team.data["agents"] = names

        def stage(i: int):
            role = ctx.roles[i]

            async def run(state: _State) -> dict:
                turn = await run_agent(
                    ctx,
                    team,
                    agent=names[i],
                    role=role,
                    user=stage_input(ctx.prompt, state.get("outputs", [])),
                    seed=agent_seed(ctx.seed, i),
                    tools=tools_for(ctx, role),
                )
                return {"outputs": [(role, turn.reply)]}

            return run

        graph = StateGraph(_State)
        previous = START
        for i, name in enumerate(names):
            node = f"{i}_{name}"
            graph.add_node(node, stage(i))
            graph.add_edge(previous, node)
            previous = node
        graph.add_edge(previous, END)
        await graph.compile(name=self.name).ainvoke({"outputs": []}, config={"recursion_limit": len(names) + 2})

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        names = team.data.get("agents", [])
        last = [t for t in team.turns if names and t.agent == names[-1]]
        program = (last[-1].program if last else None) or team.latest_program()
        return team.attempt(program, rounds=1)
