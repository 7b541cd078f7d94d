"""Did the team's tools reach the model? Per-role tool calls, and the cell's warnings about them.

A server whose chat template drops `tools` answers every request as if none were
offered: a centralized team becomes its manager answering alone, a tester never runs
code, and nothing fails. So each record counts the tool calls of each role (from the
transcript), and a cell whose tool-using role never called a tool, or whose model is
known not to support tools, says so in its summary and its MLflow run. How a framework
offers tools is recorded too: CrewAI describes them in the prompt text and sends no
`tools` field (its real behaviour with a model it does not know to support function
calling), which costs prompt tokens its siblings do not pay.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from apps_bench.config.schema import ModelConfig, TopologyConfig
from apps_bench.topologies.prompts import roles_for
from apps_bench.types import JsonObject, ProblemRecord, TranscriptEvent


def tool_calls_by_role(transcript: Iterable[TranscriptEvent | Mapping[str, object]]) -> dict[str, int]:
    """Tool calls per role, from a problem's transcript events (objects or dicts)."""
    out: dict[str, int] = {}
    for ev in transcript:
        kind = ev.get("kind") if isinstance(ev, Mapping) else getattr(ev, "kind", "")
        if kind != "tool_call":
            continue
        role = str(ev.get("role") if isinstance(ev, Mapping) else getattr(ev, "role", ""))
        out[role] = out.get(role, 0) + 1
    return out


def roles_offered_tools(topology_cfg: TopologyConfig) -> list[str]:
    """The roles of this team that are given a tool: `tool_roles` (python_exec), and a centralized manager (delegate)."""
    roles = list(roles_for(topology_cfg))
    offered = [r for r in roles if r in set(topology_cfg.tool_roles)]
    if topology_cfg.flow == "centralized" and roles and roles[0] not in offered:
        offered.insert(0, roles[0])
    return list(dict.fromkeys(offered))


def tool_protocol(records: Sequence[ProblemRecord]) -> JsonObject:
    """How tools reached the model over a cell: `api` (requests carried `tools`), `prompt_text`, or `none`."""
    calls = sum(r.usage.model_calls for r in records)
    with_tools = sum(r.usage.requests_with_tools for r in records)
    prompt = sum(r.usage.prompt_tokens for r in records)
    return {
        "requests_with_tools": with_tools,
        "model_calls": calls,
        "prompt_tokens_per_call": round(prompt / calls, 1) if calls else 0.0,
    }


def tool_warnings(records: Sequence[ProblemRecord], topology_cfg: TopologyConfig, model_cfg: ModelConfig) -> list[str]:
    """Warnings for the summary and MLflow: tools the model never used, or cannot use."""
    out: list[str] = []
    if model_cfg.provider == "gold":
        # gold gives no program (and calls no tool) where a row has no reference solution: that is
        # the rows, not the server dropping tools, so those problems say nothing about tool use
        unanswered = [r for r in records if not r.extracted and not r.error]
        if unanswered:
            n = len(records)
            out.append(
                f"model=gold gave no program for {len(unanswered)} of {n} problems: their rows have no reference "
                f"solution (gold answers only with one), so they score 0 and pass@1 is at most {n - len(unanswered)}/{n}"
                f" = {(n - len(unanswered)) / n:.4f}; a score on rows without solutions measures the rows, not the "
                "harness"
            )
            records = [r for r in records if r.extracted or r.error]
    offered = roles_offered_tools(topology_cfg)
    if not offered or not records:
        return out
    known_without = not model_cfg.tools_supported or (
        model_cfg.provider == "local" and not (model_cfg.local and model_cfg.local.chat_format)
    )  # a local GGUF served with its own chat template: SmolLM2's drops `tools`
    if known_without:
        out.append(
            f"model {model_cfg.model_id!r} is known not to support tools here (model.tools_supported=false, "
            "or model=local without model.local.chat_format): "
            f"the roles {offered} get no usable tools, so this team's tool use is not measured"
        )
    calls = sum(r.usage.model_calls for r in records)
    if not calls:
        return out
    used: dict[str, int] = {}
    for r in records:
        for role, n in r.tool_calls_by_role.items():
            used[role] = used.get(role, 0) + int(n)
    idle = [r for r in offered if not used.get(r)]
    if idle:
        framework = topology_cfg.framework
        why = (
            "its tools are described in the prompt text, and the model never wrote a call in that format (`Action: python_exec`)"
            if framework == "crewai"
            else "the server or the model may ignore `tools` (a chat template that drops them)"
        )
        out.append(
            f"no tool call over the whole cell by the role(s) {idle} ({len(records)} problems, {calls} model calls, "
            f"framework {framework}): {why}, "
            + (
                "so the manager answered alone"
                if topology_cfg.flow == "centralized" and offered[0] in idle
                else "so the team ran without its tools"
            )
        )
    proto = tool_protocol(records)
    if proto["requests_with_tools"] == 0:
        out.append(
            f"no request carried `tools` (framework {topology_cfg.framework}): tools were described in the "
            f"prompt text instead ({proto['prompt_tokens_per_call']} prompt tokens per call)"
        )
    return out
