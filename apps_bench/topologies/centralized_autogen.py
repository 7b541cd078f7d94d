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
from typing import Any, Callable, Literal, Sequence

from apps_bench.topologies.base import SolveContext, agent_seed
from apps_bench.topologies.messages import DELEGATE_TOOL, cap_note, delegate_description, delegate_parameters
from apps_bench.topologies.team import CONTEXT_HINTS, FlowRunner, StopFlow, Team, Turn
from apps_bench.types import Attempt

SELECTOR_ROLE = "selector"  # the role a selector-model call would be recorded under (none is made)


class CentralizedAutoGen(FlowRunner):
    """Hub and spoke as an AutoGen selector group chat."""

    framework = "autogen"

    async def flow(self, ctx: SolveContext, team: Team) -> None:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_agentchat.conditions import TextMessageTermination
        from autogen_agentchat.messages import (
            BaseChatMessage,
            SelectSpeakerEvent,
            TextMessage,
            ToolCallExecutionEvent,
            ToolCallRequestEvent,
        )
        from autogen_agentchat.teams import SelectorGroupChat
        from autogen_core import CancellationToken

        manager, workers = ctx.roles[0], list(ctx.roles[1:])
        if len(set(workers)) != len(workers) or manager in workers:
            raise ValueError(f"centralized roles must be distinct, got {ctx.roles}")
        team.data.update(manager=manager, workers=workers, delegations=0, manager_final=None, delegated=None)
        cap = int(ctx.config.max_turns)  # delegations, as in the LangGraph sibling
        clients: list[Any] = []

        def client(index: int, role: str) -> Any:
            c = ctx.models.autogen_client(agent_seed(ctx.seed, index), role=role)
            clients.append(c)
            return c

        agents = [
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
        # At most max_steps model calls per worker turn, as in the LangGraph loop: AutoGen makes
        # max_tool_iterations tool-calling calls, then (if still calling tools) one reflection call.
        steps_cap = int(ctx.config.max_steps)
        tool_rounds = max(1, steps_cap - 1)
        for i, role in enumerate(workers, start=1):
            tools = [_python_exec_tool(ctx.tool)] if role in (ctx.config.tool_roles or ()) else []
            agents.append(
                AssistantAgent(
                    role,
                    client(i, role),
                    tools=tools,
                    system_message=ctx.prompts[role],
                    description=f"the {role}",
                    model_context=_worker_context(manager),
                    reflect_on_tool_use=bool(tools),
                    max_tool_iterations=tool_rounds,
                )
            )

        def selector_func(thread: Sequence[Any]) -> str | None:
            # The manager speaks first and after every worker; after the manager, the worker its
            # delegation named (the tool ran, so the arguments were valid), else the manager again.
            last = thread[-1].source if thread else None
            worker, team.data["delegated"] = team.data["delegated"], None
            return worker if last == manager and worker is not None else manager

        def candidate_func(thread: Sequence[Any]) -> list[str]:
            return list(workers)

        chat_team = SelectorGroupChat(
            agents,
            model_client=client(len(ctx.roles), SELECTOR_ROLE),  # required; metered, never called
            termination_condition=TextMessageTermination(source=manager),
            max_turns=2 * cap + 1,
            allow_repeated_speaker=True,
            selector_func=selector_func,
            candidate_func=candidate_func,
            emit_team_events=True,
        )
        await chat_team.reset()

        # The wall clock must stop the chat itself: cancelling only the consumer of run_stream
        # leaves AutoGen waiting (in the stream's cleanup) until the runtime is idle, i.e.
        # until the whole conversation has run. The token cancels the runtime's work at once.
        token = CancellationToken()
        timer = asyncio.get_running_loop().call_later(max(0.0, ctx.time_left()), token.cancel)
        turn: Turn | None = None
        chat: list[tuple[str, str]] = []  # (source, text) of the chat messages, in order
        seen: dict[str, int] = {}
        try:
            async for item in chat_team.run_stream(task=ctx.prompt, cancellation_token=token):
                if isinstance(item, SelectSpeakerEvent):
                    speaker = item.content[0] if item.content else ""
                    turn = team.start(speaker, speaker, team.data["delegations"])
                    if speaker == manager:  # the manager reads everything new since its last turn
                        shown = chat[seen.get(speaker, 0):]
                    else:  # a worker sees the problem and the manager's latest instruction
                        shown = chat[:1] + [m for m in chat if m[0] == manager][-1:]
                    seen[speaker] = len(chat)
                    ctx.log(speaker, speaker, "input", "\n\n".join(f"[{s}] {t}" for s, t in shown), turn.round)
                elif isinstance(item, ToolCallRequestEvent):
                    if turn is not None:
                        turn.steps += 1
                    for call in item.content:
                        args = _args(call.arguments)
                        ctx.log(item.source, item.source, "tool_call", json.dumps({"name": call.name, "args": args}),
                                _round(turn))
                        valid = isinstance(args, dict) and args.get("worker") in workers
                        if item.source == manager and call.name == DELEGATE_TOOL and valid:
                            team.data["delegations"] += 1
                elif isinstance(item, ToolCallExecutionEvent):
                    for res in item.content:
                        if turn is not None:
                            turn.tool_calls += 1 if item.source != manager else 0
                        ctx.log(item.source, item.source, "tool_result", res.content, _round(turn))
                elif isinstance(item, BaseChatMessage):
                    text = item.to_text()
                    chat.append((item.source, text))
                    if item.source == "user" or turn is None:
                        continue
                    seen[item.source] = len(chat)
                    if isinstance(item, TextMessage):  # a reply (not a delegation summary)
                        turn.steps += 1
                        ctx.log(item.source, item.source, "reply", text, turn.round)
                        turn.add_reply(text)
                        turn.stop_reason = "done"
                        if item.source != manager and turn.steps - 1 >= tool_rounds:
                            # every allowed tool round was used: this reply is AutoGen's forced reflection
                            turn.stop_reason = "step_cap"
                            ctx.log(item.source, item.source, "note", cap_note("step cap", steps_cap), turn.round)
                        if item.source == manager:
                            team.data["manager_final"] = turn
                    else:
                        turn.stop_reason = "done"
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


def _args(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


def _worker_context(manager: str) -> Any:
    """A worker's view, as in the LangGraph sibling: the problem and the manager's latest
    instruction (plus the worker's own tool steps since), not the whole group chat."""
    from autogen_core.model_context import UnboundedChatCompletionContext
    from autogen_core.models import UserMessage

    class WorkerContext(UnboundedChatCompletionContext):
        async def get_messages(self) -> list[Any]:
            msgs = self._messages
            last = max((i for i, m in enumerate(msgs) if isinstance(m, UserMessage) and m.source == manager),
                       default=None)
            if last is None or last == 0:
                return list(msgs)
            return [msgs[0], *msgs[last:]]

    return WorkerContext()


def _delegate_tool(workers: list[str], on_delegate: Callable[[str], None]) -> Any:
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
        worker=(Literal[tuple(workers)], Field(description="the worker to ask")),  # type: ignore[valid-type]
        instruction=(str, Field(description="what the worker should do")),
    )

    class Delegate(BaseTool[BaseModel, str]):
        def __init__(self) -> None:
            super().__init__(args_model, str, DELEGATE_TOOL, description)

        @property
        def schema(self) -> Any:
            return {"name": DELEGATE_TOOL, "description": description, "parameters": parameters}

        async def run(self, args: BaseModel, cancellation_token: CancellationToken) -> str:
            on_delegate(args.worker)  # type: ignore[attr-defined]
            return f"Instruction for the {args.worker}: {args.instruction}"  # type: ignore[attr-defined]

    return Delegate()


def _python_exec_tool(tool: Any) -> Any:
    """python_exec as an AutoGen tool with exactly the shared JSON schema."""
    from autogen_core import CancellationToken
    from autogen_core.tools import BaseTool
    from pydantic import BaseModel, create_model

    args_model: type[BaseModel] = create_model("PythonExecArgs", code=(str, ...), stdin=(str, ""))

    class PythonExec(BaseTool[BaseModel, str]):
        def __init__(self) -> None:
            super().__init__(args_model, str, tool.name, tool.description)

        @property
        def schema(self) -> Any:
            return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}

        async def run(self, args: BaseModel, cancellation_token: CancellationToken) -> str:
            return await tool.acall(args.code, args.stdin or "")  # type: ignore[attr-defined]

    return PythonExec()
