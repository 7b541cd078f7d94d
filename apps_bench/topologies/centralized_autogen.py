"""Centralized team on AutoGen AgentChat: the sibling of `centralized_langgraph`.

A `SelectorGroupChat` of a manager and its workers (analyzer, coder, tester for team
size 4). The manager speaks first and after every worker; it delegates with the same
`delegate(worker, instruction)` tool as the LangGraph sibling, and the worker it names speaks
next (`selector_func`), as in the LangGraph sibling, where the `worker` argument runs that
worker. A delegation the tool refused (no such worker, arguments that are not the schema's
JSON) goes back to the manager with the error, as a refused LangGraph tool call does. So the
selector model is never asked: a small real model asked to pick a name routed every turn back
to the manager, and the workers never spoke. The chat ends when the manager replies without
delegating (a plain text message from the manager) or at the message cap: `max_turns`
delegations, i.e. 2 * max_turns + 1 speaker turns. Final program: the manager's final
program, else the last program a worker produced.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import DELEGATE_TOOL, cap_note, delegate_description, delegate_parameters
from apps_bench.topologies.team import CONTEXT_HINTS, FlowRunner, StopFlow, Team, Turn
from apps_bench.types import Attempt, JsonObject

if TYPE_CHECKING:  # pragma: no cover
    from autogen_agentchat.base import ChatAgent
    from autogen_agentchat.base import Team as AgentTeam
    from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, FunctionExecutionResult
    from autogen_agentchat.teams import SelectorGroupChat
    from autogen_core import FunctionCall
    from autogen_core.model_context import UnboundedChatCompletionContext
    from autogen_core.models import ChatCompletionClient
    from autogen_core.tools import BaseTool
    from pydantic import BaseModel

    from apps_bench.sandbox.tool import PythonExecTool

SELECTOR_ROLE = "selector"  # the role a selector-model call would be recorded under (none is made)


class CentralizedAutoGen(FlowRunner):
    """Hub and spoke as an AutoGen selector group chat."""

    framework = "autogen"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        manager, workers = ctx.roles[0], list(ctx.roles[1:])
        if len(set(workers)) != len(workers) or manager in workers:
            raise ValueError(f"centralized roles must be distinct, got {ctx.roles}")
        team.data.update(manager=manager, workers=workers, delegations=0, manager_final=None, delegated=None)
        cap = int(ctx.config.max_turns)  # delegations, as in the LangGraph sibling
        clients: list[ChatCompletionClient] = []
        chat = _ChatLog(ctx, team, manager, workers, steps_cap=int(ctx.config.max_steps))
        group = _group_chat(ctx, team, chat, cap, clients)
        await group.reset()
        await _run_chat(ctx, team, group, chat, clients)
        if team.data["manager_final"] is None and team.stop_reason == "done":
            ctx.log(manager, manager, "note", cap_note("turn cap", cap))
            team.stop("turn_cap", f"the {manager} did not finish within {cap} delegations")

    def finish(self, ctx: SolveContext, team: Team) -> Attempt:
        final: Turn | None = team.data.get("manager_final")
        workers = team.data.get("workers", list(ctx.roles[1:]))
        program = final.program if final is not None and final.program else team.latest_program(workers)
        # As the LangGraph sibling: turns = delegations made (what max_turns caps).
        # The delegation that hit the cap ended the chat unanswered: it is not counted (LangGraph
        # refuses it), so turns never exceeds max_turns.
        delegations = min(team.data.get("delegations", 0), int(ctx.config.max_turns))
        return team.attempt(program, rounds=1, turns=delegations)


@dataclass
class _ChatLog:
    """One chat followed event by event: the turn in progress, the chat's messages so far, what each speaker
    has read of them, and the transcript entries each event makes."""

    ctx: SolveContext
    team: Team
    manager: str
    workers: list[str]
    # At most max_steps model calls per worker turn, as in the LangGraph loop: AutoGen makes
    # max_tool_iterations tool-calling calls, then (if still calling tools) one reflection call.
    steps_cap: int
    turn: Turn | None = None
    chat: list[tuple[str, str]] = field(default_factory=list)  # (source, text) of the chat messages, in order
    seen: dict[str, int] = field(default_factory=dict)

    @property
    def tool_rounds(self) -> int:
        return max(1, self.steps_cap - 1)

    def speaker_selected(self, speaker: str) -> None:
        self.turn = turn = self.team.start(speaker, speaker, self.team.data["delegations"])
        if speaker == self.manager:  # the manager reads everything new since its last turn
            shown = self.chat[self.seen.get(speaker, 0) :]
        else:  # a worker sees the problem and the manager's latest instruction
            shown = self.chat[:1] + [m for m in self.chat if m[0] == self.manager][-1:]
        self.seen[speaker] = len(self.chat)
        self.ctx.log(speaker, speaker, "input", "\n\n".join(f"[{s}] {t}" for s, t in shown), turn.round)

    def tool_calls(self, source: str, calls: Sequence[FunctionCall]) -> None:
        if self.turn is not None:
            self.turn.steps += 1
        for call in calls:
            args = _args(call.arguments)
            self.ctx.log(source, source, "tool_call", json.dumps({"name": call.name, "args": args}), _round(self.turn))
            valid = isinstance(args, dict) and args.get("worker") in self.workers
            if source == self.manager and call.name == DELEGATE_TOOL and valid:
                self.team.data["delegations"] += 1

    def tool_results(self, source: str, results: Sequence[FunctionExecutionResult]) -> None:
        for res in results:
            if self.turn is not None:
                self.turn.tool_calls += 1 if source != self.manager else 0
            self.ctx.log(source, source, "tool_result", res.content, _round(self.turn))

    def message(self, source: str, text: str, *, reply: bool) -> None:
        """A chat message; `reply`: a text reply (the rest are a delegation's summary)."""
        self.chat.append((source, text))
        turn = self.turn
        if source == "user" or turn is None:
            return
        self.seen[source] = len(self.chat)
        turn.stop_reason = "done"
        if not reply:
            return
        turn.steps += 1
        self.ctx.log(source, source, "reply", text, turn.round)
        turn.add_reply(text)
        if source != self.manager and turn.steps - 1 >= self.tool_rounds:
            # every allowed tool round was used: this reply is AutoGen's forced reflection
            turn.stop_reason = "step_cap"
            self.ctx.log(source, source, "note", cap_note("step cap", self.steps_cap), turn.round)
        if source == self.manager:
            self.team.data["manager_final"] = turn


def _group_chat(
    ctx: SolveContext, team: Team, chat: _ChatLog, cap: int, clients: list[ChatCompletionClient]
) -> SelectorGroupChat:
    """The manager and its workers in a selector group chat whose next speaker is chosen by `selector_func`,
    never by the selector model (each agent's model client is appended to `clients`, to be closed)."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import TextMessageTermination
    from autogen_agentchat.teams import SelectorGroupChat

    manager, workers = chat.manager, chat.workers

    def client(index: int, role: str) -> ChatCompletionClient:
        c: ChatCompletionClient = ctx.models.autogen_client(agent_seed(ctx.seed, index), role=role)
        clients.append(c)
        return c

    agents: list[ChatAgent | AgentTeam] = [
        AssistantAgent(
            manager,
            client(0, manager),
            tools=[_delegate_tool(workers, lambda worker: team.data.update(delegated=worker))],
            system_message=ctx.prompts[manager],
            description=f"the {manager}: delegates to the workers and submits the final program",
            reflect_on_tool_use=False,
            max_tool_iterations=1,
        )
    ]
    for i, role in enumerate(workers, start=1):
        tools: list[BaseTool[Any, Any] | Callable[..., Any]] = (
            [_python_exec_tool(ctx.tool)] if role in (ctx.config.tool_roles or ()) else []
        )
        agents.append(
            AssistantAgent(
                role,
                client(i, role),
                tools=tools,
                system_message=ctx.prompts[role],
                description=f"the {role}",
                model_context=_worker_context(manager),
                reflect_on_tool_use=bool(tools),
                max_tool_iterations=chat.tool_rounds,
            )
        )

    def selector_func(thread: Sequence[BaseAgentEvent | BaseChatMessage]) -> str | None:
        # The manager speaks first and after every worker; after the manager, the worker its
        # delegation named (the tool ran, so the arguments were valid), else the manager again.
        last = thread[-1].source if thread else None
        worker, team.data["delegated"] = team.data["delegated"], None
        return worker if last == manager and worker is not None else manager

    def candidate_func(thread: Sequence[BaseAgentEvent | BaseChatMessage]) -> list[str]:
        return list(workers)

    return SelectorGroupChat(
        agents,
        model_client=client(len(ctx.roles), SELECTOR_ROLE),  # required; metered, never called
        termination_condition=TextMessageTermination(source=manager),
        max_turns=2 * cap + 1,
        allow_repeated_speaker=True,
        selector_func=selector_func,
        candidate_func=candidate_func,
        emit_team_events=True,
    )


async def _run_chat(
    ctx: SolveContext, team: Team, group: SelectorGroupChat, chat: _ChatLog, clients: list[ChatCompletionClient]
) -> None:
    """Run the chat on the problem under the wall clock, handing each event to `chat`; an endpoint failure
    AutoGen wrapped is recorded on `team`, the clock's end raises StopFlow. The clients are closed at the end."""
    from autogen_agentchat.messages import (
        BaseChatMessage,
        SelectSpeakerEvent,
        TextMessage,
        ToolCallExecutionEvent,
        ToolCallRequestEvent,
    )
    from autogen_core import CancellationToken

    # The wall clock must stop the chat itself: cancelling only the consumer of run_stream
    # leaves AutoGen waiting (in the stream's cleanup) until the runtime is idle, i.e.
    # until the whole conversation has run. The token cancels the runtime's work at once.
    token = CancellationToken()
    timer = asyncio.get_running_loop().call_later(max(0.0, ctx.time_left()), token.cancel)
    try:
        async for item in group.run_stream(task=ctx.prompt, cancellation_token=token):
            if isinstance(item, SelectSpeakerEvent):
                chat.speaker_selected(item.content[0] if item.content else "")
            elif isinstance(item, ToolCallRequestEvent):
                chat.tool_calls(item.source, item.content)
            elif isinstance(item, ToolCallExecutionEvent):
                chat.tool_results(item.source, item.content)
            elif isinstance(item, BaseChatMessage):
                chat.message(item.source, item.to_text(), reply=isinstance(item, TextMessage))
    except RuntimeError as exc:
        # AutoGen re-raises an agent's exception as RuntimeError("<ExceptionType>: <message>"),
        # including the CancelledError of a call our clock cancelled.
        if token.is_cancelled():
            raise StopFlow("time_limit") from None
        if not _api_failure(team, exc):
            raise
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if token.is_cancelled() and not (task is not None and task.cancelling()):
            raise StopFlow("time_limit") from None  # our clock, not a caller's cancellation
        raise
    finally:
        timer.cancel()
        token.cancel()
        for c in clients:
            await c.close()


def _api_failure(team: Team, exc: RuntimeError) -> bool:
    """Record a model-endpoint failure that AutoGen wrapped, as run_guarded records an unwrapped
    one (infrastructure error, or context_limit for an overlong conversation); False if it is not one."""
    import openai

    text = str(exc).split("\nTraceback", 1)[0].strip()  # AutoGen appends the remote traceback
    kind = getattr(openai, text.split(":", 1)[0].strip(), None)
    if not (isinstance(kind, type) and issubclass(kind, openai.APIError)):
        return False
    if issubclass(kind, openai.BadRequestError) and any(h in text.lower() for h in CONTEXT_HINTS):
        team.stop("context_limit", f"model rejected the conversation: {text[:300]}")
    else:
        team.error = f"model endpoint failed: {text[:500]}"
        team.stop("error", team.error)
    return True


def _round(turn: Turn | None) -> int:
    return turn.round if turn is not None else 0


def _args(arguments: str) -> JsonObject | str:
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


def _worker_context(manager: str) -> UnboundedChatCompletionContext:
    """A worker's view, as in the LangGraph sibling: the problem and the manager's latest
    instruction (plus the worker's own tool steps since), not the whole group chat."""
    from autogen_core.model_context import UnboundedChatCompletionContext
    from autogen_core.models import LLMMessage, UserMessage

    class WorkerContext(UnboundedChatCompletionContext):
        async def get_messages(self) -> list[LLMMessage]:
            msgs = self._messages
            last = max((i for i, m in enumerate(msgs) if isinstance(m, UserMessage) and m.source == manager), default=None)
            if last is None or last == 0:
                return list(msgs)
            return [msgs[0], *msgs[last:]]

    return WorkerContext()


def _delegate_tool(workers: list[str], on_delegate: Callable[[str], None]) -> BaseTool[Any, Any]:
    """The manager's `delegate(worker, instruction)` tool, with the LangGraph sibling's name,
    description and schema. In a group chat it only records the delegation (`on_delegate`
    gets the worker, who speaks next; the result is the message that worker reads); the
    worker then answers in the chat itself."""
    from autogen_core import CancellationToken
    from autogen_core.tools import BaseTool
    from pydantic import BaseModel, Field, create_model

    description = delegate_description(workers)
    parameters = delegate_parameters(workers)
    args_model: type[BaseModel] = create_model(
        "DelegateArgs",
        # a Literal of the names known only now: no static type can say it
        worker=(Literal[tuple(workers)], Field(description="the worker to ask")),  # type: ignore[valid-type,arg-type]
        instruction=(str, Field(description="what the worker should do")),
    )

    class Delegate(BaseTool[BaseModel, str]):  # type: ignore[type-var]  # AutoGen's types bound a tool's result to BaseModel; a str result is sent as is
        def __init__(self) -> None:
            super().__init__(args_model, str, DELEGATE_TOOL, description)

        @property
        def schema(self) -> Any:  # the shared JSON schema, as is
            return {"name": DELEGATE_TOOL, "description": description, "parameters": parameters}

        async def run(self, args: BaseModel, cancellation_token: CancellationToken) -> str:
            on_delegate(args.worker)  # type: ignore[attr-defined]  # fields of a model made at run time (create_model)
            return f"Instruction for the {args.worker}: {args.instruction}"  # type: ignore[attr-defined]  # fields of a model made at run time (create_model)

    return Delegate()


def _python_exec_tool(tool: PythonExecTool) -> BaseTool[Any, Any]:
    """python_exec as an AutoGen tool with exactly the shared JSON schema."""
    from autogen_core import CancellationToken
    from autogen_core.tools import BaseTool
    from pydantic import BaseModel, create_model

    args_model: type[BaseModel] = create_model("PythonExecArgs", code=(str, ...), stdin=(str, ""))

    class PythonExec(BaseTool[BaseModel, str]):  # type: ignore[type-var]  # AutoGen's types bound a tool's result to BaseModel; a str result is sent as is
        def __init__(self) -> None:
            super().__init__(args_model, str, tool.name, tool.description)

        @property
        def schema(self) -> Any:  # the shared JSON schema, as is
            return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}

        async def run(self, args: BaseModel, cancellation_token: CancellationToken) -> str:
            return await tool.acall(args.code, args.stdin or "")  # type: ignore[attr-defined]  # fields of a model made at run time (create_model)

    return PythonExec()
