"""The eight APPS runners on one interface (base.py), each module holding only its flow.

Shared pieces, in the order a runner uses them:
- `registry.get_topology(cfg)`: topology name -> runner, framework checked at cell start;
- `prompts`: role list for the team size (`roles_for`) and the prompt set (`load_prompts`,
  from config or a prompt file); `context.build_context` assembles a SolveContext;
- `team`: FlowRunner (solve = flow under the wall clock -> Attempt), per-turn records,
  the infrastructure-error rule; `messages`: the glue texts framework siblings share;
- `agents`: the LangGraph ReAct agent with python_exec and a step cap;
- `vote.most_common_program`: the independent/decentralized submission rule.

Nothing here imports a framework at import time.
"""

from apps_bench.topologies.base import PromptSet, SolveContext, Topology, agent_seed

__all__ = ["PromptSet", "SolveContext", "Topology", "agent_seed"]
