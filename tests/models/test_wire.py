"""The one wire form (apps_bench/models/wire.py) and the cell-level facts built on usage:
model identity in cell names, tool-use warnings, the debate vote's candidates, python_exec's
compile errors. The same paths against the real local server: tests/test_local_model.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import problem_record

from apps_bench.judge.profiles import judge_config
from apps_bench.models.wire import finish_reason, normalize_reply, prepare_request, strict_arguments

CONF = Path(__file__).resolve().parents[2] / "apps_bench" / "conf"


def test_request_token_cap_goes_as_max_tokens():
    new, _ = prepare_request(json.dumps({"messages": [], "max_completion_tokens": 16}).encode())
    body = json.loads(new)
    assert body["max_tokens"] == 16 and "max_completion_tokens" not in body
    # an explicit max_tokens wins; the other field is still dropped (servers must see one cap)
    new, _ = prepare_request(json.dumps({"max_tokens": 8, "max_completion_tokens": 16}).encode())
    assert json.loads(new) == {"max_tokens": 8}
    assert prepare_request(json.dumps({"max_tokens": 8, "messages": []}).encode())[0] is None


def test_request_tool_call_turn_has_empty_content_not_null():
    msgs = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    new, info = prepare_request(json.dumps({"messages": msgs, "tools": [{"type": "function"}]}).encode())
    body = json.loads(new)
    assert body["messages"][1]["content"] == "" and body["messages"][1]["tool_calls"]
    assert info.has_tools


def test_a_tool_offering_request_without_a_choice_says_auto():
    """One request shape per intent: LangChain and the OpenAI SDK send tools with no `tool_choice`,
    AutoGen with "auto"; llama-cpp-python drops the tools of the first, vLLM reads both as "auto"."""
    tools = [{"type": "function", "function": {"name": "python_exec", "parameters": {}}}]
    new, info = prepare_request(json.dumps({"messages": [], "tools": tools}).encode())
    assert json.loads(new)["tool_choice"] == "auto" and info.has_tools
    for choice in ("auto", "none", "required", {"type": "function", "function": {"name": "python_exec"}}):
        new, _ = prepare_request(json.dumps({"messages": [], "tools": tools, "tool_choice": choice}).encode())
        assert new is None  # a choice the framework made is sent as it is
    for body in ({"messages": []}, {"messages": [], "tools": []}):
        new, _ = prepare_request(json.dumps(body).encode())
        assert new is None  # no tools offered: nothing to choose


def test_reply_arguments_with_raw_newlines_become_strict_json():
    raw = '{"code": "print(1)\nprint(2)", "stdin": ""}'
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    fixed = strict_arguments(raw)
    assert json.loads(fixed) == {"code": "print(1)\nprint(2)", "stdin": ""}
    assert strict_arguments('{"code": "x"}') == '{"code": "x"}'  # already strict: untouched
    assert strict_arguments("not json") == "not json"  # the runner reports it to the model
    reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "python_exec", "arguments": raw}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    out = json.loads(normalize_reply(json.dumps(reply).encode(), "application/json"))
    assert json.loads(out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["code"] == "print(1)\nprint(2)"
    assert finish_reason(json.dumps(reply).encode()) == "tool_calls"


@pytest.mark.parametrize("runner", ["decentralized_openai", "centralized_autogen", "langchain"])
def test_every_runner_reads_the_normalized_arguments_alike(runner):
    """The strict parsers of the OpenAI-SDK and AutoGen runners and LangChain's lenient one agree."""
    fixed = strict_arguments('{"code": "a = 1\nprint(a)"}')
    if runner == "decentralized_openai":
        from apps_bench.topologies.decentralized_openai import _args
    elif runner == "centralized_autogen":
        from apps_bench.topologies.centralized_autogen import _args
    else:
        from langchain_core.output_parsers.openai_tools import parse_tool_call

        def _args(a):
            return parse_tool_call({"function": {"name": "python_exec", "arguments": a}, "id": "1"}, return_id=False)["args"]

    assert _args(fixed) == {"code": "a = 1\nprint(a)"}


def test_sse_finish_reason_is_the_last_one_given():
    body = (
        b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
    )
    assert finish_reason(body, "text/event-stream") == "length"


# ----------------------------------------------------------------------------- defect 7: the model's identity


def _cell(*overrides):
    from hydra import compose, initialize_config_dir

    from apps_bench.cell.key import resolve_cell
    from apps_bench.config.schema import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        return resolve_cell(compose("config", overrides=list(overrides)))


def test_openai_and_local_cells_carry_the_served_model_id():
    a = _cell("model=openai", "model.model_id=gpt-a", "model.base_url=http://127.0.0.1:9/v1")
    b = _cell("model=openai", "model.model_id=org/model-b", "model.base_url=http://127.0.0.1:9/v1")
    assert a.model == b.model == "openai"  # the grid axis stays the preset
    assert a.model_label == "openai:gpt-a" and "openai:gpt-a" in a.name
    assert b.model_label == "openai:org/model-b" and "/" not in b.dir_name and "org_model-b" in b.dir_name
    assert a.key != b.key
    local = _cell("model=local")
    assert local.model_label == "local:SmolLM2-135M-Instruct"
    gold = _cell("model=gold")
    assert gold.model_label == "gold" and gold.name == "single·gold·none·s0"


# ----------------------------------------------------------------------------- defect 9/10: tools warnings


def _topo(*overrides):
    from hydra import compose, initialize_config_dir

    from apps_bench.config.schema import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        c = compose("config", overrides=["allow_any_cell=true", *overrides])
    return c.topology, c.model


def _rec(calls=3, with_tools=3, by_role=None):
    return problem_record(
        usage={"model_calls": calls, "requests_with_tools": with_tools, "prompt_tokens": 300}, tool_calls_by_role=by_role or {}
    )


def test_a_tool_role_that_never_calls_a_tool_is_warned_about():
    from apps_bench.topologies.tool_use import roles_offered_tools, tool_warnings

    topo, model = _topo("topology=centralized_langgraph", "model=local")
    assert roles_offered_tools(topo) == ["manager", "tester"]
    (warning,) = tool_warnings([_rec(), _rec()], topo, model)
    assert "['manager', 'tester']" in warning and "manager answered alone" in warning
    assert tool_warnings([_rec(by_role={"manager": 2, "tester": 1})], topo, model) == []
    model.tools_supported = False
    assert any("known not to support tools" in w for w in tool_warnings([_rec(by_role={"manager": 2, "tester": 1})], topo, model))
    model.tools_supported = True
    model.local.chat_format = None  # model=local with the GGUF's own template
    assert any("known not to support tools" in w for w in tool_warnings([_rec(by_role={"manager": 2, "tester": 1})], topo, model))


def test_tools_sent_in_the_prompt_text_are_reported():
    from apps_bench.topologies.tool_use import tool_protocol, tool_warnings

    topo, model = _topo("topology=sequential_crewai", "model=local")
    recs = [_rec(with_tools=0, by_role={"tester": 1, "debugger": 1})]
    assert tool_protocol(recs)["requests_with_tools"] == 0
    (note,) = tool_warnings(recs, topo, model)
    assert "prompt text" in note and "crewai" in note and "100.0 prompt tokens per call" in note
    idle, note = tool_warnings([_rec(with_tools=0)], topo, model)  # CrewAI's tools are text: no template drops them
    assert "['tester', 'debugger']" in idle and "never wrote a call in that format" in idle and "chat template" not in idle


# ----------------------------------------------------------------------------- defect 12: the vote's candidates


def test_debate_vote_counts_each_agents_latest_program():
    from apps_bench.topologies.team import Team, final_candidates

    team = Team(ctx=None)  # type: ignore[arg-type]
    first = team.start("debater_0", "debater", 0)
    first.add_reply("```python\nprint(1)\n```")
    second = team.start("debater_0", "debater", 1)
    second.add_reply("I keep my previous answer.")
    silent = team.start("debater_1", "debater", 0)
    silent.add_reply("no idea")
    (a, b) = final_candidates(team, ["debater_0", "debater_1"])
    assert (a.program or "").strip() == "print(1)" and b.program is None


# ----------------------------------------------------------------------------- defect 4: the compile error text


def test_python_exec_shows_the_syntax_error():
    from apps_bench.sandbox import SandboxPool
    from apps_bench.sandbox.tool import PythonExecTool

    with SandboxPool.from_config(judge_config("seed"), workers=1) as pool:
        out = PythonExecTool(pool, 5, 4000)("def f(:\n    pass\n")
    assert out.startswith("exit code: 1") and "SyntaxError: invalid syntax" in out and "line 1" in out
