"""The LangGraph agent every LangGraph runner is made of: a ReAct loop with a step cap.

A hand-built two-node StateGraph (model -> tools -> model ...) rather than
`create_react_agent` (deprecated in langgraph 1.x, and its default recursion limit
is ~10000): the loop stops after `max_steps` model calls, checks the wall clock
before every call, logs every input, reply, tool call and tool result to the
transcript, and records the turn in the Team as it goes. The runners differ only
in their flow around `run_agent`.

LangGraph and LangChain are imported inside the functions, so importing a
topology module stays cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from apps_bench.topologies.base import SolveContext
from apps_bench.topologies.messages import cap_note
from apps_bench.topologies.team import StopFlow, Team, Turn

if TYPE_CHECKING:  # pragma: no cover
    from langchain_core.messages import BaseMessage, InvalidToolCall
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool


def python_exec_tool(ctx: SolveContext) -> BaseTool:
    """ctx.tool (the sandboxed python_exec) as a LangChain StructuredTool, same name/schema for every framework."""
    from langchain_core.tools import StructuredTool

    tool = ctx.tool

    async def _run(code: str, stdin: str = "", **_ignored: Any) -> str:
        return await tool.acall(code, stdin)

    return StructuredTool.from_function(
        coroutine=_run, name=tool.name, description=tool.description, args_schema=dict(tool.parameters)
    )


def tools_for(ctx: SolveContext, role: str) -> list[BaseTool]:
    """python_exec for the roles the config lets run code (topology.tool_roles), else no tools."""
    return [python_exec_tool(ctx)] if role in (ctx.config.tool_roles or ()) else []


def _text(message: BaseMessage) -> str:
    text = message.text  # a str in langchain-core 1.x (a method in 0.3)
    return str(text) if isinstance(text, str) else str(text() or "")


def _missing_args(tool: BaseTool, args: object) -> list[str]:
    """Required parameters (per the tool's JSON schema) the model left out."""
    schema = tool.args_schema if isinstance(tool.args_schema, dict) else {}
    if not isinstance(args, dict):
        return list(schema.get("required", [])) or ["(arguments must be an object)"]
    return [k for k in schema.get("required", []) if k not in args]


def _invalid_calls(ai: BaseMessage) -> list[InvalidToolCall]:
    """Tool calls whose arguments did not parse (they still need an answer, by id)."""
    return [c for c in (getattr(ai, "invalid_tool_calls", None) or ()) if c.get("id")]


async def run_agent(
    ctx: SolveContext,
    team: Team,
    *,
    agent: str,
    role: str,
    user: str,
    seed: int,
    tools: Sequence[BaseTool] = (),
    round: int = 0,
    max_steps: int | None = None,
    stop_check: Callable[[], str | None] | None = None,
) -> Turn:
    """One agent turn: system = the role's prompt, user = `user`; loops while it calls tools.

    Ends when a reply has no tool call ("done"), after `max_steps` model calls
    ("step_cap"), or when `stop_check()` (asked after each tool round) names a reason
    (e.g. a manager's delegation cap). The wall clock raises StopFlow("time_limit").
    """
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.errors import GraphRecursionError

    turn = team.start(agent, role, round)
    steps_cap = int(max_steps or ctx.config.max_steps)
    chat = ctx.models.langchain_chat(seed, role=role)  # its calls are recorded as the role's
    loop = _AgentLoop(
        ctx=ctx,
        turn=turn,
        agent=agent,
        role=role,
        round=round,
        steps_cap=steps_cap,
        stop_check=stop_check,
        model=chat.bind_tools(list(tools)) if tools else chat,
        by_name={t.name: t for t in tools},
    )
    ctx.log(agent, role, "input", user, round)
    messages = [SystemMessage(ctx.prompts[role]), HumanMessage(user)]
    try:
        # model+tools per step: 2 supersteps per model call, plus slack; the router stops first.
        await _react_graph().ainvoke(
            {"messages": messages},
            config={"recursion_limit": 2 * steps_cap + 2, "configurable": {_LOOP_KEY: loop}, "run_name": agent},
        )
    except GraphRecursionError:
        turn.stop_reason = "step_cap"
    if turn.stop_reason == "running":
        turn.stop_reason = "done"
    return turn


@dataclass
class _AgentLoop:
    """One agent turn's state and steps; the shared compiled graph finds it in its run config."""

    ctx: SolveContext
    turn: Turn
    agent: str
    role: str
    round: int
    steps_cap: int
    stop_check: Callable[[], str | None] | None
    model: Any
    by_name: dict[str, BaseTool]

    def log(self, kind: str, text: str) -> None:
        self.ctx.log(self.agent, self.role, kind, text, self.round)

    async def call_model(self, state: dict) -> dict:
        if self.ctx.time_left() <= 0:
            raise StopFlow("time_limit")
        self.turn.steps += 1
        ai = await self.model.ainvoke(state["messages"])
        text = _text(ai)
        if text.strip():
            self.log("reply", text)
        self.turn.add_reply(text)
        for call in ai.tool_calls:
            self.log("tool_call", json.dumps({"name": call["name"], "args": call["args"]}))
        for bad in _invalid_calls(ai):
            self.log("note", f"unparsable tool call {bad.get('name')!r}: {bad.get('args')!r}")
        return {"messages": [ai]}

    async def call_tools(self, state: dict) -> dict:
        from langchain_core.messages import ToolMessage

        out = []
        ai = state["messages"][-1]
        for bad in _invalid_calls(ai):  # malformed JSON arguments: say so, let the model retry
            result = f"error: the arguments of your {bad.get('name')} call are not valid JSON; call it again"
            self.log("tool_result", result)
            out.append(ToolMessage(content=result, tool_call_id=bad["id"], name=str(bad.get("name") or "")))
        for call in ai.tool_calls:
            tool = self.by_name.get(call["name"])
            missing = _missing_args(tool, call["args"]) if tool is not None else []
            if tool is None:
                result = f"error: no tool named {call['name']!r}; available: {sorted(self.by_name)}"
            elif missing:  # the model's mistake: tell it and keep going (a bug of ours still raises)
                result = f"error: bad arguments for {call['name']}: missing required {missing}"
            else:
                result = await tool.ainvoke(call["args"])
            self.turn.tool_calls += 1
            self.log("tool_result", result)
            out.append(ToolMessage(content=str(result), tool_call_id=call["id"], name=call["name"]))
        return {"messages": out}

    def after_model(self, state: dict) -> str:
        from langgraph.graph import END

        ai = state["messages"][-1]
        if not ai.tool_calls and not _invalid_calls(ai):
            return END
        if self.turn.steps >= self.steps_cap:
            self.turn.stop_reason = "step_cap"
            self.log("note", cap_note("step cap", self.steps_cap))
            return END
        return "tools"

    def after_tools(self, state: dict) -> str:
        from langgraph.graph import END

        reason = self.stop_check() if self.stop_check else None
        if reason:
            self.turn.stop_reason = reason
            return END
        return "model"


_LOOP_KEY = "apps_bench_agent_loop"
_GRAPH: list[Any] = []  # the compiled ReAct graph, built once per process


def _loop_of(config: RunnableConfig) -> _AgentLoop:
    return config["configurable"][_LOOP_KEY]


async def _model_node(state: dict, config: RunnableConfig) -> dict:
    return await _loop_of(config).call_model(state)


async def _tools_node(state: dict, config: RunnableConfig) -> dict:
    return await _loop_of(config).call_tools(state)


def _after_model(state: dict, config: RunnableConfig) -> str:
    return _loop_of(config).after_model(state)


def _after_tools(state: dict, config: RunnableConfig) -> str:
    return _loop_of(config).after_tools(state)


def _react_graph() -> Any:
    """model -> tools -> model ... compiled once: compiling per turn cost ~5 ms of CPU
    (LangGraph inspects every node function's bytecode), on every agent turn of every problem."""
    if not _GRAPH:
        from langchain_core.runnables import RunnableConfig
        from langgraph.graph import END, START, MessagesState, StateGraph

        for fn in (_model_node, _tools_node, _after_model, _after_tools):  # how LangGraph knows to pass the config
            fn.__annotations__["config"] = RunnableConfig
        graph = StateGraph(MessagesState)
        graph.add_node("model", _model_node)  # type: ignore[type-var]  # LangGraph's types want a state schema as the node's input type, but it would also read that annotation as an extra input schema: the node takes a plain dict
        graph.add_node("tools", _tools_node)  # type: ignore[type-var]  # (as above)
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", _after_model, ["tools", END])
        graph.add_conditional_edges("tools", _after_tools, ["model", END])
        _GRAPH.append(graph.compile(name="agent"))
    return _GRAPH[0]
