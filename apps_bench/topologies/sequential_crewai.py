"""Sequential pipeline on CrewAI: the sibling of `sequential_langgraph`.

One CrewAI Agent + Task per stage (analyzer -> coder -> tester -> debugger for team
size 4; the role list per size comes from config), run by `Process.sequential`; each
task gets the earlier tasks as its `context`. A stage's agent carries its role prompt
(as the backstory) and `python_exec` as a CrewAI tool when its role is in
`tool_roles`. Final program: the last stage's program, else the latest earlier one.

CrewAI is synchronous, so the crew runs in a thread of its own (like asyncio.to_thread,
without queueing behind other problems) and the pipeline's event loop stays free. When the wall clock runs out, the thread is told to
stop at its next step or tool call; what the finished stages produced is kept.
Tool calls are counted by the tool itself; tokens and calls at the HTTP layer.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable

from apps_bench.config.schema import TopologyConfig
from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import cap_note
from apps_bench.topologies.team import FlowRunner, StopFlow, Team, Turn, agent_names
from apps_bench.types import Attempt, JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from crewai import Crew, Task
    from crewai.agents.agent_builder.base_agent import BaseAgent
    from crewai.agents.parser import AgentAction, AgentFinish
    from crewai.tasks.task_output import TaskOutput
    from crewai.tools import BaseTool

# Settings CrewAI reads from the environment. Never prompt (a benchmark has no user at
# the keyboard: without CREWAI_TESTING the first kickoff asks an interactive question)
# and send no telemetry. setdefault: a user's explicit choice wins.
CREWAI_ENV = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TESTING": "true", "CREWAI_TRACING_ENABLED": "false"}


def prepare_crewai_env() -> None:
    for key, value in CREWAI_ENV.items():
        os.environ.setdefault(key, value)


def _skip_console_tree_wait() -> None:
    """CrewAI 1.6.1's console listener waits up to 5 s on every TaskStarted event for a crew
    tree that only `verbose=True` builds. With verbose off, each stage parks an event-bus
    thread (10 in all) for 5 s and the process exit waits for all of them (minutes for a
    cell). A placeholder tree ends the wait; with verbose off nothing ever prints it."""
    from crewai.events.event_listener import event_listener
    from rich.tree import Tree

    formatter = event_listener.formatter
    if not formatter.verbose and formatter.current_crew_tree is None:
        formatter.current_crew_tree = Tree("crew")


class SequentialCrewAI(FlowRunner):
    """Process.sequential over one task per stage."""

    framework = "crewai"

    def __init__(self, cfg: TopologyConfig) -> None:
        super().__init__(cfg)
        # Import CrewAI here, in the caller's thread, not first inside a crew's worker thread:
        # a worker thread holding the import lock for seconds would stall the event loop
        # (and with it every other problem in flight and the wall-clock limit).
        prepare_crewai_env()
        import crewai  # noqa: F401
        import crewai.llms.providers.openai.completion  # noqa: F401
        import crewai.tools  # noqa: F401

        _skip_console_tree_wait()

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        stop = threading.Event()
        team.data["stop"] = stop
        try:
            await _in_own_thread(f"crew-{ctx.problem.id}", self._kickoff, ctx, team, stop)
        finally:
            stop.set()  # a crew cut short by the wall clock stops at its next step
            # CrewAI catches what its step callbacks raise and calls the model again: closing its clients makes
            # every further call of a crew cut by the wall clock fail at once, instead of keeping the server busy
            _close_clients(team.data.get("crew_llms", ()))

    def _kickoff(self, ctx: SolveContext, team: Team, stop: threading.Event) -> None:
        prepare_crewai_env()
        _skip_console_tree_wait()
        stages = _Stages(ctx, team, stop)
        agents, crew = _crew(ctx, stages)
        team.data["crew_llms"] = [agent.llm for agent in agents]
        stages.begin(0)
        try:
            crew.kickoff()
        except SystemExit as exc:
            # With respect_context_window=False CrewAI ends an overlong conversation with SystemExit.
            if "context length" in str(exc).lower():
                raise StopFlow("context_limit") from exc
            raise
        except (ConnectionError, ValueError) as exc:
            # CrewAI's OpenAI provider re-raises connection failures as ConnectionError and an
            # unknown model as ValueError; hand the SDK's error on, as the other frameworks do.
            import openai

            if isinstance(exc.__cause__, openai.APIError):
                raise exc.__cause__ from None
            raise
        finally:
            _close_clients([agent.llm for agent in agents])  # one HTTP client per LLM; release its connections now

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        last_stage = agent_names(ctx.roles)[-1]
        last = [t for t in team.turns if t.agent == last_stage and t.program]
        program = last[-1].program if last else team.latest_program()
        attempt = team.attempt(program, rounds=1)  # turns = stages that ran, in order
        # A crew cut by the wall clock may finish its in-flight model call after this returns
        # (a thread cannot be cancelled): the record keeps what was counted and logged by now.
        attempt.usage = replace(ctx.usage)
        attempt.transcript = list(ctx.transcript)
        return attempt


@dataclass
class _Stages:
    """The crew's stages followed through CrewAI's callbacks: the stage and turn in progress, the transcript
    entries each step makes, and the wall clock checked between steps."""

    ctx: SolveContext
    team: Team
    stop: threading.Event
    tasks: list[Task] = field(default_factory=list)  # one per stage
    stage: int = 0
    turn: Turn | None = None
    last_action: bool = False  # the turn's last step was a tool call

    def __post_init__(self) -> None:
        self.roles = list(self.ctx.roles)
        self.names = agent_names(self.roles)
        self.cap = int(self.ctx.config.max_steps)
        self.max_iter = max(1, self.cap - 1)  # + CrewAI's forced final-answer call = at most max_steps calls

    def begin(self, stage: int) -> Turn:
        role = self.roles[stage]
        turn = self.team.start(self.names[stage], role, 0)  # round 0 for every stage, as the LangGraph sibling
        self.stage, self.turn, self.last_action = stage, turn, False
        earlier = [(self.roles[i], t.output.raw) for i, t in enumerate(self.tasks[:stage]) if t.output is not None]
        text = self.tasks[stage].prompt()
        if earlier:
            text += "\n\nThis is the context you're working with:\n" + "\n\n----------\n\n".join(out for _, out in earlier)
        self.ctx.log(self.names[stage], role, "input", text, 0)
        return turn

    def check_stop(self) -> None:
        if self.stop.is_set() or self.ctx.time_left() <= 0:
            self.stop.set()
            raise StopFlow("time_limit")

    def _current(self) -> Turn:
        if self.stop.is_set():  # the attempt is over: record nothing more, end the crew
            raise StopFlow("time_limit")
        assert self.turn is not None, "a CrewAI callback before the first stage began"
        return self.turn

    def on_step(self, step: AgentAction | AgentFinish) -> None:
        """CrewAI's step callback: an AgentAction (a tool call and its observation) or an AgentFinish."""
        from crewai.agents.parser import AgentAction

        turn = self._current()
        agent, role = turn.agent, turn.role
        turn.steps += 1
        self.last_action = isinstance(step, AgentAction)
        thought = (getattr(step, "thought", "") or "").strip()
        if isinstance(step, AgentAction):
            if thought:
                self.ctx.log(agent, role, "note", thought, turn.round)
            self.ctx.log(agent, role, "tool_call", json.dumps({"name": step.tool, "args": _args(step.tool_input)}), turn.round)
            self.ctx.log(agent, role, "tool_result", str(step.result or ""), turn.round)
        self.check_stop()

    def on_task_done(self, output: TaskOutput) -> None:
        """CrewAI's task callback: the stage's reply ends its turn, and the next stage begins."""
        turn = self._current()
        text = str(getattr(output, "raw", "") or "")
        self.ctx.log(turn.agent, turn.role, "reply", text, turn.round)
        turn.add_reply(text)
        if self.last_action and turn.steps >= self.max_iter:  # CrewAI forced a final answer
            turn.steps += 1
            turn.stop_reason = "step_cap"
            self.ctx.log(turn.agent, turn.role, "note", cap_note("step cap", self.cap), turn.round)
        else:
            turn.stop_reason = "done"
        if self.stage + 1 < len(self.roles):
            self.check_stop()
            self.begin(self.stage + 1)


def _crew(ctx: SolveContext, stages: _Stages) -> tuple[list[BaseAgent], Crew]:
    """One CrewAI Agent and Task per stage, each task with every earlier one as its context, in a
    sequential Crew (the agents, and the crew: CrewAI objects)."""
    from crewai import Agent, Crew, Process, Task

    agents: list[BaseAgent] = []
    for i, role in enumerate(stages.roles):
        tools = [_python_exec_tool(ctx, stages)] if role in (ctx.config.tool_roles or ()) else []
        agent = Agent(
            role=role,
            goal=f"Do the {role} stage of solving the programming problem, as your instructions say.",
            backstory=ctx.prompts[role],
            llm=ctx.models.crewai_llm(agent_seed(ctx.seed, i), role=role),
            tools=tools,
            allow_delegation=False,
            max_iter=stages.max_iter,
            max_retry_limit=0,  # retries live in the HTTP layer; a failed stage must not re-run
            respect_context_window=False,  # an overlong conversation is a result, not silently summarized
            cache=False,
            step_callback=stages.on_step,
            verbose=False,
        )
        agents.append(agent)
        stages.tasks.append(
            Task(
                description=ctx.prompt,
                expected_output=f"The {role} stage's result, in the form your instructions ask for.",
                agent=agent,
                context=list(stages.tasks),  # every earlier stage
                callback=stages.on_task_done,
            )
        )
    crew = Crew(
        agents=agents,
        tasks=stages.tasks,
        process=Process.sequential,
        memory=False,
        cache=False,
        verbose=False,
    )
    return agents, crew


def _close_clients(llms: Iterable[object]) -> None:
    for llm in llms:
        client = getattr(llm, "client", None)
        if client is not None and hasattr(client, "close"):
            client.close()


async def _in_own_thread(name: str, fn: Callable[..., None], *args: object) -> None:
    """Run blocking `fn` in a thread of its own, like asyncio.to_thread but never queued
    behind other problems' crews in the loop's small default executor (the per-problem
    wall clock is already running). Daemon: a crew stuck in a call never blocks exit."""
    import contextvars

    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None = None) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(None)

    def target() -> None:
        try:
            ctx_copy.run(fn, *args)
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine as is
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:  # the loop is gone (the attempt ended on the wall clock): nobody waits
            pass

    ctx_copy = contextvars.copy_context()
    threading.Thread(target=target, name=name, daemon=True).start()
    return await done


def _args(text: JsonObject | str | None) -> JsonObject | str | None:
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text or "{}")
    except (TypeError, json.JSONDecodeError):
        return text


def _python_exec_tool(ctx: SolveContext, stages: _Stages) -> BaseTool:
    """python_exec as a CrewAI tool: the shared tool's name, description and arguments."""
    from crewai.tools import BaseTool
    from pydantic import BaseModel, Field

    tool = ctx.tool
    props = dict(tool.parameters.get("properties", {}))

    class PythonExecArgs(BaseModel):
        code: str = Field(description=str(props.get("code", {}).get("description", "Python source to run")))
        stdin: str = Field(default="", description=str(props.get("stdin", {}).get("description", "standard input")))

    class PythonExec(BaseTool):
        name: str = tool.name
        description: str = tool.description
        args_schema: type[BaseModel] = PythonExecArgs

        def _run(self, code: str, stdin: str = "", **_ignored: Any) -> str:
            stages.check_stop()
            turn = stages.turn
            if turn is not None:
                turn.tool_calls += 1
            return tool(code, stdin or "")

    return PythonExec()
