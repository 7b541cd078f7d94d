"""The gold server over real HTTP on loopback: routes, conversation rules, options, standalone use."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port

from apps_bench.models.gold import GoldServer, load_rows
from apps_bench.models.gold_policy import SELF_CHECK, GoldProblem, ProblemIndex, respond

PY_EXEC = {
    "type": "function",
    "function": {
        "name": "python_exec",
        "description": "Run Python code with optional stdin.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "stdin": {"type": "string"}},
            "required": ["code"],
        },
    },
}
DELEGATE = {
    "type": "function",
    "function": {
        "name": "delegate",
        "description": "Give a worker an instruction.",
        "parameters": {
            "type": "object",
            "properties": {
                "worker": {"type": "string", "enum": ["analyzer", "coder", "tester"]},
                "instruction": {"type": "string"},
            },
            "required": ["worker", "instruction"],
        },
    },
}


@pytest.fixture(scope="module")
def rows(apps_data_dir: Path) -> list[GoldProblem]:
    return load_rows(str(apps_data_dir / "train_mini150.jsonl"), "train")


@pytest.fixture(scope="module")
def server(rows):
    with GoldServer(rows) as srv:
        yield srv


def chat(server: GoldServer, **body) -> dict:
    body.setdefault("model", "gold")
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def fence(text: str) -> str | None:
    m = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    return m.group(1) if m else None


def user(q: str) -> dict:
    return {"role": "user", "content": f"QUESTION:\n{q}\nUse Standard Input format.\nANSWER:\n"}


# ------------------------------------------------------------------ routes


def test_models_route_and_misrouted_calls_are_visible(server):
    r = httpx.get(f"{server.base_url}/models", trust_env=False)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["gold"]
    for path in ("/responses", "/embeddings"):
        r = httpx.post(f"{server.base_url}{path}", json={"model": "gold", "input": "x"}, trust_env=False)
        assert r.status_code == 404
        assert "chat/completions" in r.json()["error"]["message"]


def test_unknown_model_is_404_naming_the_served_id(server):
    r = httpx.post(f"{server.base_url}/chat/completions", json={"model": "gpt-4o", "messages": []}, trust_env=False)
    assert r.status_code == 404
    assert "gpt-4o" in r.json()["error"]["message"] and "gold" in r.json()["error"]["message"]


def test_bad_body_is_400(server):
    r = httpx.post(f"{server.base_url}/chat/completions", content=b"not json", trust_env=False)
    assert r.status_code == 400


# ------------------------------------------------------------------ conversation rules


def test_final_answer_is_the_reference_solution_with_the_self_check_line(server, rows):
    p = rows[0]
    out = chat(server, messages=[{"role": "system", "content": "You solve problems."}, user(p.question)], seed=1)
    content = out["choices"][0]["message"]["content"]
    assert out["model"] == "gold"
    assert SELF_CHECK in content.split("```")[0]  # outside the fence
    assert fence(content).strip() == p.solution.strip()
    assert out["choices"][0]["finish_reason"] == "stop"
    u = out["usage"]
    assert (
        u["prompt_tokens"] > 0 and u["completion_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    )


def test_unknown_fields_and_message_names_are_ignored(server, rows):
    p = rows[1]
    msg = {**user(p.question), "name": "coder_2"}
    out = chat(
        server,
        messages=[msg],
        seed=0,
        frobnicate={"x": 1},
        repetition_penalty=1.05,
        chat_template_kwargs={"enable_thinking": False},
        stream_options=None,
        n=1,
    )
    assert fence(out["choices"][0]["message"]["content"]).strip() == p.solution.strip()


def test_question_found_anywhere_and_whitespace_insensitive(server, rows):
    p = rows[2]
    squashed = " ".join(p.question.split())
    out = chat(server, messages=[{"role": "system", "content": f"Context: {squashed}"}, {"role": "user", "content": "go"}])
    assert fence(out["choices"][0]["message"]["content"]).strip() == p.solution.strip()


def test_unplaced_request_gets_a_plain_reply_without_program(server):
    out = chat(server, messages=[{"role": "user", "content": "What is the capital of France?"}])
    content = out["choices"][0]["message"]["content"]
    assert SELF_CHECK in content and "cannot place" in content and "```" not in content


def test_python_exec_first_then_final(server, rows):
    p = next(r for r in rows if r.stdin and r.solution)
    msgs = [user(p.question)]
    first = chat(server, messages=msgs, tools=[PY_EXEC], seed=3)
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "python_exec"
    assert args == {"code": p.solution, "stdin": p.stdin}
    msgs += [choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "exit code 0"}]
    second = chat(server, messages=msgs, tools=[PY_EXEC], seed=3)
    assert "tool_calls" not in second["choices"][0]["message"]
    assert fence(second["choices"][0]["message"]["content"]).strip() == p.solution.strip()


def test_delegate_once_per_worker_in_enum_order_then_final(server, rows):
    p = rows[5]
    msgs = [{"role": "system", "content": "You are the manager."}, user(p.question)]
    workers = []
    for _ in range(5):
        out = chat(server, messages=msgs, tools=[DELEGATE])
        message = out["choices"][0]["message"]
        if not message.get("tool_calls"):
            break
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "delegate"
        args = json.loads(call["function"]["arguments"])
        assert args["instruction"]
        workers.append(args["worker"])
        msgs += [message, {"role": "tool", "tool_call_id": call["id"], "content": f"{args['worker']} says hi"}]
    assert workers == ["analyzer", "coder", "tester"]
    assert fence(message["content"]).strip() == p.solution.strip()


def test_python_exec_comes_before_delegations_when_both_are_offered(server, rows):
    p = rows[6]
    out = chat(server, messages=[user(p.question)], tools=[DELEGATE, PY_EXEC])
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "python_exec"


def test_autogen_selector_prompt_gets_first_listed_name(server, rows):
    prompt = (
        "You are in a role play game. The following roles are available:\ncoder: writes code\ntester: tests\n"
        "Read the following conversation. Then select the next role from ['coder', 'tester'] to play. Only return the role.\n\n"
        f"user: {rows[0].question}\n\nRead the above conversation. Then select the next role from ['coder', 'tester'] to play. Only return the role."
    )
    out = chat(server, messages=[{"role": "system", "content": prompt}])
    assert out["choices"][0]["message"]["content"] == "coder"
    out = chat(server, messages=[{"role": "user", "content": "Please select the next speaker from: tester, coder."}])
    assert out["choices"][0]["message"]["content"] == "tester"


def test_crewai_react_text_form(server, rows):
    p = next(r for r in rows if r.stdin and r.solution)
    system = (
        "You are coder. b\nYour personal goal is: solve\nYou ONLY have access to the following tools, and should NEVER make up "
        "tools that are not listed here:\n\nTool Name: python_exec\n\nIMPORTANT: Use the following format in your response:\n\n```\n"
        "Thought: you should always think about what to do\nAction: the action to take, only one name of [python_exec], just the "
        "name, exactly as it's written.\nAction Input: the input to the action, just a simple JSON object\n"
        "Observation: the result of the action\n```\n\nOnce all necessary information is gathered, return the following format:\n\n"
        "```\nThought: I now know the final answer\nFinal Answer: the final answer to the original input question\n```"
    )
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"\nCurrent Task: {p.question}\n\nThought:"}]
    first = chat(server, messages=msgs)["choices"][0]["message"]["content"]
    assert "\nAction: python_exec\nAction Input: " in first
    action_input = json.loads(first.split("Action Input: ", 1)[1])
    assert action_input["code"] == p.solution
    msgs.append({"role": "assistant", "content": first + "\nObservation: stdout: 42"})
    second = chat(server, messages=msgs)["choices"][0]["message"]["content"]
    assert second.startswith("Thought: ") and "\nFinal Answer: " in second
    assert fence(second).strip() == p.solution.strip()


def test_optimizer_tag_mode_is_deterministic_and_seeded(server):
    ask = (
        "Improve the prompt of the coder role.\n<current_prompt>You are a careful coder.</current_prompt>\n"
        "Answer with <analysis>...</analysis>, <modification>...</modification> and <prompt>...</prompt>."
    )
    outs = {
        s: chat(server, messages=[{"role": "user", "content": ask}], seed=s)["choices"][0]["message"]["content"] for s in range(6)
    }
    for text in outs.values():
        assert "<analysis>" in text and "</modification>" in text
        new = re.search(r"<prompt>(.*?)</prompt>", text, re.DOTALL).group(1)
        assert new.startswith("You are a careful coder.") and len(new) > len("You are a careful coder.") + 10
    assert chat(server, messages=[{"role": "user", "content": ask}], seed=3)["choices"][0]["message"]["content"] == outs[3]
    assert len(set(outs.values())) > 1  # seeds vary the added sentence


# ------------------------------------------------------------------ streaming


def test_streaming_sends_chunks_tool_calls_and_a_final_usage_chunk(server, rows):
    p = rows[7]
    body = {"model": "gold", "messages": [user(p.question)], "tools": [PY_EXEC], "stream": True}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, trust_env=False) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0  # never asked for, still sent
    args = "".join(
        tc["function"].get("arguments", "") for e in events for c in e["choices"] for tc in c["delta"].get("tool_calls", [])
    )
    assert json.loads(args)["code"] == p.solution
    assert any(c.get("finish_reason") == "tool_calls" for e in events for c in e["choices"])


# ------------------------------------------------------------------ options


def test_wrong_fraction_is_seeded_per_problem_and_request_seed(rows):
    index = ProblemIndex(rows)
    p = rows[0]

    def kind(seed: int) -> str:
        return respond({"messages": [user(p.question)], "seed": seed}, index, wrong_fraction=0.3).kind

    kinds = [kind(s) for s in range(200)]
    assert kinds == [kind(s) for s in range(200)]  # same problem + seed -> same choice
    wrong = kinds.count("wrong")
    assert 30 <= wrong <= 90  # about 30 % of 200
    reply = respond({"messages": [user(p.question)], "seed": kinds.index("wrong")}, index, wrong_fraction=0.3)
    assert fence(reply.content).strip() != p.solution.strip() and SELF_CHECK in reply.content
    # the wrong program is the same for every seed, so wrong agents agree (vote tests rely on it)
    wrong_seeds = [s for s, k in enumerate(kinds) if k == "wrong"][:2]
    a, b = (fence(respond({"messages": [user(p.question)], "seed": s}, index, wrong_fraction=0.3).content) for s in wrong_seeds)
    assert a == b
    assert all(k == "final" for k in (respond({"messages": [user(p.question)], "seed": s}, index).kind for s in range(20)))


def test_wrong_answer_reaches_python_exec_too(rows):
    index = ProblemIndex(rows)
    p = next(r for r in rows if r.stdin and r.solution)
    reply = respond({"messages": [user(p.question)], "seed": 1, "tools": [PY_EXEC]}, index, wrong_fraction=1.0)
    assert reply.kind == "python_exec" and reply.tool_calls[0].arguments["code"] == p.wrong_program()


def test_call_based_wrong_program_keeps_the_entry_point(rows):
    p = next(r for r in rows if r.fn_name)
    wrong = p.wrong_program()
    assert p.fn_name in wrong
    compile(wrong, "wrong", "exec")


def test_concurrent_requests_are_served_in_parallel(rows):
    async def burst(srv: GoldServer) -> list[int]:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            body = {"model": "gold", "messages": [user(rows[0].question)]}
            rs = await asyncio.gather(*(client.post(f"{srv.base_url}/chat/completions", json=body) for _ in range(16)))
            return [r.status_code for r in rs]

    with GoldServer(rows, latency_ms=300) as srv:
        assert asyncio.run(burst(srv)) == [200] * 16
        assert srv.stats.max_in_flight >= 8


def test_fault_injection_is_seeded_by_body_and_arrival(rows):
    body = json.dumps({"model": "gold", "messages": [user(rows[0].question)]}).encode()
    a = GoldServer(rows, fault_fraction=0.5)
    b = GoldServer(rows, fault_fraction=0.5)
    seq_a = [a.fault_for(body) for _ in range(40)]
    assert seq_a == [b.fault_for(body) for _ in range(40)]
    assert 5 <= sum(f is not None for f in seq_a) <= 35
    assert {f for f in seq_a if f} <= {"http_500", "http_503", "http_429", "timeout", "malformed"}
    assert all(GoldServer(rows).fault_for(body) is None for _ in range(10))
    with pytest.raises(ValueError, match="wrong_fraction"):
        GoldServer(rows, wrong_fraction=1.5)


def test_standalone_cli_serves_rows(apps_data_dir, rows):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apps_bench.models.gold",
            "--rows",
            str(apps_data_dir / "train_mini150.jsonl"),
            "--split",
            "train",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        banner = proc.stdout.readline()
        assert "harness self-check" in banner and f"127.0.0.1:{port}/v1" in banner
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(50):
            try:
                r = httpx.post(url, json={"model": "gold", "messages": [user(rows[3].question)]}, trust_env=False)
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert fence(r.json()["choices"][0]["message"]["content"]).strip() == rows[3].solution.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tool_choice_none_and_named_are_respected(server, rows):
    p = rows[8]
    out = chat(server, messages=[user(p.question)], tools=[PY_EXEC, DELEGATE], tool_choice="none")
    assert "tool_calls" not in out["choices"][0]["message"]  # e.g. AutoGen's reflection call
    assert fence(out["choices"][0]["message"]["content"]).strip() == p.solution.strip()
    named = {"type": "function", "function": {"name": "delegate"}}
    out = chat(server, messages=[user(p.question)], tools=[PY_EXEC, DELEGATE], tool_choice=named)
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "delegate"


def test_selector_follows_the_worker_a_manager_just_addressed(server, rows):
    history = f"user: {rows[0].question}\nmanager: gold: Delegating to tester.\n"
    prompt = (
        "You are in a role play game. The following roles are available:\ncoder: writes code\ntester: tests\n"
        f"Read the following conversation. Then select the next role from ['coder', 'tester'] to play. Only return the role.\n\n"
        f"{history}\nRead the above conversation. Then select the next role from ['coder', 'tester'] to play. Only return the role."
    )
    out = chat(server, messages=[{"role": "system", "content": prompt}])
    assert out["choices"][0]["message"]["content"] == "tester"
