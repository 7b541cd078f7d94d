"""decentralized_langgraph: a debate of N peers over R rounds (LangGraph Send fan-out per round).

Round 0: every peer answers alone. Round r > 0: every peer sees its own and the others'
round r-1 answers and may revise. Peers of a round run concurrently, each with its own
seed. The submission is the most common program among the peers' latest programs (team.final_candidates).
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from apps_bench.topologies.agents import run_agent, tools_for
from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import debate_input
from apps_bench.topologies.team import FlowRunner, Team, agent_names, final_candidates
from apps_bench.topologies.vote import most_common_program
from apps_bench.types import Attempt


class _State(TypedDict, total=False):
    round: int
    answers: Annotated[list[tuple[int, int, str]], operator.add]  # (round, peer index, reply)


class DecentralizedLangGraph(FlowRunner):
    """rounds = rounds completed; turns = peer turns (N x R when nothing cuts it short)."""

    framework = "langgraph"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send

        names = agent_names(ctx.roles)
        rounds = max(1, int(ctx.config.rounds))
        team.data.update(agents=names, rounds_done=0)

        async def debater(payload: dict) -> dict:
            i, r = payload["i"], payload["round"]
            role = ctx.roles[i]
            prev = payload["previous"]  # peer index -> reply of round r-1
            user = debate_input(
                ctx.prompt,
                r,
                prev.get(i) if r else None,
                [(names[j], prev[j]) for j in range(len(names)) if j != i and j in prev],
            )
            turn = await run_agent(
                ctx,
                team,
                agent=names[i],
                role=role,
                user=user,
                seed=agent_seed(ctx.seed, i),
                tools=tools_for(ctx, role),
                round=r,
            )
            return {"answers": [(r, i, turn.reply)]}

        def fan_out(state: _State) -> list:
            r = state.get("round", 0)
            previous = {i: reply for (rr, i, reply) in state.get("answers", []) if rr == r - 1}
            return [Send("debater", {"i": i, "round": r, "previous": previous}) for i in range(len(names))]

        def end_round(state: _State) -> dict:
            team.data["rounds_done"] = state.get("round", 0) + 1
            return {"round": state.get("round", 0) + 1}

        graph = StateGraph(_State)
        graph.add_node("debater", debater)  # type: ignore[arg-type]  # LangGraph's types want a state schema as the node's input type, but it would also read that annotation as an extra input schema: the node takes Send's payload, a plain dict
        graph.add_node("end_round", end_round)
        graph.add_conditional_edges(START, fan_out, ["debater"])
        graph.add_edge("debater", "end_round")
        graph.add_conditional_edges("end_round", lambda s: fan_out(s) if s["round"] < rounds else END, ["debater", END])
        await graph.compile(name=self.name).ainvoke({"round": 0, "answers": []}, config={"recursion_limit": 2 * rounds + 2})

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        candidates = final_candidates(team, team.data.get("agents", []))
        vote, program = most_common_program(candidates)
        return team.attempt(program, candidates=candidates, vote=vote, rounds=team.data.get("rounds_done", 0))
